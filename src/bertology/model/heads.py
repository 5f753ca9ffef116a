"""Heads: what a model computes on top of its last hidden states, as an open registry of kinds.

A head is described by a `HeadSpec` (name, kind, labels, activation) and built by the class registered for its kind.
Every head is called the same way, `head(inputs)`, with the `HeadInputs` of the forward pass, and reads what it
needs from them; `register_head(kind, cls, reads_every_token=...)` adds a kind without touching any model. Which
kind each family uses for each task, and the weight names, are data in the checkpoint tables."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertology.builtins import Registry
from bertology.errors import ConfigError, InputError
from bertology.model.dropout import fast_dropout


def activation(name: str) -> Callable[[Tensor], Tensor]:
    if name == "gelu":
        return F.gelu
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        return functools.partial(F.gelu, approximate="tanh")
    return {"relu": F.relu, "silu": F.silu, "swish": F.silu, "tanh": torch.tanh}[name]


@dataclass(frozen=True)
class HeadSpec:
    """A head on a model. `name` keys it in `model.heads` and in the output's `head_logits`."""

    name: str  # "mlm", "nsp", "sop", "rtd", "classifier", "token_classifier", "qa", "lm", or a user's own
    kind: str  # a registered kind (HEAD_KINDS)
    num_labels: int = 2
    activation: str = "gelu"
    max_positions: int = 0  # kind "span_boundary": the offsets within a span that have an embedding

    def __post_init__(self) -> None:
        if self.kind not in HEAD_KINDS:
            raise ConfigError(f"head {self.name!r}: unknown kind {self.kind!r}; registered kinds: "
                              f"{', '.join(HEAD_KINDS)} (bertology.model.register_head)")


@dataclass
class HeadInputs:
    """What a head may read of one forward pass. `hidden` [B, L, H] is the last layer (or the scalar mix);
    `masked_positions` [N, 2] are where a masked-LM head predicts (all positions when None)."""

    hidden: Tensor
    attention_mask: Tensor
    word_embeddings: Tensor
    pooled: Tensor | None = None
    masked_positions: Tensor | None = None
    input_ids: Tensor | None = None  # the tokens [B, L] (an encoder-decoder's: the encoder's), for heads picking by id
    token_type_ids: Tensor | None = None  # the segments [B, L] where the model reads them (a pair's second: 1)
    spans: Tensor | None = None  # [S, 3] (row, first token, last token): what the span kinds classify
    span_boundaries: Tensor | None = None  # [N, 4] (row, token before, token after, offset): what SBO predicts at
    logit_scale: float = 1.0  # tied vocabulary logits are multiplied by it (T5 v1.0: d_model ** -0.5)


def tied_logits(x: Tensor, inputs: HeadInputs, bias: Tensor | None = None) -> Tensor:
    """x [..., H] onto the vocabulary through the tied word embeddings (plus `bias`), times `inputs.logit_scale`:
    the few predicted rows are scaled rather than the [V, H] matrix (as transformers' T5 does), which costs a pass
    over the matrix forward and backward."""
    scale = inputs.logit_scale
    return F.linear(x * scale if scale != 1.0 else x, inputs.word_embeddings, bias)


# Where a head reads the last layer, so that a model may skip the last layer elsewhere: every token, only the masked
# positions (every token when none are given), the first token, or the pooler (which reads the first token).
HEAD_READS = ("every_token", "masked_positions", "first_token", "pooler")


@dataclass(frozen=True)
class HeadKind:
    """A registered head kind: the module class, built as cls(config, spec), and where it reads (HEAD_READS)."""

    cls: type[nn.Module]
    reads: str = "every_token"


def register_head(kind: str, cls: type[nn.Module], *, reads: str = "every_token") -> None:
    """Make `kind` available to HeadSpec: models build `cls(config, spec)` and call it with `HeadInputs`. `reads`
    (HEAD_READS) says where it reads the last layer; the default never lets the model prune it."""
    if reads not in HEAD_READS:
        raise ConfigError(f"head kind {kind!r}: reads must be one of {', '.join(HEAD_READS)}, got {reads!r}")
    HEAD_REGISTRY[kind] = HeadKind(cls, reads)


