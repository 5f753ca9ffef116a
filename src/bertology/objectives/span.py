"""SpanBERT's span boundary objective (SBO; Joshi et al. 2020).

Each token x_i of a masked span (s, e) is predicted from the encoder's outputs at the two tokens just outside
the span and from an embedding of its offset in the span:

    h   = LayerNorm(GELU(W_1 [x_{s-1}; x_{e+1}; p_{i-s}] + b_1))
    y_i = LayerNorm(GELU(W_2 h + b_2))
    P(x_i) = softmax(E y_i + b)          (E: the word embeddings, tied as in the MLM head)

and L = sum over span tokens of -log P(x_i); SpanBERT trains MLM + SBO (``objectives: {mlm: {}, span_boundary:
{}}``) on span-masked single sequences (``data.masking.spans``, ``bertology.data.span_masking``). As in the
SpanBERT code, only the first ``max_positions`` tokens of a span have an offset embedding and an SBO target; the
rest are predicted by MLM alone. The activation is the model's ``hidden_act``.

The head is the registered kind ``span_boundary`` (``bertology.model.heads.SpanBoundaryHead``), owned by this
objective rather than the model (transformers has no SBO head): it trains with the model, is saved in every
training checkpoint with the trainer state (``objective_modules``, so resuming is exact), and at the end of a run
beside the final model (``<output_dir>/model/span_boundary.safetensors``, ``save_with_model``), which a run with
``model.init_from`` that directory reads back (``load_with_model``). The model itself keeps transformers' layout
(``BertForMaskedLM`` for BERT).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor, nn

from bertology.errors import CheckpointError, ConfigError, DataError
from bertology.model.config import TransformerConfig
from bertology.model.blocks import init_parameters
from bertology.model.encoder import EncoderModel
from bertology.model.heads import HeadInputs, HeadSpec, build_head
from bertology.objectives.base import (
    FINAL_MODEL_DIR,
    Objective,
    ObjectiveOutput,
    Passes,
    check_objective,
    classification_output,
    classification_summary,
)
from bertology.objectives.mlm import mlm_loss

HEAD_FILE = "span_boundary.safetensors"


class SpanMaskedBatch(Protocol):
    """What SBO reads of a batch (``bertology.data.span_masking.SpanBatch``)."""

    input_ids: Tensor
    masked_positions: Tensor  # [N, 2]
    mlm_labels: Tensor  # [N]
    span_left: Tensor | None  # [N] column of the token before the span
    span_right: Tensor | None  # [N] column of the token after the span
    span_offset: Tensor | None  # [N] offset of the token in its span


def span_boundary_head(config: TransformerConfig, max_positions: int, name: str = "sbo",
                       generator: torch.Generator | None = None) -> nn.Module:
    """The registered ``span_boundary`` head (``bertology.model.heads.SpanBoundaryHead``) for ``config``'s sizes,
    initialised as BERT's weights are (``init_parameters``) with a zero vocabulary bias."""
    head = build_head(config, HeadSpec(name, "span_boundary", activation=config.hidden_act,
                                       max_positions=max_positions))
    init_parameters(head, config.initializer_range, generator)
    with torch.no_grad():
        head.bias.zero_()
    return head


