"""ELECTRA's replaced-token detection (Clark et al., 2020): a small masked-LM generator fills the masked positions
with tokens sampled from its output distribution, and the model being trained (the discriminator) labels every real
token original or replaced.

    L = w_gen * MLM_gen + w_rtd * RTD,   w_gen = 1, w_rtd = 50 (the paper's lambda)

* The generator is an encoder ``generator_size`` times the discriminator's width (hidden size, feed-forward size;
  ``hidden // 64`` heads, as ELECTRA's ``get_generator_config``) with the discriminator's depth unless
  ``generator_layers`` says otherwise. When its width differs from the embedding width it has its own projection
  (ELECTRA's ``embedding_size``), as transformers' ``ElectraForMaskedLM`` does.
* ``embedding_sharing`` says what the two encoders share of their input embeddings:

  - ``shared`` (ELECTRA): the generator's token, position and segment embeddings and their LayerNorm are the
    discriminator's (the same modules), updated by both losses;
  - ``gdes`` (DeBERTa-v3's gradient-disentangled embedding sharing, He et al. 2023): each embedding table of the
    discriminator (token, position and segment, where both encoders have one) is the generator's with the
    gradient stopped plus a residual table of its own, ``E_D = sg(E_G) + E_delta``, ``E_delta`` initialised to
    zero and the generator's tables to the discriminator's initial ones. The MLM loss alone trains ``E_G``, the
    RTD loss reaches only ``E_delta``; each encoder has its own embedding LayerNorm. The discriminator's state
    dict holds ``E_G + E_delta`` folded into a plain table (``GradientDisentangledEmbedding``), so its saved
    checkpoint is an ordinary one; ``E_delta`` itself is kept among this objective's parameters for resuming;
  - ``none``: nothing shared; the generator has embeddings of its own.
* Sampling is at temperature 1 from the generator's softmax, with no gradient through it: the discriminator's
  input is the original sequence with every masked position replaced by the sample. A sample equal to the original
  token counts as original (label 0), as in ELECTRA.
* RTD is the binary cross-entropy of the discriminator's per-token logit, averaged over the real tokens ([CLS] and
  [SEP] included, as ELECTRA weights by the input mask); MLM_gen is averaged over the masked tokens. Each term is
  normalised by its own unit count over the effective batch (``terms()``: two objectives in ``TrainingLoss``).
* The sample at a masked position is an inverse-CDF draw with a uniform that hashes (``seed``, the instance id,
  the row's masked ids, the column): a pure function of the batch, so resumed runs and evaluations repeat it.

The discriminator is the model (head ``rtd``, saved as ``ElectraForPreTraining`` for the ``electra`` family); the
generator is this objective's module (saved with the trainer state in checkpoints, and as ``ElectraForMaskedLM`` in
``<output_dir>/generator`` at the end of a run by ``save_with_model``).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertology.data.masking import _GOLDEN, _STREAMS, _mix64
from bertology.errors import ConfigError
from bertology.model.config import TransformerConfig
from bertology.model.encoder import EncoderModel, HeadSpec
from bertology.model.protocol import ENCODER, require
from bertology.objectives.base import Objective, ObjectiveOutput, Passes, check_objective, count, ratio, safe_exp
from bertology.objectives.mlm import MaskedBatch, mlm_loss

if TYPE_CHECKING:
    from bertology.tokenization import Tokenizer

GENERATOR_DIR = "generator"
_SAMPLE_TAG = np.uint64(0x656C656374726121)  # separates these streams from masking's


EMBEDDING_SHARING = ("none", "shared", "gdes")
_TABLES = ("word", "position", "token_type")  # the embedding tables gradient-disentangled sharing applies to


class GradientDisentangledEmbedding(nn.Module):
    """An embedding table ``sg(source.weight) + delta``: the lookup of another encoder's table (``source``, an
    ``nn.Embedding`` trained by its own loss) with the gradient stopped, plus a residual table of its own
    (``delta``, initialised to zero) that alone receives this encoder's gradient. ``weight`` is the sum (what a
    tied head reads). In a state dict the module is one plain table: ``<prefix>weight`` = ``source.weight + delta``
    is written, and loading one sets ``delta`` to the loaded table minus ``source``'s (the checkpoint writers and
    converters see an ordinary embedding; the exact ``delta`` is restored from the objective's own state)."""

    def __init__(self, source: nn.Embedding) -> None:
        super().__init__()
        self._source = (source,)  # not a submodule: the table is the other encoder's, trained and saved with it
        self.delta = nn.Parameter(torch.zeros_like(source.weight))
        self.padding_idx = source.padding_idx
        self.offset = int(getattr(source, "offset", 0))  # LearnedPositions' unused rows

    @property
    def source(self) -> nn.Embedding:
        return self._source[0]

    @property
    def weight(self) -> Tensor:
        return self.source.weight.detach() + self.delta

    def forward(self, ids: Tensor) -> Tensor:
        if self.offset:
            ids = ids + self.offset
        # Two lookups of the rows read, not the whole sum: the same values (one addition per element either way).
        return (F.embedding(ids, self.source.weight.detach(), self.padding_idx)
                + F.embedding(ids, self.delta, self.padding_idx))

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        weight = self.weight
        destination[prefix + "weight"] = weight if keep_vars else weight.detach()

    def _load_from_state_dict(self, state_dict: Mapping[str, Any], prefix: str, local_metadata: Any, strict: bool,
                              missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str]) -> None:
        key = prefix + "weight"
        if strict:
            unexpected_keys.extend(k for k in state_dict if k.startswith(prefix) and k != key)
        if key not in state_dict:
            if strict:
                missing_keys.append(key)
            return
        value = state_dict[key]
        if tuple(value.shape) != tuple(self.delta.shape):
            error_msgs.append(f"size mismatch for {key}: copying a param with shape {tuple(value.shape)}, the "
                              f"shape in the current model is {tuple(self.delta.shape)}")
            return
        with torch.no_grad():
            self.delta.copy_(value.to(self.delta) - self.source.weight.to(self.delta))

    def extra_repr(self) -> str:
        rows, width = self.delta.shape
        return f"{rows}, {width}, sg(source) + delta"