# kind -> HeadKind; the built-in kinds are registered from bertology.builtins on first use.
HEAD_REGISTRY: Registry[HeadKind] = Registry("heads", register_head)
# The registered kinds' names, in registration order (a live view of the registry's keys).
HEAD_KINDS = HEAD_REGISTRY.keys()


def head_reads(kind: str) -> str:
    return HEAD_REGISTRY[kind].reads


def build_head(config: Any, spec: HeadSpec) -> nn.Module:
    return HEAD_REGISTRY[spec.kind].cls(config, spec)


def head_biases(config: Any) -> tuple[bool, bool]:
    """Whether a head's dense layer and its LayerNorm have biases: the config's `head_bias` and `norm_bias` where it
    has them (ModernBERT has neither), else both (every config without the fields: BERT's heads)."""
    return bool(getattr(config, "head_bias", True)), bool(getattr(config, "norm_bias", True))


class MaskedLMHead(nn.Module):
    """dense -> act -> LayerNorm -> vocabulary logits, the decoder tied to the input embeddings (plus a bias);
    only at the masked positions when they are given. The dense layer's and the norm's biases as `head_biases`."""

    def __init__(self, config: Any, spec: HeadSpec) -> None:
        super().__init__()
        width = config.token_embedding_size
        dense_bias, norm_bias = head_biases(config)
        self.dense = nn.Linear(config.hidden_size, width, bias=dense_bias)
        self.act = activation(spec.activation)
        self.norm = nn.LayerNorm(width, eps=config.layer_norm_eps, bias=norm_bias)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, inputs: HeadInputs) -> Tensor:
        h, at = inputs.hidden, inputs.masked_positions
        if at is not None:
            h = h[at[:, 0], at[:, 1]]
        return tied_logits(self.norm(self.act(self.dense(h))), inputs, self.bias)


class LinearHead(nn.Module):
    """Dropout then a linear layer on the pooled [CLS] vector (kind "pooled": NSP, SOP, BERT and ALBERT sequence
    classification)."""

    def __init__(self, config: Any, spec: HeadSpec) -> None:
        super().__init__()
        self.out = nn.Linear(config.hidden_size, spec.num_labels)
        self.dropout = config.head_dropout

    def read(self, inputs: HeadInputs) -> Tensor:
        if inputs.pooled is None:
            raise ValueError("this head reads the pooler, which the model does not have")
        return inputs.pooled

    def forward(self, inputs: HeadInputs) -> Tensor:
        return self.out(fast_dropout(self.read(inputs), self.dropout, self.training))


class TokenLinearHead(LinearHead):
    """Dropout then a linear layer on every token (kind "token": token classification, QA start/end)."""

    def read(self, inputs: HeadInputs) -> Tensor:
        return inputs.hidden


class FirstTokenHead(nn.Module):
    """dense -> act -> out on the first token: RoBERTa (tanh), ELECTRA (gelu), DistilBERT (relu) classification."""

    def __init__(self, config: Any, spec: HeadSpec) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(spec.activation)
        self.out = nn.Linear(config.hidden_size, spec.num_labels)
        self.dropout = config.head_dropout

    def forward(self, inputs: HeadInputs) -> Tensor:
        x = self.act(self.dense(fast_dropout(inputs.hidden[:, 0], self.dropout, self.training)))
        return self.out(fast_dropout(x, self.dropout, self.training))