@dataclass(eq=False)
class SpanBoundary(nn.Module, Objective):
    """SBO (see the module docstring). Stats: ``sbo_units`` (span tokens predicted), ``sbo_loss_sum``,
    ``sbo_correct``. ``attach(model)`` makes the head for the model's sizes before training."""

    weight: float = 1.0
    max_positions: int = 32  # offsets in a span with an embedding (SBO targets); later tokens are MLM-only
    name: str = "sbo"

    def __post_init__(self) -> None:
        nn.Module.__init__(self)
        check_objective(self)
        if self.max_positions < 1:
            raise ConfigError(f"objectives.{self.name}.max_positions: must be >= 1, got {self.max_positions}")
        self.head: nn.Module | None = None

    def attach(self, model: EncoderModel, generator: torch.Generator | None = None) -> None:
        """Make the head for ``model``'s sizes, initialised as the model is (the pretrain recipe calls this once
        the model exists, before training)."""
        self.head = span_boundary_head(model.config, self.max_positions, self.name, generator)

    def save_with_model(self, output_dir: str | Path, tokenizer: object = None) -> Path:
        """At the end of a run: the head beside the final model (``<output_dir>/model/span_boundary.safetensors``)."""
        return self.save(Path(output_dir) / FINAL_MODEL_DIR)

    def load_with_model(self, model_dir: str | Path) -> bool:
        """Continuing from a model directory (``model.init_from``): its saved head, if it has one (else the fresh
        head stays). True when a head was read."""
        if not (Path(model_dir) / HEAD_FILE).is_file():
            return False
        self.load(model_dir)
        return True

    def _head(self) -> nn.Module:
        if self.head is None:
            raise ConfigError(f"objective {self.name!r}: its head is not built; call attach(model) before "
                              "training (the pretrain recipe does)")
        return self.head

    def heads(self) -> Sequence[HeadSpec]:
        return ()  # the head is this module's own, not the model's

    def _spans(self, batch: SpanMaskedBatch) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(rows, left, right, offset) of the span tokens SBO predicts, and which masked tokens they are."""
        if getattr(batch, "span_left", None) is None or getattr(batch, "span_offset", None) is None:
            raise DataError(f"objective {self.name!r} needs span-masked batches, but these have no span boundaries "
                            "(set data.masking.spans)")
        keep = batch.span_offset < self.max_positions
        rows = batch.masked_positions[:, 0]
        return keep, rows[keep], batch.span_left[keep], batch.span_right[keep]  # type: ignore[index]

    def reads(self, batch: SpanMaskedBatch) -> Tensor:
        _, rows, left, right = self._spans(batch)
        return torch.cat([torch.stack([rows, left], 1), torch.stack([rows, right], 1)])

    def units(self, batch: SpanMaskedBatch) -> Tensor:
        keep = self._spans(batch)[0]
        return keep.sum().to(torch.int64)

    def forward(self, passes: Passes, batch: SpanMaskedBatch) -> ObjectiveOutput:
        head = self._head()
        keep, rows, left, right = self._spans(batch)
        hidden = passes.shared.last_hidden_state
        offset = batch.span_offset[keep]  # type: ignore[index]
        inputs = HeadInputs(hidden=hidden, attention_mask=batch.attention_mask,
                            word_embeddings=passes.model.word_embeddings.weight,
                            span_boundaries=torch.stack([rows, left, right, offset], 1))
        logits = head(inputs)
        labels = batch.mlm_labels[keep]
        return classification_output(self.name, logits, labels, mlm_loss(logits, labels, reduction="sum"))

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        return classification_summary(self.name, totals)

    def save(self, directory: str | Path) -> Path:
        """Write the head's weights to ``directory/span_boundary.safetensors`` (atomically)."""
        from safetensors.torch import save

        from bertology.io import atomic_write

        path = Path(directory) / HEAD_FILE
        state = {k: v.detach().cpu().contiguous().clone() for k, v in self._head().state_dict().items()}
        with atomic_write(path, "wb") as handle:
            handle.write(save(state, metadata={"format": "pt", "max_positions": str(self.max_positions)}))
        return path

    def load(self, directory: str | Path) -> None:
        """Read the head's weights from ``directory/span_boundary.safetensors`` (sizes must match)."""
        from bertology.model.checkpoint import read_safetensors

        path = Path(directory) / HEAD_FILE
        if not path.is_file():
            raise CheckpointError(f"{path}: no span boundary head saved there")
        weights = read_safetensors(path)
        head = self._head()
        expected = head.state_dict()
        problems = [f"missing {k}" for k in expected if k not in weights]
        problems += [f"unexpected {k}" for k in weights if k not in expected]
        problems += [f"{k}: saved {tuple(weights[k].shape)}, head {tuple(v.shape)}" for k, v in expected.items()
                     if k in weights and weights[k].shape != v.shape]
        if problems:
            raise CheckpointError(f"{path}: does not fit this span boundary head (objectives.{self.name}."
                                  f"max_positions and the model's sizes must match): {'; '.join(problems)}")
        head.load_state_dict(weights)

    def extra_repr(self) -> str:
        return f"weight={self.weight}, max_positions={self.max_positions}"