def generator_config(discriminator: TransformerConfig, size: float, layers: int | None = None) -> TransformerConfig:
    """The generator's config: ``size`` x the discriminator's hidden and feed-forward widths, ``hidden // 64`` heads
    (at least one, and a divisor of the width), the same embedding width (projected when the widths differ)."""
    hidden = max(1, int(round(discriminator.hidden_size * size)))
    heads = max(1, hidden // 64)
    while hidden % heads:
        heads -= 1
    embedding = discriminator.token_embedding_size
    # Fields of the discriminator's structure that do not carry over to a narrower encoder (pruned heads).
    reset = {f.name: f.default_factory() for f in dataclasses.fields(discriminator)  # type: ignore[misc]
             if f.name == "pruned_heads" and f.default_factory is not dataclasses.MISSING}
    return dataclasses.replace(
        discriminator,
        hidden_size=hidden,
        num_heads=heads,
        intermediate_size=max(1, int(round(discriminator.intermediate_size * size))),
        num_layers=layers if layers is not None else discriminator.num_layers,
        embedding_size=None if embedding == hidden else embedding,
        num_layer_groups=None,
        inner_group_size=1,
        pooler=False,
        extra={},
        **reset,
    )


def _signed(value: int) -> int:
    """A 64-bit pattern as the int64 holding the same bits."""
    value %= 2**64
    return value - 2**64 if value >= 2**63 else value


def _shift_right(x: Tensor, bits: int) -> Tensor:
    """The logical right shift of int64 ``x`` taken as uint64 (torch shifts int64 arithmetically)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


_SPLITMIX = (_signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB))
_GOLDEN_INT = _signed(int(_GOLDEN))


def _mix64_tensor(x: Tensor) -> Tensor:
    """``bertology.data.masking._mix64`` (SplitMix64's finaliser) on int64 tensors holding uint64 bits, on any
    device: int64 products and sums wrap modulo 2**64 as the uint64 ones do, so the bits are the same."""
    x = x ^ _shift_right(x, 30)
    x = x * _SPLITMIX[0]
    x = x ^ _shift_right(x, 27)
    x = x * _SPLITMIX[1]
    return x ^ _shift_right(x, 31)


def sampling_keys(seed: int, input_ids: Tensor, attention_mask: Tensor, instance_ids: Tensor | None) -> Tensor:
    """One 64-bit key per row (int64 ``[B]``, on the batch's device) from ``seed``, the row's instance id (its index
    when there is none) and a hash of its (masked) ids at real tokens. Computed with tensor operations where the
    batch is: no host synchronisation in a training step."""
    ids = input_ids.detach().to(torch.int64)
    device = ids.device
    columns = (torch.arange(ids.shape[1], dtype=torch.int64, device=device) + 1) * _GOLDEN_INT
    mixed = _mix64_tensor(ids + columns[None, :])
    content = torch.where(attention_mask.detach().bool(), mixed, torch.zeros_like(mixed)).sum(dim=1)
    rows = (instance_ids.detach().to(device, torch.int64) if instance_ids is not None
            else torch.arange(ids.shape[0], dtype=torch.int64, device=device))
    base = int(_mix64(np.array([int(seed) % 2**64], dtype=np.uint64) ^ _SAMPLE_TAG)[0])  # a constant: host
    return _mix64_tensor(_mix64_tensor(_signed(base) + (rows + 1) * _GOLDEN_INT) ^ content)


def keyed_uniforms_at(keys: Tensor, positions: Tensor, stream: int = 0) -> Tensor:
    """``bertology.data.masking._keyed_uniforms(keys, L, stream)[rows, columns]`` at the ``[N, 2]`` (row, column)
    ``positions`` only, on their device: float64 uniforms in [0, 1), 53 random bits each."""
    k = keys.to(positions.device)[positions[:, 0]]
    counters = positions[:, 1].to(torch.int64) * _STREAMS + (stream + 1)
    bits = _shift_right(_mix64_tensor(k + counters * _GOLDEN_INT), 11)
    return bits.to(torch.float64) * 2.0**-53


def sample_from_logits(logits: Tensor, uniforms: Tensor) -> Tensor:
    """Inverse-CDF draws from ``softmax(logits)`` (``[N, V]``) with ``uniforms`` in [0, 1) (``[N]``), in float64."""
    if logits.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=logits.device)
    cdf = torch.cumsum(torch.softmax(logits.detach().double(), dim=-1), dim=-1)
    u = uniforms.to(cdf.device, torch.float64)[:, None] * cdf[:, -1:]  # the last entry is 1 up to rounding
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp(max=logits.shape[1] - 1)


@dataclass
class Replaced:
    """What the generator did to one batch: its logits at the masked positions, the discriminator's input and the
    per-token labels (1 = replaced)."""

    generator_logits: Tensor  # [N, V]
    samples: Tensor  # [N]
    corrupted: Tensor  # [B, L]
    labels: Tensor  # [B, L] float, 0 at padding


@dataclass(eq=False, repr=False)
class Electra(nn.Module, Objective):
    """ELECTRA pretraining (see the module docstring). Options: ``generator_size`` in (0, 1] (the paper uses 1/4 to
    1/3), ``generator_layers`` (None: the discriminator's), ``generator_weight`` and ``rtd_weight`` (ELECTRA: 1 and
    50), ``weight`` (a factor on both terms), ``seed`` of the sampling. Metrics: ``generator_loss``,
    ``generator_accuracy`` and ``generator_perplexity`` at the masked positions; ``rtd_loss``, ``rtd_accuracy``
    over every real token, ``rtd_precision`` and ``rtd_recall`` of "replaced", ``rtd_replaced_share`` (replaced
    tokens per masked token)."""

    generator_size: float = 0.25
    generator_layers: int | None = None
    generator_weight: float = 1.0
    rtd_weight: float = 50.0
    weight: float = 1.0
    seed: int = 0
    embedding_sharing: str = "shared"  # none | shared (ELECTRA) | gdes (DeBERTa-v3)
    activation: str | None = None  # of the discriminator head; None: the model's hidden_act (set by the recipe)
    name: str = "electra"

    def fit_model_config(self, model_config: Any, lm_kind: str | None) -> None:
        if self.activation is None:  # the head's activation follows the model's (as in transformers)
            self.activation = model_config.hidden_act

    def __post_init__(self) -> None:
        super().__init__()
        check_objective(self)
        where = f"objectives.{self.name}"
        if not 0.0 < self.generator_size <= 1.0:
            raise ConfigError(f"{where}.generator_size: must be in (0, 1] (a fraction of the discriminator's "
                              f"width; a generator wider than the discriminator is not ELECTRA), got "
                              f"{self.generator_size}")
        if self.generator_layers is not None and self.generator_layers < 1:
            raise ConfigError(f"{where}.generator_layers: must be >= 1 or null, got {self.generator_layers}")
        for key in ("generator_weight", "rtd_weight"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{where}.{key}: must be >= 0, got {getattr(self, key)}")
        if self.seed < 0:
            raise ConfigError(f"{where}.seed: must be >= 0, got {self.seed}")
        if self.embedding_sharing not in EMBEDDING_SHARING:
            raise ConfigError(f"{where}.embedding_sharing: must be one of {', '.join(EMBEDDING_SHARING)}, got "
                              f"{self.embedding_sharing!r}")
        self.generator: EncoderModel | None = None
        # gdes: the discriminator's residual tables (E_delta), by table name; the same parameters as the model's
        # GradientDisentangledEmbedding modules, kept here so that checkpoints hold them exactly.
        self.embedding_deltas = nn.ParameterDict()
        self._replaced: weakref.WeakKeyDictionary[Passes, Replaced] = weakref.WeakKeyDictionary()

    # ------------------------------------------------------------------------------------------- the generator
    def attach(self, model: EncoderModel, generator: torch.Generator | None = None) -> EncoderModel:
        """Build the generator for ``model`` (the discriminator), initialised from ``generator``, and share their
        embeddings as ``embedding_sharing`` says (``shared``: the generator's token, position and segment embeddings
        and their LayerNorm become the discriminator's; ``gdes``: the discriminator's tables become
        ``GradientDisentangledEmbedding``s of the generator's, which start as copies of the discriminator's).
        Returns the generator."""
        require(model, ENCODER, "ELECTRA (a generator sharing the discriminator's embeddings)")
        where = f"objectives.{self.name}"
        disc = model.config
        if int(round(disc.hidden_size * self.generator_size)) > disc.hidden_size:
            raise ConfigError(f"{where}.generator_size: the generator would be wider than the discriminator")
        if self.generator_layers is not None and self.generator_layers > disc.num_layers:
            raise ConfigError(f"{where}.generator_layers: {self.generator_layers} is deeper than the "
                              f"discriminator's {disc.num_layers} layers")
        config = generator_config(disc, self.generator_size, self.generator_layers)
        gen = EncoderModel(config, (HeadSpec("mlm", "masked_lm", activation="gelu"),))
        gen.init_weights(generator)
        shared, own = model.encoder.embeddings, gen.encoder.embeddings
        if self.embedding_sharing == "shared":
            own.word, own.position, own.token_type, own.norm = (shared.word, shared.position, shared.token_type,
                                                                shared.norm)
        self.generator = gen.to(next(model.parameters()).device)
        if self.embedding_sharing == "gdes":
            self._disentangle(shared, own)
        return self.generator

    def _disentangle(self, disc: nn.Module, gen: nn.Module) -> None:
        """GDES: each table the two encoders both have (as embedding tables of the same shape) starts, in the
        generator, as a copy of the discriminator's initial one, and the discriminator's is replaced by
        ``sg(generator's) + delta`` with ``delta`` zero (so both start from the same table, as with ``shared``)."""
        self.embedding_deltas = nn.ParameterDict()
        for part in _TABLES:
            ours, theirs = getattr(disc, part, None), getattr(gen, part, None)
            if isinstance(ours, GradientDisentangledEmbedding):
                raise ConfigError(f"objectives.{self.name}.embedding_sharing: the model's {part} embeddings are "
                                  "already shared with a generator (attach once per model)")
            if (not isinstance(ours, nn.Embedding) or type(ours) is not type(theirs)
                    or ours.weight.shape != theirs.weight.shape):
                continue
            with torch.no_grad():
                theirs.weight.copy_(ours.weight)
            table = GradientDisentangledEmbedding(theirs)
            setattr(disc, part, table)
            self.embedding_deltas[part] = table.delta

    def _gen(self) -> EncoderModel:
        if self.generator is None:
            raise ConfigError(f"objectives.{self.name}: the generator is not built; call attach(model) before "
                              "training (bertology.recipes.pretrain does)")
        return self.generator

    def replace(self, passes: Passes, batch: MaskedBatch) -> Replaced:
        """The generator's pass and samples for this batch (computed once per batch, shared by both terms)."""
        done = self._replaced.get(passes)
        if done is not None:
            return done
        gen = self._gen()
        positions = batch.masked_positions
        out = gen(batch.input_ids, batch.attention_mask, getattr(batch, "token_type_ids", None),  # type: ignore[attr-defined]
                  masked_positions=positions, last_layer_at=positions[:0])
        logits = out.head_logits["mlm"]
        keys = sampling_keys(self.seed, batch.input_ids, batch.attention_mask,  # type: ignore[attr-defined]
                             getattr(batch, "instance_ids", None))
        uniforms = keyed_uniforms_at(keys, positions)
        with torch.no_grad():
            samples = sample_from_logits(logits, uniforms)
            corrupted = batch.input_ids.clone()  # type: ignore[attr-defined]
            corrupted[positions[:, 0], positions[:, 1]] = samples.to(corrupted.dtype)
            labels = torch.zeros(corrupted.shape, dtype=torch.float32, device=corrupted.device)
            labels[positions[:, 0], positions[:, 1]] = (samples != batch.mlm_labels).float()
        done = Replaced(logits, samples, corrupted, labels)
        self._replaced[passes] = done
        return done

    def load_with_model(self, model_dir: str | Path) -> bool:
        """Continuing from a model directory (``model.init_from``) of an ELECTRA run: the generator saved beside it
        (``<model_dir>/../generator``), except the embeddings it shares with the model (``shared``), which come from
        the model; with ``gdes`` the generator whole, and ``E_delta`` the model's tables minus the generator's.
        False (the fresh generator stays) when there is none."""
        directory = Path(model_dir).parent / GENERATOR_DIR
        if not directory.is_dir():
            return False
        from bertology.model.checkpoint import load_model

        gen = self._gen()
        saved = load_model(directory)
        shape = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "embedding_size", "vocab_size")
        differ = [f"{key} {getattr(saved.config, key)} != {getattr(gen.config, key)}" for key in shape
                  if getattr(saved.config, key) != getattr(gen.config, key)]
        if differ:
            raise ConfigError(f"objectives.{self.name}.generator_size: the generator saved in {directory} has "
                              f"another shape than this run's ({'; '.join(differ)})")
        if self.embedding_sharing != "shared":  # the generator's own embeddings too
            # gdes: the model's tables (E_G + E_delta of the earlier run) stay what they are: E_delta is what they
            # differ by from the generator's saved E_G
            tables = gen.encoder.embeddings
            with torch.no_grad():
                folded = {part: getattr(tables, part).weight + delta for part, delta in self.embedding_deltas.items()}
            gen.load_state_dict(saved.state_dict())
            with torch.no_grad():
                for part, weight in folded.items():
                    self.embedding_deltas[part].copy_(weight - getattr(gen.encoder.embeddings, part).weight)
            return True
        shared = tuple(f"encoder.embeddings.{part}." for part in ("word", "position", "token_type", "norm"))
        own = {k: v for k, v in saved.state_dict().items() if not k.startswith(shared)}
        missing, unexpected = gen.load_state_dict(own, strict=False)
        assert not unexpected and all(k.startswith(shared) for k in missing), (missing, unexpected)
        return True

    # ------------------------------------------------------------------------------------------- the protocol
    def heads(self) -> Sequence[HeadSpec]:
        return (HeadSpec("rtd", "token_mlp", activation=self.activation or "gelu"),)

    def terms(self) -> tuple[GeneratorMLM, ReplacedTokenDetection]:
        """The two losses, each with its own units (masked tokens, real tokens), composed by ``TrainingLoss``."""
        return (GeneratorMLM(self), ReplacedTokenDetection(self))

    def reads(self, batch: Any) -> Tensor:
        return batch.masked_positions[:0]

    def units(self, batch: Any) -> Tensor:
        return torch.tensor(batch.mlm_labels.shape[0], dtype=torch.int64)

    def __call__(self, passes: Passes, batch: Any) -> ObjectiveOutput:  # type: ignore[override]
        raise ConfigError(f"objectives.{self.name}: compose ELECTRA through its terms() (TrainingLoss does)")

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        for term in self.terms():
            out.update(term.summarize(totals))
        return out

    def save_with_model(self, output_dir: str | Path, tokenizer: Tokenizer | None) -> Path:
        """Write the generator (with the tokenizer) to ``<output_dir>/generator``: ``ElectraForMaskedLM``'s layout
        for the ``electra`` family."""
        from bertology.model.checkpoint import Pretrained

        path = Path(output_dir) / GENERATOR_DIR
        Pretrained(self._gen(), tokenizer).save(path)
        return path


class GeneratorMLM(Objective):
    """ELECTRA's generator loss: MLM cross-entropy at the masked positions. Stats ``generator_*``."""

    name = "generator"

    def __init__(self, electra: Electra) -> None:
        self.electra = electra
        self.weight = electra.weight * electra.generator_weight

    def heads(self) -> Sequence[HeadSpec]:
        return ()

    def reads(self, batch: Any) -> Tensor:
        return batch.masked_positions[:0]  # reads nothing of the shared pass

    def units(self, batch: Any) -> Tensor:
        return torch.tensor(batch.mlm_labels.shape[0], dtype=torch.int64)

    def __call__(self, passes: Passes, batch: Any) -> ObjectiveOutput:
        done = self.electra.replace(passes, batch)
        logits = done.generator_logits
        loss_sum = mlm_loss(logits, batch.mlm_labels, reduction="sum")
        with torch.no_grad():
            correct = (logits.argmax(-1) == batch.mlm_labels).sum()
        return ObjectiveOutput(loss_sum, {
            "generator_units": count(batch.mlm_labels.shape[0], logits.device),
            "generator_loss_sum": loss_sum.detach().float(),
            "generator_correct": correct,
        })

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        units = totals.get("generator_units", 0.0)
        loss = ratio(totals.get("generator_loss_sum", 0.0), units)
        return {"generator_loss": loss, "generator_accuracy": ratio(totals.get("generator_correct", 0.0), units),
                "generator_perplexity": safe_exp(loss)}


class ReplacedTokenDetection(Objective):
    """ELECTRA's discriminator loss: per-token binary cross-entropy of the ``rtd`` head over the real tokens of the
    corrupted batch. Stats ``rtd_*``."""

    name = "rtd"

    def __init__(self, electra: Electra) -> None:
        self.electra = electra
        self.weight = electra.weight * electra.rtd_weight

    def heads(self) -> Sequence[HeadSpec]:
        return ()

    def reads(self, batch: Any) -> Tensor:
        return batch.masked_positions[:0]  # the discriminator reads its own pass, on the corrupted ids

    def units(self, batch: Any) -> Tensor:
        return batch.attention_mask.sum().to(torch.int64)  # on the batch's device: no host sync

    def __call__(self, passes: Passes, batch: Any) -> ObjectiveOutput:
        done = self.electra.replace(passes, batch)
        out = passes.run(done.corrupted, batch.attention_mask, getattr(batch, "token_type_ids", None))
        logits = out.head_logits["rtd"].float()
        real = batch.attention_mask.bool()
        labels = done.labels
        loss_sum = F.binary_cross_entropy_with_logits(logits[real], labels[real], reduction="sum")
        with torch.no_grad():
            predicted = (logits > 0) & real
            replaced = labels.bool()
            device = logits.device
            stats = {
                "rtd_units": real.sum().to(torch.int64),
                "rtd_loss_sum": loss_sum.detach(),
                "rtd_correct": ((predicted == replaced) & real).sum(),
                "rtd_predicted": predicted.sum(),
                "rtd_replaced": replaced.sum(),
                "rtd_true_positive": (predicted & replaced).sum(),
                "rtd_masked": count(batch.mlm_labels.shape[0], device),
            }
        return ObjectiveOutput(loss_sum, stats)

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        get = totals.get
        return {
            "rtd_loss": ratio(get("rtd_loss_sum", 0.0), get("rtd_units", 0.0)),
            "rtd_accuracy": ratio(get("rtd_correct", 0.0), get("rtd_units", 0.0)),
            "rtd_precision": ratio(get("rtd_true_positive", 0.0), get("rtd_predicted", 0.0)),
            "rtd_recall": ratio(get("rtd_true_positive", 0.0), get("rtd_replaced", 0.0)),
            "rtd_replaced_share": ratio(get("rtd_replaced", 0.0), get("rtd_masked", 0.0)),
        }