class MeanPooledHead(nn.Module):
    """Dropout then a linear layer on the mean of the real tokens' vectors (sentence-transformers' pooling):
    sequence classification that reads every token instead of [CLS]."""

    def __init__(self, config: Any, spec: HeadSpec) -> None:
        super().__init__()
        self.out = nn.Linear(config.hidden_size, spec.num_labels)
        self.dropout = config.head_dropout

    def forward(self, inputs: HeadInputs) -> Tensor:
        h = inputs.hidden
        real = inputs.attention_mask.to(h.dtype).unsqueeze(-1)
        mean = (h * real).sum(1) / real.sum(1).clamp(min=1)
        return self.out(fast_dropout(mean, self.dropout, self.training))


class SegmentCosineHead(nn.Module):
    """A (query, passage) pair's relevance read in its one joint pass: the cosine of the mean of the query's
    tokens (segment 0, [CLS] and its [SEP] included) and the mean of the passage's (segment 1) in the last layer,
    times a learned scale, plus a learned bias, is the log-odds s of ``relevant``; the logits of the two labels
    (irrelevant, relevant) are (-s/2, s/2), so a two-label cross-entropy is the binary one on s (kind
    "segment_cosine": the reranker's default, `bertology.retrieval.reranker_task`, which says why)."""

    def __init__(self, config: Any, spec: HeadSpec) -> None:
        super().__init__()
        if spec.num_labels != 2:
            raise ConfigError(f"head {spec.name!r}: kind segment_cosine gives two labels (irrelevant, relevant), "
                              f"not {spec.num_labels}")
        self.scale = nn.Parameter(torch.empty(()))
        self.bias = nn.Parameter(torch.empty(()))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The initial scale and bias (also after a build on the meta device: `EncoderModel.init_weights`)."""
        with torch.no_grad():
            # cosine / 0.05 as the retriever scores (MultipleNegativesRankingLoss's scale 20), the boundary at cosine
            # 0.8: all-MiniLM-L6-v2's joint-pass cosines are 0.84 +- 0.04 for a question's own SQuAD paragraph and
            # 0.77 +- 0.06 for its BM25 negative (24 train questions); a boundary at 0.5 called every pair relevant
            # (loss 1.69 over the first 10 steps) and spent the run's first 40 steps moving the cosines.
            self.scale.fill_(20.0)
            self.bias.fill_(-16.0)

    def forward(self, inputs: HeadInputs) -> Tensor:
        h, types = inputs.hidden, inputs.token_type_ids
        real = inputs.attention_mask.bool()
        second = real & types.bool() if types is not None else None
        if second is None or not bool(second.any(1).all()):
            raise InputError("head kind segment_cosine reads a pair's two segments by their token types: every row "
                             "needs tokens of type 1 (the passage); this model or batch gives none")
        first = (real & ~second).to(h.dtype).unsqueeze(-1)
        second_ = second.to(h.dtype).unsqueeze(-1)
        query = (h * first).sum(1) / first.sum(1).clamp(min=1)
        passage = (h * second_).sum(1) / second_.sum(1)
        s = self.scale * F.cosine_similarity(query, passage, dim=-1) + self.bias
        return torch.stack([-s / 2, s / 2], dim=-1)


class MaxPooledHead(MeanPooledHead):
    """Dropout then a linear layer on the element-wise max of the real tokens' vectors (kind "max_pooled")."""

    def forward(self, inputs: HeadInputs) -> Tensor:
        h = inputs.hidden
        pooled = h.masked_fill(~inputs.attention_mask.bool().unsqueeze(-1), float("-inf")).amax(1)
        pooled = torch.where(torch.isfinite(pooled), pooled, 0.0)  # a row without real tokens reads zeros
        return self.out(fast_dropout(pooled, self.dropout, self.training))


class TokenMLPHead(nn.Module):
    """dense -> act -> one logit per token: ELECTRA's replaced-token discriminator."""

    def __init__(self, config: Any, spec: HeadSpec) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(spec.activation)
        self.out = nn.Linear(config.hidden_size, 1)

    def forward(self, inputs: HeadInputs) -> Tensor:
        return self.out(self.act(self.dense(inputs.hidden))).squeeze(-1)


