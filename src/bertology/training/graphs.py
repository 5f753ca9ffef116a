"""CUDA graphs for the training step: the forward and backward of a micro-batch replayed as one launch.

On a GPU a variable-length BERT step is bound by the host launching about a thousand small kernels, not by the
device (benchmarks/RESULTS.md, "GPU"). A CUDA graph records those launches once and replays them with one call.
A graph fixes every tensor's shape, so batches are first given static shapes (`static_batch`):

* rows are padded to a multiple of `COLUMNS` columns, which only costs index memory on the packed path;
* the packed token count is rounded up to a multiple of `bucket` by filler rows: each a sequence of its own (real to
  the attention mask, so the packing sees them) that attends only to itself and is read by no objective;
* the prediction targets (MLM's masked positions, NSP's labels of the filler rows) are padded with the ignored
  label -100, which the objectives that declare ``static_shapes = True`` skip in their losses and unit counts.

Every distinct static shape is captured once (`CapturedSteps`): its first micro-batch runs eagerly and is then
recorded, later micro-batches of that shape copy their tensors into the recorded inputs and replay. Gradients
accumulate in place into the parameters' ``.grad``, which the trainer zeroes instead of freeing between steps;
clipping and the fused AdamW run outside the graph, as in the eager step.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from bertology.errors import ConfigError
from bertology.model.packing import Layout
from bertology.objectives.base import IGNORE
COLUMNS = 64  # rows are padded to a multiple of this many columns
MAX_GRAPHS = 64  # distinct static shapes captured; later new shapes run eagerly


def static_batch(batch: Any, bucket: int, max_width: int) -> Any:
    """`batch` (a `PretrainingBatch`, on the host) with static shapes for a graph: see the module docstring.

    Rows: B + R filler rows, R = ceil((bucket - 1) / (width - 1)); columns: the width rounded up to `COLUMNS` (at most
    `max_width`, the model's positions); packed tokens: (real tokens + R) rounded up to `bucket`; targets: (masked
    positions + 1) rounded up to bucket / 4. The filler tokens are id 0 at positions 0, 1, ..., split as evenly as
    possible over the filler rows (each at least one token and at most a row, so every filler row is a sequence of
    the packing); their values never reach a loss, so any id in the vocabulary serves."""
    from bertology.data.dataset import PretrainingBatch

    if not isinstance(batch, PretrainingBatch):
        raise ConfigError(f"speed.cuda_graphs: batches of type {type(batch).__name__} cannot be given static shapes "
                          "(masked-LM pretraining batches can); turn speed.cuda_graphs off")
    rows, width = batch.input_ids.shape
    width = max(width, min(max_width, math.ceil(width / COLUMNS) * COLUMNS))
    # R rows of at most `width` tokens hold up to bucket + R - 1 filler tokens when R (width - 1) >= bucket - 1.
    filler_rows = max(1, math.ceil((bucket - 1) / max(width - 1, 1)))
    real = int(batch.attention_mask.sum())
    capacity = math.ceil((real + filler_rows) / bucket) * bucket
    filler = capacity - real  # in [filler_rows, bucket + filler_rows - 1], at most filler_rows x width
    per_row = torch.full((filler_rows,), filler // filler_rows, dtype=torch.long)
    per_row[: filler % filler_rows] += 1

    def grown(t: Tensor, fill: int) -> Tensor:
        out = t.new_full((rows + filler_rows, width), fill)
        out[:rows, : t.shape[1]] = t
        return out

    mask = grown(batch.attention_mask, 0)
    mask[rows:] = (torch.arange(width) < per_row[:, None]).to(mask.dtype)
    target_bucket = max(1, bucket // 4)
    masked = batch.masked_positions.shape[0]
    targets = math.ceil((masked + 1) / target_bucket) * target_bucket
    positions = batch.masked_positions.new_zeros(targets, 2)
    positions[:masked] = batch.masked_positions
    positions[masked:, 0] = rows  # the first filler row's first token: a real token of the packing
    labels = batch.mlm_labels.new_full((targets,), IGNORE)
    labels[:masked] = batch.mlm_labels
    sentence = batch.next_sentence_labels
    if sentence is not None:
        sentence = torch.cat([sentence, sentence.new_full((filler_rows,), IGNORE)])
    return dataclasses.replace(batch, input_ids=grown(batch.input_ids, 0), attention_mask=mask,
                               token_type_ids=grown(batch.token_type_ids, 0), masked_positions=positions,
                               mlm_labels=labels, next_sentence_labels=sentence, instance_ids=None)


def check_static_objectives(objectives: Sequence[Any]) -> None:
    """Every objective must skip padded targets (``static_shapes = True``), else a ConfigError naming it."""
    for objective in objectives:
        if not objective.static_shapes:
            raise ConfigError(f"speed.cuda_graphs: objective {objective.name!r} does not take batches padded to "
                              "static shapes (mlm, nsp and sop do); turn speed.cuda_graphs off")


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: list[Tensor]  # the recorded input tensors, refilled before each replay
    output: Tensor


def graph_inputs(batch: Any) -> list[Tensor]:
    """The tensors a captured step reads: the batch's tensor fields and its layout's index tensors."""
    tensors = [getattr(batch, f.name) for f in dataclasses.fields(batch)]
    layout: Layout | None = getattr(batch, "layout", None)
    if layout is not None:
        tensors += [layout.flat_index, layout.cu_seqlens]
    return [t for t in tensors if isinstance(t, Tensor)]


def shape_key(batch: Any, inputs: list[Tensor]) -> tuple:
    layout: Layout | None = getattr(batch, "layout", None)
    facts = (layout.num_tokens, layout.max_seqlen, layout.full) if layout is not None else ()
    return tuple((tuple(t.shape), t.dtype) for t in inputs) + facts


class CapturedSteps:
    """`step(batch, divisors) -> stats vector` (forward and backward of one micro-batch, gradients accumulated
    into ``.grad``) run as one CUDA graph per static shape of `batch` (see the module docstring)."""

    def __init__(self, step: Callable[[Any, Tensor], Tensor], device: torch.device) -> None:
        self.step = step
        self.device = device
        self.graphs: dict[tuple, _Captured] = {}
        self.stream = torch.cuda.Stream(device)
        self.pool = torch.cuda.graph_pool_handle()
        self._warned = False

    def __call__(self, batch: Any, divisors: Tensor) -> Tensor:
        inputs = graph_inputs(batch) + [divisors]
        key = shape_key(batch, inputs)
        captured = self.graphs.get(key)
        if captured is None:
            return self._first(key, batch, divisors, inputs)
        for recorded, new in zip(captured.inputs, inputs):
            recorded.copy_(new, non_blocking=True)
        captured.graph.replay()
        return captured.output.clone()  # the next replay overwrites the recorded output

    def _first(self, key: tuple, batch: Any, divisors: Tensor, inputs: list[Tensor]) -> Tensor:
        """Run this micro-batch eagerly (its gradients are this step's), then record its shape's graph, which
        runs nothing now. Both on a side stream, where the eager run also sets up what capture must not."""
        if len(self.graphs) >= MAX_GRAPHS:
            if not self._warned:
                warnings.warn(f"speed.cuda_graphs: more than {MAX_GRAPHS} batch shapes; new shapes run without a "
                              "graph (raise speed.graph_bucket to have fewer)", stacklevel=3)
                self._warned = True
            return self.step(batch, divisors)
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            out = self.step(batch, divisors)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
                output = self.step(batch, divisors)
        current.wait_stream(self.stream)
        self.graphs[key] = _Captured(graph, inputs, output)
        return out
