"""Tolerances that follow from the computation, not from one CPU: two float32 results of one computation through
different kernels (another batch shape, a fused or a packed path, another thread count or instruction set) differ by
rounding that depends on the magnitude of the terms summed, and a deep or strongly amplifying network multiplies it.
So a check either runs where it is an identity (float64: rounding ~10^-16 relative, amplified alike, stays far below
any real mistake) or bounds the float32 difference by the float32 error of the reference path against float64."""

from __future__ import annotations

import copy

import torch

EPS32 = torch.finfo(torch.float32).eps


def float64(module: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of `module` (the same code paths: nothing in the library branches on float64)."""
    return copy.deepcopy(module).double()


def max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.detach().double() - b.detach().double()).abs().max().item() if a.numel() else 0.0


def assert_within_scale(actual: torch.Tensor, expected: torch.Tensor, rel: float, what: str = "") -> None:
    """max |actual - expected| <= rel * max |expected|: a sum in another order moves every element by the rounding of
    the largest terms, not by that of the element itself, so the bound is relative to the tensor's scale."""
    scale = expected.detach().double().abs().max().item() if expected.numel() else 0.0
    error = max_error(actual, expected)
    assert error <= rel * scale, f"{what}: max error {error:.3g} > {rel:g} x scale {scale:.3g}"


def assert_as_accurate(got: torch.Tensor, same: torch.Tensor, reference: torch.Tensor, factor: float = 4.0,
                       what: str = "", gain: float = 16.0) -> None:
    """`got` (float32, one kernel path) is as close to the float64 `reference` as `same` (float32, the reference's
    own path) is: within `factor` times the latter's error, floored at `gain` float32 ulps of the reference's scale (a
    path that happens to round well does not make the bound zero; `gain` is how much the computation amplifies one
    rounding, 16 unless its conditioning says more)."""
    scale = reference.detach().double().abs().max().item() if reference.numel() else 0.0
    bound = factor * max(max_error(same, reference), gain * EPS32 * scale)
    error = max_error(got, reference)
    assert error <= bound, f"{what}: max error {error:.3g} against float64 > {bound:.3g} (the reference path's)"
