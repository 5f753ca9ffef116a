"""DistilBERT-style distillation (Sanh et al., 2019): a student with every other layer of a masked-LM teacher,
trained on the teacher's soft predictions, the MLM labels and the teacher's hidden states.

    L = alpha_ce * T^2 * KL(softmax(z_t / T) || softmax(z_s / T))   at the masked positions
      + alpha_mlm * CE(z_s, labels)                                 at the masked positions
      + alpha_cos * (1 - cos(h_s, h_t))                             at every real token (last layer)

DistilBERT's defaults: T = 2, alpha_ce = 5, alpha_mlm = 2, alpha_cos = 1. As in its training code (``distiller.py``
with ``mlm=True``) the KL term is taken only at the masked positions (the positions MLM predicts), averaged over
them ("batchmean" over the selected rows), and the cosine term over the real tokens.

The teacher is any bertology-loadable checkpoint with an ``mlm`` head (``teacher``: its directory). It is loaded
once, frozen (``requires_grad`` off), in eval mode, and run without autograd; it is not a module of the training
objective, so it is neither optimised, nor checkpointed, nor saved with the student, nor wrapped by DDP. With
``init_from_teacher`` (the default) the student is the teacher's architecture with layers 0, 2, 4, ... of it, and
starts from their weights, the embeddings and the MLM head (``initial_model``); else the model is built from the
``model`` section and only needs the teacher's vocabulary (and width, for the cosine term).
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from bertology.errors import CheckpointError, ConfigError, TokenizerError
from bertology.model.encoder import EncoderModel, EncoderOutput, HeadSpec
from bertology.model.protocol import ENCODER, require
from bertology.objectives.base import Objective, ObjectiveOutput, Passes, check_objective, count, ratio
from bertology.objectives.mlm import MaskedLM

if TYPE_CHECKING:
    from bertology.tokenization import Tokenizer


def soft_cross_entropy_kl(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> Tensor:
    """Sum over rows of ``T^2 * KL(softmax(teacher / T) || softmax(student / T))`` in float32 (``[N, V]`` each)."""
    t = temperature
    log_p_student = F.log_softmax(student_logits.float() / t, dim=-1)
    log_p_teacher = F.log_softmax(teacher_logits.float() / t, dim=-1)
    return F.kl_div(log_p_student, log_p_teacher, reduction="sum", log_target=True) * (t * t)


def student_layers(teacher_layers: int) -> list[int]:
    """The teacher layers a DistilBERT student keeps: every other one from the first (0, 2, 4, ...)."""
    return list(range(0, teacher_layers, 2))


def init_student(teacher: EncoderModel, heads: Sequence[HeadSpec], generator: torch.Generator | None = None
                 ) -> EncoderModel:
    """A student with the teacher's architecture and layers 0, 2, 4, ...: embeddings, those layers, the pooler and
    every head of ``heads`` the teacher has (same kind) copied from it; other heads initialised from ``generator``."""
    require(teacher, ENCODER, "distillation (a student made of the teacher's layers)")
    config = teacher.config
    if config.num_layer_groups is not None:
        raise ConfigError("a distillation student takes every other layer; a teacher with shared layers (ALBERT) "
                          "has none to take")
    kept = student_layers(config.num_layers)
    # A head the teacher has keeps the teacher's transform activation, so that its weights mean the same.
    theirs = {spec.name: spec for spec in teacher.head_specs}
    heads = [dataclasses.replace(spec, activation=theirs[spec.name].activation)
             if spec.name in theirs and theirs[spec.name].kind == spec.kind else spec for spec in heads]
    student = EncoderModel(dataclasses.replace(config, num_layers=len(kept)), heads)
    student.init_weights(generator)
    with torch.no_grad():
        student.encoder.embeddings.load_state_dict(teacher.encoder.embeddings.state_dict())
        for mine, theirs in enumerate(kept):
            student.encoder.layers[mine].load_state_dict(teacher.encoder.layers[theirs].state_dict())
        if student.encoder.pooler is not None and teacher.encoder.pooler is not None:
            student.encoder.pooler.load_state_dict(teacher.encoder.pooler.state_dict())
        for name, head in student.heads.items():
            if name in teacher.heads and type(teacher.heads[name]) is type(head):
                head.load_state_dict(teacher.heads[name].state_dict())
    return student


@dataclass
class Distillation(Objective):
    """Distillation from ``teacher`` (see the module docstring). Metrics: ``distill_ce_loss`` (T^2-scaled KL per
    masked token), ``mlm_loss``/``mlm_accuracy``/``perplexity``, ``distill_cos_loss`` (1 - cosine per real token),
    ``distill_agreement`` (share of masked tokens where student and teacher agree on the top token)."""

    teacher: str | None = None
    temperature: float = 2.0
    alpha_ce: float = 5.0
    alpha_mlm: float = 2.0
    alpha_cos: float = 1.0
    init_from_teacher: bool = True
    weight: float = 1.0
    activation: str | None = None  # of the student's MLM transform; None: the model's hidden_act (set by the recipe)
    name: str = "distill"

    def fit_model_config(self, model_config: Any, lm_kind: str | None) -> None:
        if self.activation is None:  # the head's activation follows the model's (as in transformers)
            self.activation = model_config.hidden_act

    def __post_init__(self) -> None:
        check_objective(self)
        where = f"objectives.{self.name}"
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ConfigError(f"{where}.temperature: must be > 0, got {self.temperature}")
        for key in ("alpha_ce", "alpha_mlm", "alpha_cos"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{where}.{key}: must be >= 0, got {getattr(self, key)}")
        self._teacher: EncoderModel | None = None
        self._outputs: weakref.WeakKeyDictionary[Passes, EncoderOutput] = weakref.WeakKeyDictionary()

    # ----------------------------------------------------------------------------------------------- the teacher
    @property
    def where(self) -> str:
        return f"objectives.{self.name}.teacher"

    def load_teacher(self) -> EncoderModel:
        """The teacher model (loaded once): frozen, in eval mode."""
        if self._teacher is None:
            if self.teacher is None:
                raise ConfigError(f"{self.where}: not set; give the directory of a masked-LM model "
                                  f"(--set {self.where}=DIR)")
            from bertology.model.checkpoint import load_model

            try:
                teacher = load_model(self.teacher)
            except CheckpointError as error:
                raise CheckpointError(f"{self.where}: {error}") from None
            if "mlm" not in teacher.heads:
                raise CheckpointError(f"{self.where}: {self.teacher} has no masked-LM head (heads: "
                                      f"{', '.join(teacher.heads) or 'none'}); a teacher must predict tokens")
            teacher.requires_grad_(False)
            self._teacher = teacher.eval()
        return self._teacher

    def use_teacher(self, teacher: EncoderModel) -> None:
        """Distil from an in-memory model instead of loading ``teacher`` (frozen and put in eval mode here)."""
        if "mlm" not in teacher.heads:
            raise CheckpointError(f"{self.where}: the teacher has no masked-LM head")
        teacher.requires_grad_(False)
        self._teacher = teacher.eval()

    def check_tokenizer(self, tokenizer: Tokenizer | None, vocab_size: int, pad_id: int | None = None) -> None:
        """The run's vocabulary is the teacher's: the same size and padding id, and the same vocabulary as the
        tokenizer saved with the teacher (when the teacher's directory has one)."""
        teacher = self.load_teacher()
        if teacher.config.vocab_size != vocab_size:
            raise TokenizerError(f"{self.where}: the teacher {self.teacher} has a vocabulary of "
                                 f"{teacher.config.vocab_size} tokens, the student's tokenizer {vocab_size}: "
                                 "distillation needs one vocabulary (set tokenizer.path to the teacher's directory)")
        if pad_id is not None and teacher.config.pad_token_id != pad_id:
            raise TokenizerError(f"{self.where}: the teacher's padding id is {teacher.config.pad_token_id}, the "
                                 f"tokenizer's {pad_id} (set tokenizer.path to the teacher's directory)")
        if tokenizer is None or self.teacher is None:
            return
        from bertology.model.checkpoint import TOKENIZER_FILES

        directory = Path(self.teacher)
        if not any((directory / name).is_file() for name in TOKENIZER_FILES):
            return
        from bertology.tokenization import load_tokenizer

        theirs = load_tokenizer(directory, model_type=teacher.config.family)
        if theirs.backend.get_vocab(with_added_tokens=True) != tokenizer.backend.get_vocab(with_added_tokens=True):
            raise TokenizerError(f"{self.where}: the tokenizer in {directory} has another vocabulary than the run's "
                                 "tokenizer (same size, other tokens): set tokenizer.path to the teacher's directory")

    def initial_model(self, heads: Sequence[HeadSpec], generator: torch.Generator | None = None
                      ) -> EncoderModel | None:
        """The student initialised from the teacher (None without ``init_from_teacher``: the model is built from
        the run config)."""
        if not self.init_from_teacher:
            return None
        return init_student(self.load_teacher(), heads, generator)

    def _teacher_output(self, passes: Passes, batch: Any) -> EncoderOutput:
        done = self._outputs.get(passes)
        if done is None:
            teacher = self.load_teacher()
            device = batch.input_ids.device
            if next(teacher.parameters()).device != device:
                teacher.to(device)
            with torch.no_grad():
                done = teacher(batch.input_ids, batch.attention_mask, getattr(batch, "token_type_ids", None),
                               masked_positions=batch.masked_positions)
            self._outputs[passes] = done
        return done

    # ----------------------------------------------------------------------------------------------- the protocol
    def heads(self) -> Sequence[HeadSpec]:
        return (HeadSpec("mlm", "masked_lm", activation=self.activation or "gelu"),)

    def terms(self) -> tuple[Any, ...]:
        """Soft-target KL and MLM per masked token, the cosine term per real token; terms with a zero weight are
        left out (and their passes not run)."""
        out: list[Any] = []
        if self.alpha_ce:
            out.append(SoftTargets(self))
        if self.alpha_mlm:
            out.append(MaskedLM(weight=self.weight * self.alpha_mlm, activation=self.activation))
        if self.alpha_cos:
            out.append(HiddenCosine(self))
        if not out:
            raise ConfigError(f"objectives.{self.name}: alpha_ce, alpha_mlm and alpha_cos are all 0")
        return tuple(out)

    def reads(self, batch: Any) -> Tensor | None:
        return None

    def units(self, batch: Any) -> Tensor:
        return torch.tensor(batch.mlm_labels.shape[0], dtype=torch.int64)

    def __call__(self, passes: Passes, batch: Any) -> ObjectiveOutput:
        raise ConfigError(f"objectives.{self.name}: compose distillation through its terms() (TrainingLoss does)")

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        for term in self.terms():
            out.update(term.summarize(totals))
        return out


class SoftTargets(Objective):
    """alpha_ce * T^2 * KL(teacher || student) at the masked positions. Stats ``distill_ce_*``."""

    name = "distill_ce"

    def __init__(self, parent: Distillation) -> None:
        self.parent = parent
        self.weight = parent.weight * parent.alpha_ce

    def heads(self) -> Sequence[HeadSpec]:
        return ()

    def reads(self, batch: Any) -> Tensor:
        return batch.masked_positions  # the student's MLM logits there

    def units(self, batch: Any) -> Tensor:
        return torch.tensor(batch.mlm_labels.shape[0], dtype=torch.int64)

    def __call__(self, passes: Passes, batch: Any) -> ObjectiveOutput:
        student = passes.shared.head_logits["mlm"]
        teacher = self.parent._teacher_output(passes, batch).head_logits["mlm"]
        loss_sum = soft_cross_entropy_kl(student, teacher, self.parent.temperature)
        with torch.no_grad():
            agree = (student.argmax(-1) == teacher.argmax(-1)).sum()
        return ObjectiveOutput(loss_sum, {
            "distill_ce_units": count(student.shape[0], student.device),
            "distill_ce_loss_sum": loss_sum.detach().float(),
            "distill_ce_agree": agree,
        })

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        units = totals.get("distill_ce_units", 0.0)
        return {"distill_ce_loss": ratio(totals.get("distill_ce_loss_sum", 0.0), units),
                "distill_agreement": ratio(totals.get("distill_ce_agree", 0.0), units)}


class HiddenCosine(Objective):
    """alpha_cos * (1 - cos(student, teacher last hidden state)) at every real token (DistilBERT's
    CosineEmbeddingLoss with target 1). Stats ``distill_cos_*``."""

    name = "distill_cos"

    def __init__(self, parent: Distillation) -> None:
        self.parent = parent
        self.weight = parent.weight * parent.alpha_cos

    def heads(self) -> Sequence[HeadSpec]:
        return ()

    def reads(self, batch: Any) -> None:
        return None  # every real token of the last layer

    def units(self, batch: Any) -> Tensor:
        return batch.attention_mask.sum().to(torch.int64)  # on the batch's device: no host sync

    def __call__(self, passes: Passes, batch: Any) -> ObjectiveOutput:
        student = passes.shared.last_hidden_state
        teacher = self.parent._teacher_output(passes, batch).last_hidden_state
        if student.shape[-1] != teacher.shape[-1]:
            raise ConfigError(f"objectives.{self.parent.name}.alpha_cos: the student's hidden size "
                              f"{student.shape[-1]} differs from the teacher's {teacher.shape[-1]}; the cosine "
                              "term needs one width (set alpha_cos to 0)")
        real = batch.attention_mask.bool()
        cosine = F.cosine_similarity(student[real].float(), teacher[real].float(), dim=-1)
        loss_sum = (1.0 - cosine).sum()
        return ObjectiveOutput(loss_sum, {
            "distill_cos_units": real.sum().to(torch.int64),
            "distill_cos_loss_sum": loss_sum.detach(),
        })

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        return {"distill_cos_loss": ratio(totals.get("distill_cos_loss_sum", 0.0),
                                          totals.get("distill_cos_units", 0.0))}