class TiedLMHead(nn.Module):
    """Vocabulary logits from the hidden states through the tied word embeddings, no parameters of its own (GPT-2's
    and BART's language-model heads; kind "tied_lm"); only at `masked_positions` when given."""

    def __init__(self, config: Any, spec: HeadSpec) -> None:
        super().__init__()

    def forward(self, inputs: HeadInputs) -> Tensor:
        h, at = inputs.hidden, inputs.masked_positions
        if at is not None:
            h = h[at[:, 0], at[:, 1]]
        return tied_logits(h, inputs, getattr(self, "bias", None))


class SpanHead(nn.Module):
    """Span classification (kinds "span": mean pooling, "span_attention": attention pooling). A span (i, j) over the
    last layer z is [z_i; z_j; g_ij], g_ij pooling z_i .. z_j (their mean, or sum_k softmax_k(w . z_k) z_k with a
    learned w); then dense -> act -> LayerNorm -> output, one row of logits per span of `inputs.spans`."""

    def __init__(self, config: Any, spec: HeadSpec) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.pooling = "attention" if spec.kind == "span_attention" else "mean"
        self.attend = nn.Linear(hidden, 1, bias=False) if self.pooling == "attention" else None
        self.dense = nn.Linear(3 * hidden, hidden)
        self.act = activation(spec.activation)
        self.norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.out = nn.Linear(hidden, spec.num_labels)
        self.dropout = config.head_dropout

    def represent(self, z: Tensor, spans: Tensor) -> Tensor:
        """[S, 3H] representations of `spans` [S, 3] = (row, first token, last token) over z [B, L, H]."""
        rows, starts, ends = spans[:, 0], spans[:, 1], spans[:, 2]
        width = int((ends - starts).max()) + 1 if len(spans) else 1
        columns = starts[:, None] + torch.arange(width, device=z.device)[None, :]
        inside = columns <= ends[:, None]
        tokens = z[rows[:, None], torch.minimum(columns, ends[:, None])]  # [S, W, H]
        if self.attend is None:
            pooled = (tokens * inside[..., None]).sum(1) / inside.sum(1, keepdim=True).to(z.dtype)
        else:
            scores = self.attend(tokens).squeeze(-1).masked_fill(~inside, float("-inf"))
            pooled = (torch.softmax(scores.float(), dim=1).to(z.dtype)[..., None] * tokens).sum(1)
        return torch.cat([z[rows, starts], z[rows, ends], pooled], dim=-1)

    def classify(self, z: Tensor, spans: Tensor) -> Tensor:
        x = fast_dropout(self.represent(z, spans), self.dropout, self.training)
        x = self.norm(self.act(self.dense(x)))
        return self.out(fast_dropout(x, self.dropout, self.training))

    def forward(self, inputs: HeadInputs) -> Tensor:
        if inputs.spans is None:
            raise InputError("a span head reads HeadInputs.spans [S, 3] (row, first token, last token); none given")
        return self.classify(inputs.hidden, inputs.spans)


class SpanBoundaryHead(nn.Module):
    """SpanBERT's span boundary objective (kind "span_boundary"): each token x_i of a masked span predicted from the
    tokens just outside it and its offset in the span, y_i = LN(act(W2 LN(act(W1 [x_left; x_right; p_offset])))),
    into the tied vocabulary; one row of logits per row of `inputs.span_boundaries`."""

    def __init__(self, config: Any, spec: HeadSpec) -> None:
        super().__init__()
        if spec.max_positions < 1:
            raise ConfigError(f"head {spec.name!r}: kind 'span_boundary' needs max_positions >= 1, "
                              f"got {spec.max_positions}")
        hidden, width = config.hidden_size, config.token_embedding_size
        self.position = nn.Embedding(spec.max_positions, hidden)
        self.dense1 = nn.Linear(3 * hidden, hidden)
        self.norm1 = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.dense2 = nn.Linear(hidden, width)
        self.norm2 = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.act = activation(spec.activation)

    def forward(self, inputs: HeadInputs) -> Tensor:
        at = inputs.span_boundaries
        if at is None:
            raise InputError("a span boundary head reads HeadInputs.span_boundaries [N, 4] (row, token before, "
                             "token after, offset); none given")
        h = inputs.hidden
        x = torch.cat([h[at[:, 0], at[:, 1]], h[at[:, 0], at[:, 2]], self.position(at[:, 3])], dim=-1)
        x = self.norm1(self.act(self.dense1(x)))
        x = self.norm2(self.act(self.dense2(x)))
        return tied_logits(x, inputs, self.bias)


