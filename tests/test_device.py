"""bertology.device: --device / --dtype resolution (CUDA's presence monkeypatched), the shared CLI options, the Ray
actors' GPUs, and that the APIs move the model and its inputs where they are told."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch
from torch import nn

from bertology import device as D
from bertology.errors import ConfigError
from bertology.model import EncoderModel, Pretrained, preset


@pytest.fixture
def gpus(monkeypatch):
    """Pretend this machine has `n` GPUs (0: none): torch.cuda.is_available and device_count follow."""

    def have(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)

    return have


# ------------------------------------------------------------------------------------------------------- device

def test_auto_is_the_first_gpu_when_there_is_one_else_the_cpu(gpus):
    gpus(0)
    assert D.resolve_device("auto") == torch.device("cpu")
    assert D.resolve_device(None) == torch.device("cpu")
    gpus(2)
    assert D.resolve_device("auto") == torch.device("cuda:0")
    assert D.resolve_device("auto", local_rank=1) == torch.device("cuda:1")  # torchrun's local rank


def test_explicit_devices(gpus):
    gpus(2)
    assert D.resolve_device("cpu") == torch.device("cpu")
    assert D.resolve_device("cuda") == torch.device("cuda:0")
    assert D.resolve_device("cuda", local_rank=1) == torch.device("cuda:1")
    assert D.resolve_device("cuda:1") == torch.device("cuda:1")
    assert D.resolve_device(" cuda:1 ") == torch.device("cuda:1")
    assert D.resolve_device(torch.device("cuda", 1)) == torch.device("cuda:1")


@pytest.mark.parametrize("value, message", [
    ("gpu", "--device: 'gpu' is not a device; expected auto, cpu, cuda or cuda:N"),
    ("cuda:x", "--device: 'cuda:x' is not a device"),
    ("cuda:-1", "--device: 'cuda:-1' is not a device"),
    ("", "--device: must not be empty"),
    ("mps", "--device: 'mps' is not a device bertology runs on"),
    ("meta", "--device: 'meta' is not a device bertology runs on"),
    (3, "--device: expected a device name"),
])
def test_bad_device_names_are_errors_naming_the_option(value, message, gpus):
    gpus(1)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        D.resolve_device(value, option="--device")


def test_cuda_without_a_gpu_and_past_the_gpu_count_are_errors(gpus):
    gpus(0)
    for value in ("cuda", "cuda:0"):
        with pytest.raises(ConfigError, match=rf"--device: '{value}' asked for, but CUDA is not available"):
            D.resolve_device(value, option="--device")
    gpus(2)
    with pytest.raises(ConfigError, match=r"--device: 'cuda:2' asked for, but this machine has 2 GPUs "
                                          r"\(cuda:0 to cuda:1\)"):
        D.resolve_device("cuda:2", option="--device")


def test_the_trainer_resolves_speed_device_with_the_same_function(gpus):
    from bertology.training.config import SpeedConfig
    from bertology.training.distributed import init_distributed

    gpus(0)
    assert init_distributed(SpeedConfig(device="auto")).device == torch.device("cpu")
    assert init_distributed(SpeedConfig(device="cpu")).device == torch.device("cpu")
    with pytest.raises(ConfigError, match="speed.device: 'cuda' asked for, but CUDA is not available"):
        init_distributed(SpeedConfig(device="cuda"))
    with pytest.raises(ConfigError, match="speed.device: 'tpu' is not a device"):
        init_distributed(SpeedConfig(device="tpu"))


# -------------------------------------------------------------------------------------------------------- dtype

def test_dtypes_and_their_devices(gpus):
    cpu, gpu = torch.device("cpu"), torch.device("cuda:0")
    assert D.resolve_dtype("float32", cpu) == "float32" and D.resolve_dtype("float32", gpu) == "float32"
    assert D.resolve_dtype("bfloat16", gpu) == "bfloat16" and D.resolve_dtype("float16", gpu) == "float16"
    assert D.resolve_dtype("int8", cpu, int8=True) == "int8"
    for half in ("float16", "bfloat16"):
        with pytest.raises(ConfigError, match=f"--dtype {half}: half precision runs on a GPU only, and this runs "
                                              "on cpu"):
            D.resolve_dtype(half, cpu, option="--dtype")
    with pytest.raises(ConfigError, match="--dtype int8: the int8 path runs on the CPU only, and this runs on cuda:0"):
        D.resolve_dtype("int8", gpu, option="--dtype", int8=True)
    with pytest.raises(ConfigError, match="dtype: unknown 'int8'; expected one of float32, float16, bfloat16$"):
        D.resolve_dtype("int8", cpu)  # a command without the int8 path
    with pytest.raises(ConfigError, match="dtype: unknown 'fp64'; expected one of float32, float16, bfloat16, int8"):
        D.resolve_dtype("fp64", cpu, int8=True)


def test_placement_resolves_both_and_int8_makes_auto_the_cpu(gpus):
    gpus(1)
    assert D.placement("auto", "bfloat16") == D.Placement(torch.device("cuda:0"), "bfloat16")
    assert D.placement("auto", "int8", int8=True) == D.Placement(torch.device("cpu"), "int8")
    assert D.placement(None, "float32") == D.Placement(torch.device("cpu"), "float32")
    assert D.placement(None, current=torch.device("cuda:0")).device == torch.device("cuda:0")
    with pytest.raises(ConfigError, match="dtype int8: the int8 path runs on the CPU only"):
        D.placement("cuda", "int8", int8=True)
    gpus(0)
    with pytest.raises(ConfigError, match="dtype bfloat16: half precision runs on a GPU only"):
        D.placement("auto", "bfloat16")


def test_autocast_only_for_half_types():
    assert D.Placement(torch.device("cpu")).autocast_dtype is None
    assert D.Placement(torch.device("cpu"), "int8").float_dtype == "float32"
    assert D.Placement(torch.device("cuda:0"), "bfloat16").autocast_dtype is torch.bfloat16
    assert D.Placement(torch.device("cuda:0"), "float16").float_dtype == "float16"
    with D.Placement(torch.device("cpu")).autocast():
        assert not torch.is_autocast_enabled("cpu")
    # The half path's context is torch.autocast on the placement's device type, in its type.
    context = D.Placement(torch.device("cpu"), "bfloat16").autocast()  # (constructed directly: resolve forbids it)
    assert isinstance(context, torch.autocast) and context.fast_dtype is torch.bfloat16
    assert context.device == "cpu"


def test_to_cpu_gives_float32_on_the_cpu():
    half = torch.ones(2, dtype=torch.bfloat16)
    assert D.to_cpu(half).dtype is torch.float32
    whole = torch.ones(2, dtype=torch.long)
    assert D.to_cpu(whole) is whole
    full = torch.ones(2)
    assert D.to_cpu(full) is full  # float32 on the CPU: the very tensor, so CPU results stay bit-identical


# ---------------------------------------------------------------------------------------------------- the CLI

def parser(int8: bool = False) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="x")
    D.add_device_arguments(p, int8=int8, int8_help="quantized")
    return p


def test_cli_options_and_their_defaults(gpus):
    gpus(0)
    args = parser().parse_args([])
    assert (args.device, args.dtype) == ("auto", "float32")
    assert D.placement_from_args(args) == D.Placement(torch.device("cpu"), "float32")
    assert D.placement_from_args(parser(True).parse_args(["--dtype", "int8"]), int8=True).dtype == "int8"
    with pytest.raises(ConfigError, match="^--device: 'cuda' asked for, but CUDA is not available"):
        D.placement_from_args(parser().parse_args(["--device", "cuda"]))
    with pytest.raises(ConfigError, match="^--dtype float16: half precision runs on a GPU only"):
        D.placement_from_args(parser().parse_args(["--dtype", "float16"]))
    gpus(1)
    assert D.placement_from_args(parser().parse_args(["--dtype", "float16"])) == \
        D.Placement(torch.device("cuda:0"), "float16")
    with pytest.raises(SystemExit):
        parser().parse_args(["--dtype", "int8"])  # no int8 path: not a choice
    assert "int8: quantized" in parser(True).format_help()


# ----------------------------------------------------------------------------------------------------- Ray

def test_ray_actor_gpus_and_device(gpus):
    from bertology.embeddings.ray_engine import actor_device

    gpus(0)
    assert actor_device(None, None, "float32") == (0.0, "cpu")  # no GPU here: none asked for
    assert actor_device("auto", 0.5, "bfloat16") == (0.5, "cuda")  # a cluster's GPUs, shared by two actors
    assert actor_device("cuda", 2, "float32") == (2.0, "cuda")
    gpus(1)
    assert actor_device("auto", None, "float32") == (1.0, "cuda")
    assert actor_device("cpu", None, "float32") == (0.0, "cpu")
    assert actor_device("auto", None, "int8") == (0.0, "cpu")
    for device, gpus_per_worker, dtype, message in [
        ("auto", -1, "float32", "--gpus-per-worker must be a number >= 0"),
        ("auto", 1.5, "float32", "--gpus-per-worker must be"),
        ("auto", float("nan"), "float32", "--gpus-per-worker must be"),
        ("auto", True, "float32", "--gpus-per-worker must be"),
        ("cpu", 1, "float32", "--gpus-per-worker 1: the actors run on the CPU"),
        ("cuda", 0, "float32", "--device cuda: the Ray actors get no GPU"),
        ("auto", 0, "float16", "--dtype float16: half precision runs on a GPU only"),
        ("auto", 1, "int8", "--dtype int8: the int8 path runs on the CPU only"),
        ("gpu", None, "float32", "--device: 'gpu' is not a device"),
    ]:
        with pytest.raises(ConfigError, match=message):
            actor_device(device, gpus_per_worker, dtype)


# ------------------------------------------------------------------------------------------ moving the model

def tiny_model() -> EncoderModel:
    config = preset("tiny", vocab_size=40, num_layers=1, hidden_size=16, num_heads=2, intermediate_size=32,
                    max_position_embeddings=16)
    model = EncoderModel(config)
    model.init_weights(torch.Generator().manual_seed(0))
    return model


def test_place_moves_the_model_in_place_and_none_keeps_its_device(monkeypatch):
    moved = []
    original = nn.Module.to

    def spy(self, *args, **kwargs):
        moved.append((type(self).__name__, args))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "to", spy)
    model = tiny_model()
    pretrained = Pretrained(model, None)
    where = D.place(pretrained, "cpu")
    assert where == D.Placement(torch.device("cpu"), "float32")
    assert moved == []  # already there: nothing to do
    assert D.place(model, None).device == torch.device("cpu")
    assert D.model_device(pretrained) == torch.device("cpu") and D.module_of(pretrained) is model
    # Elsewhere (the meta device stands in for a GPU here: a Placement made directly, not resolved).
    elsewhere = D.Placement(torch.device("meta"))
    assert elsewhere.move(pretrained) is pretrained
    assert moved == [("EncoderModel", (torch.device("meta"),))]  # the Pretrained's model, in place
    assert D.model_device(pretrained) == torch.device("meta")
    elsewhere.move(pretrained)
    assert len(moved) == 1  # there now: not moved again
    assert [t.device for t in elsewhere.inputs(torch.ones(2), torch.zeros(1))] == [torch.device("meta")] * 2


def test_a_backbone_that_is_not_a_module_cannot_be_moved(gpus):
    gpus(1)

    class Plain:
        pass

    assert D.place(Plain(), None).device == torch.device("cpu")
    with pytest.raises(ConfigError, match="device: Plain is not a torch module, so it cannot be moved to cuda:0"):
        D.place(Plain(), "cuda")


def test_inputs_reach_the_model_on_its_device():
    """embed, fill_mask and the head-importance losses hand the model tensors on its device (recorded by a hook)."""
    from bertology.analysis.importance import MaskedLMData, head_importance
    from bertology.embeddings import embed
    from bertology.model.encoder import HeadSpec
    from bertology.objectives.fill_mask import fill_mask
    from bertology.tokenization import train_tokenizer

    words = "the cat sat on a mat and a dog ran in the park".split()
    tokenizer = train_tokenizer(iter([" ".join(words)] * 4), "wordpiece", 60, show_progress=False, min_frequency=1)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=1, hidden_size=16, num_heads=2,
                    intermediate_size=32, max_position_embeddings=32)
    model = EncoderModel(config, [HeadSpec("mlm", "masked_lm")])
    model.init_weights(torch.Generator().manual_seed(0))
    seen: list[torch.device] = []

    def record(module, args, kwargs):
        seen.extend(t.device for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor))

    model.encoder.register_forward_pre_hook(record, with_kwargs=True)
    pretrained = Pretrained(model, tokenizer)
    embed(pretrained, ["the cat sat"], device="cpu")
    fill_mask(model, tokenizer, f"the cat {tokenizer.mask_token} on a mat", device="cpu")
    data = MaskedLMData(pretrained, [" ".join(words[i:i + 5]) for i in range(8)], importance_examples=4)
    head_importance(model, data, device="cpu")
    assert seen and set(seen) == {torch.device("cpu")}


# ---------------------------------------------------------------------------------------------------- on a GPU

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device on this machine: GPU results are compared where there is one")


@needs_cuda
def test_gpu_results_equal_the_cpus_within_the_dtypes_tolerance(minilm_path):
    from bertology.embeddings import embed
    from bertology.model import load

    texts = ["The bank raised its rates.", "An unaffable clerk stamped the form.", "word " * 300]
    cpu = embed(load(minilm_path), texts, levels=("sentence", "token"))
    for dtype, atol, min_cosine in (("float32", 1e-4, 0.99999), ("bfloat16", None, 0.98),
                                    ("float16", None, 0.99)):
        gpu = embed(load(minilm_path), texts, levels=("sentence", "token"), device="cuda", dtype=dtype)
        assert gpu.sentences.dtype == np.float32 and gpu.tokens.vectors.dtype == np.float32
        for a, b in ((cpu.sentences, gpu.sentences), (cpu.tokens.vectors, gpu.tokens.vectors)):
            if atol is not None:
                np.testing.assert_allclose(b, a, atol=atol)
            cosine = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
            assert cosine.min() > min_cosine, (dtype, cosine.min())



@needs_cuda
def test_gpu_fill_mask_and_head_importances_equal_the_cpus():
    """The direct model calls (fill-mask, head importances with their gradients) on a GPU against the CPU: within
    float32 rounding in float32, within bfloat16's in bfloat16; the model is moved in place, results come back on
    the CPU."""
    from bertology.analysis.importance import MaskedLMData, head_importance
    from bertology.model.encoder import HeadSpec
    from bertology.objectives.fill_mask import fill_mask
    from bertology.tokenization import train_tokenizer

    words = "the cat sat on a mat and a dog ran in the park while birds sang".split()
    tokenizer = train_tokenizer(iter([" ".join(words)] * 4), "wordpiece", 60, show_progress=False, min_frequency=1)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=2, hidden_size=32, num_heads=2,
                    intermediate_size=64, max_position_embeddings=32)

    def model() -> EncoderModel:
        mlm = EncoderModel(config, [HeadSpec("mlm", "masked_lm")])
        mlm.init_weights(torch.Generator().manual_seed(0))
        return mlm.eval()

    texts = [" ".join(words[i:i + 6]) for i in range(10)] * 2
    text = f"the cat {tokenizer.mask_token} on a mat"
    cpu = model()
    cpu_fill = fill_mask(cpu, tokenizer, text, top_k=5)
    data = MaskedLMData(Pretrained(cpu, tokenizer), texts, importance_examples=8)
    cpu_importance = head_importance(cpu, data)
    for dtype, atol in (("float32", 1e-5), ("bfloat16", 2e-2)):
        gpu = model()
        gpu_fill = fill_mask(gpu, tokenizer, text, top_k=5, device="cuda", dtype=dtype)
        assert next(gpu.parameters()).device.type == "cuda"
        probabilities = {p.token_id: p.probability for p in gpu_fill[0]}
        if dtype == "float32":  # nearly uniform random logits: bfloat16 may reorder the top five
            assert probabilities.keys() == {p.token_id for p in cpu_fill[0]}
        for p in cpu_fill[0]:
            if p.token_id in probabilities:
                assert abs(probabilities[p.token_id] - p.probability) < atol, (dtype, p)
        gpu_importance = head_importance(gpu, data, device="cuda", dtype=dtype)
        assert gpu_importance.device.type == "cpu"
        torch.testing.assert_close(gpu_importance, cpu_importance, atol=10 * atol, rtol=0.1)