class PredictionHead(nn.Module):
    """dense -> act -> LayerNorm, then dropout and a linear output layer (ModernBERT's prediction head under its
    classifiers): kind "prediction_pooled" on one vector a sequence, the first token's or the real tokens' mean as
    the config's `classifier_pooling` says ("cls", "mean"); kind "prediction_token" on every token (tagging, QA).
    The dense layer's and the norm's biases as `head_biases`; the output layer has one."""

    def __init__(self, config: Any, spec: HeadSpec) -> None:
        super().__init__()
        hidden = config.hidden_size
        dense_bias, norm_bias = head_biases(config)
        self.dense = nn.Linear(hidden, hidden, bias=dense_bias)
        self.act = activation(spec.activation)
        self.norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps, bias=norm_bias)
        self.out = nn.Linear(hidden, spec.num_labels)
        self.dropout = config.head_dropout
        self.pooling = getattr(config, "classifier_pooling", "cls") if spec.kind == "prediction_pooled" else None

    def forward(self, inputs: HeadInputs) -> Tensor:
        h = inputs.hidden
        if self.pooling == "cls":
            h = h[:, 0]
        elif self.pooling == "mean":
            real = inputs.attention_mask.to(h.dtype).unsqueeze(-1)
            h = (h * real).sum(1) / real.sum(1).clamp(min=1)
        x = self.norm(self.act(self.dense(h)))
        return self.out(fast_dropout(x, self.dropout, self.training))


class LastTokenHead(nn.Module):
    """A linear layer without bias on each row's last real token, the last position whose attention mask is 1 (so
    left and right padding read the same token): GPT-2's sequence classification (kind "last_token"), where only
    the last position has seen the whole text."""

    def __init__(self, config: Any, spec: HeadSpec) -> None:
        super().__init__()
        self.out = nn.Linear(config.hidden_size, spec.num_labels, bias=False)

    def forward(self, inputs: HeadInputs) -> Tensor:
        h, mask = inputs.hidden, inputs.attention_mask
        columns = torch.arange(mask.shape[1], device=mask.device)
        last = (columns * mask.ne(0)).argmax(1)  # a row without real tokens reads position 0
        return self.out(h[torch.arange(h.shape[0], device=h.device), last])




class LMHead(nn.Linear):
    """Vocabulary logits through an output matrix of its own, without bias (kind "lm": T5 v1.1's untied lm_head),
    the hidden states scaled first by the config's `logit_scale` (as a tied head's are, `tied_logits`); only at
    `masked_positions` when given. Its weight is the module's own (`heads.<name>.weight`)."""

    def __init__(self, config: Any, spec: HeadSpec) -> None:
        super().__init__(config.hidden_size, config.vocab_size, bias=False)
        self.scale = float(getattr(config, "logit_scale", 1.0))

    def forward(self, inputs: HeadInputs) -> Tensor:  # type: ignore[override]
        h, at = inputs.hidden, inputs.masked_positions
        if at is not None:
            h = h[at[:, 0], at[:, 1]]
        return F.linear(h * self.scale if self.scale != 1.0 else h, self.weight)




class TiedLMBiasHead(TiedLMHead):
    """Tied vocabulary logits plus a bias of their own (kind "tied_lm_bias": BART's final_logits_bias, stored as a
    [1, vocab] buffer); only at `masked_positions` when given."""

    def __init__(self, config: Any, spec: HeadSpec) -> None:
        super().__init__(config, spec)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))  # added in the product (TiedLMHead.forward)


class EosTokenHead(nn.Module):
    """dense -> act -> out on the last token whose id is the config's eos_token_id in each row (kind "eos_token":
    BART's sequence classification reads the decoder's state at the final EOS of the input). It reads
    `HeadInputs.input_ids`, which must have as many positions as the hidden states."""

    def __init__(self, config: Any, spec: HeadSpec) -> None:
        super().__init__()
        self.eos_token_id = getattr(config, "eos_token_id", None)
        if self.eos_token_id is None:
            raise ConfigError(f"head {spec.name!r} (kind eos_token) reads the last EOS token, but the config has no "
                              "eos_token_id")
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(spec.activation)
        self.out = nn.Linear(config.hidden_size, spec.num_labels)
        self.dropout = config.head_dropout

    def forward(self, inputs: HeadInputs) -> Tensor:
        ids, h = inputs.input_ids, inputs.hidden
        if ids is None:
            raise InputError("this head reads the last EOS token of input_ids: give input_ids, not only "
                             "encoder_outputs")
        if ids.shape != h.shape[:2]:
            raise InputError(f"the EOS classifier reads the decoder at the input's EOS positions: input_ids "
                             f"{tuple(ids.shape)} and the decoder's {tuple(h.shape[:2])} must have the same shape")
        is_eos = ids == self.eos_token_id
        if ids.device.type != "cpu":  # checked on the device: reading the values would wait for it
            torch._assert_async(is_eos.any(1).all(), f"each row of input_ids needs an EOS token ({self.eos_token_id})")
        elif not bool(is_eos.any(1).all()):
            rows = (~is_eos.any(1)).nonzero().flatten().tolist()
            raise InputError(f"rows {rows} of input_ids have no EOS token (id {self.eos_token_id}), which this "
                             "classifier reads")
        positions = torch.arange(ids.shape[1], device=ids.device)
        last = torch.where(is_eos, positions, -1).amax(1).clamp(min=0)
        x = h[torch.arange(h.shape[0], device=h.device), last]
        x = self.act(self.dense(fast_dropout(x, self.dropout, self.training)))
        return self.out(fast_dropout(x, self.dropout, self.training))


# Span typing's classifier, plugged in as the extension "span_classifier" at the model's `heads` (the span task,
# bertology.tasks.spans, adds it; bertology.json records it, so that loading rebuilds it).
SPAN = "span"  # the classifier's key in model.heads (parameters heads.span.*) and the span objective's name
SPAN_EXTENSION = "span_classifier"  # the extension factory's registered name
SPAN_POOLINGS = ("mean", "attention")


def span_heads(config: Any, current: nn.Module, *, num_labels: int, pooling: str = "mean") -> nn.ModuleDict:
    """The extension factory: the model's heads plus a ``span`` head (registered kind ``span`` or
    ``span_attention``, plugged in at the path ``heads``)."""
    if pooling not in SPAN_POOLINGS:
        raise ConfigError(f"span pooling: expected one of {', '.join(SPAN_POOLINGS)}, got {pooling!r}")
    if not isinstance(current, nn.ModuleDict):
        raise ConfigError(f"extension {SPAN_EXTENSION!r}: goes at the model's 'heads', not at a "
                          f"{type(current).__name__}")
    if SPAN in current:
        raise ConfigError(f"extension {SPAN_EXTENSION!r}: the model already has a head named {SPAN!r}")
    heads = nn.ModuleDict(dict(current.items()))
    kind = "span_attention" if pooling == "attention" else "span"
    heads[SPAN] = build_head(config, HeadSpec(SPAN, kind, num_labels, activation=config.hidden_act))
    return heads
