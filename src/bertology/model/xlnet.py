"""XLNet (Yang et al. 2019): a permutation language model on Transformer-XL's relative positions and memory, built
from the shared block (post-norm, its attention projections without bias) and the shared masked attention.

Two streams run through every layer with the same weights. The content stream h_i sees the content of the tokens
its factorisation order lets it see, and itself; the query stream g_i (started from one learned vector, only where
`target_mapping` asks for predictions) sees the same tokens but never its own content: it knows only its position.
The query stream is computed at the P targets alone (transformers' computes it at every position and keeps the
targets'), so `target_mapping` rows must be one-hot (or empty), no token predicted twice.

    score(i, j) = [(q_i + u) k_j + rel_shift((q_i + v) R)_ij + (q_i + s) e_{[seg_i != seg_j]}] / sqrt(d)

with R the projected sinusoids of the relative distances (Transformer-XL), u, v, s the per-head biases r_w_bias,
r_r_bias, r_s_bias, and e the two relative segment vectors (same segment or not). Each layer's input is kept as the
next call's memory (`mems`, transformers' layout [M, B, H] per layer): memory positions come before the input, are
visible to every query and count as segment 0.

Without a memory (none read, none kept) the streams run on the real tokens alone (`Layout`): every linear layer
over the packed tokens, attention per group of equal-length rows, each row in its own coordinates, since relative
positions make a row's padding irrelevant; the content stream's output is then zero at padding (transformers' runs
its padding positions too). With a memory, attention probabilities, "uni" attention or bi_data the rows run padded.

The forward pass takes transformers' keyword names (input_ids, attention_mask, token_type_ids, perm_mask,
target_mapping, mems, use_mems) and returns `last_hidden_state`, `logits` and `mems` under the same names."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertology.errors import ConfigError, InputError
from bertology.model.attention import attention
from bertology.model.blocks import Block, BlockSpec, init_parameters
from bertology.model.config import ACTIVATIONS, config_from_dict, config_to_dict
from bertology.model.dropout import fast_dropout
from bertology.model.extensions import add_extension
from bertology.model.heads import HeadInputs, HeadSpec, TiedLMBiasHead, activation, build_head, register_head
from bertology.model.packing import Layout
from bertology.model.positions import relative_sinusoids
from bertology.model.registry import register_model
from bertology.model.transformer import check_ids


@dataclass
class XLNetConfig:
    """Shape and behaviour of an XLNet model (transformers' XLNetConfig, under bertology's names)."""

    family: str = "xlnet"
    vocab_size: int = 32000
    hidden_size: int = 1024
    num_layers: int = 24
    num_heads: int = 16
    attention_head_size: int | None = None  # None: hidden_size // num_heads
    intermediate_size: int = 4096
    hidden_act: str = "gelu"
    attn_type: str = "bi"  # "bi": every query sees every key; "uni": causal (Transformer-XL)
    bi_data: bool = False  # half of the batch reads its relative distances backwards
    clamp_len: int = -1  # distances clamped to [-clamp_len, clamp_len] when positive
    same_length: bool = False  # "uni": every query sees the same number of keys
    mem_len: int | None = 512  # positions kept as memory (None or 0: all)
    reuse_len: int | None = None  # only the first reuse_len positions of an input become memory (None or 0: all)
    use_mems_eval: bool = True  # use_mems when not given, in eval mode
    use_mems_train: bool = False  # ... in training mode
    layer_norm_eps: float = 1e-12
    hidden_dropout: float = 0.1  # transformers' `dropout`: embeddings, positions, attention, sublayers, output
    summary_last_dropout: float = 0.1  # after the sequence summary's tanh
    initializer_range: float = 0.02
    pad_token_id: int = 5
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"hidden_act: unknown activation {self.hidden_act!r}; expected one of "
                              f"{', '.join(ACTIVATIONS)}")
        if self.attention_head_size is None and self.hidden_size % self.num_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.attn_type not in ("bi", "uni"):
            raise ConfigError(f"attn_type: expected 'bi' or 'uni', got {self.attn_type!r}")
        for name in ("mem_len", "reuse_len"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ConfigError(f"{name}: expected a length >= 0 or null, got {value!r}")
        for name in ("hidden_dropout", "summary_last_dropout"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"{name}: expected a dropout rate in [0, 1), got {getattr(self, name)!r}")

    @property
    def head_dim(self) -> int:
        return self.attention_head_size or self.hidden_size // self.num_heads

    @property
    def token_embedding_size(self) -> int:
        return self.hidden_size

    @property
    def head_dropout(self) -> float:
        """The shared heads' own dropout: none, XLNet's output has had its dropout already."""
        return 0.0

    @property
    def max_length(self) -> int:
        return 1 << 30  # relative positions: no limit

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> XLNetConfig:
        return config_from_dict(cls, data, "xlnet")


@dataclass
class XLNetOutput:
    """What an XLNet forward returns, named as in transformers. With `target_mapping`, `last_hidden_state` and the
    logits are the query stream's at the P predicted positions ([B, P, ...]); else the content stream's."""

    last_hidden_state: Tensor
    logits: Tensor | None = None
    head_logits: dict[str, Tensor] = field(default_factory=dict)
    loss: Tensor | None = None  # mean cross-entropy of `labels` (when given)
    mems: list[Tensor] | None = None  # per layer [M, B, H], transformers' layout
    hidden_states: tuple[Tensor, ...] | None = None  # the content stream: embeddings, then every layer's output
    attentions: tuple[Tensor, ...] | None = None  # the content stream's probabilities per layer [B, heads, L, M + L]


@dataclass
class Targets:
    """Where the query stream's P predictions sit, computed once per forward from a one-hot `target_mapping`:
    `columns` [B, 1, P, K] the relative-distance column of each (target, key), `mask` [B, P, K] (True: may attend)
    and `segments` [B, P, K] the targets' rows of the query masks and segments, `present` [B, 1, P, 1] 0 at the
    empty rows of target_mapping (their output is 0, as transformers' mapping gives)."""

    columns: Tensor
    mask: Tensor | None
    segments: Tensor | None
    present: Tensor


@dataclass
class Group:
    """`count` rows with `length` real tokens each, side by side in a packed batch (`Layout.groups`): their
    content-stream mask and segments [count, n, n] (None: all visible, one segment) and the query stream's targets,
    in the rows' own coordinates."""

    count: int
    length: int
    content_mask: Tensor | None
    segments: Tensor | None
    targets: Targets | None


@dataclass
class Packed:
    """What every layer needs to run a batch's real tokens (`XLNetModel.packed`): the groups, each group's number of
    tokens in the packed stream (`sizes`), the encoded distances, either each row's own copy (dropped out row by
    row, as transformers' does), `position_sizes` rows per group, or one copy for all [2 longest, H] from which a
    group of n reads the middle 2n, and the batch rows in group order (`order`, `counts` per group) and back
    (`inverse`)."""

    groups: list[Group]
    sizes: list[int]
    positions: Tensor
    position_sizes: list[int] | None
    longest: int
    order: Tensor
    counts: list[int]
    inverse: Tensor


def rel_shift(scores: Tensor, num_keys: int) -> Tensor:
    """[B, heads, Lq, R] scores against R relative distances (from the largest down) -> [B, heads, Lq, num_keys],
    entry (i, j) read from column Lq - i + j: the distance between query i (after the memory) and key j."""
    batch, heads, queries, distances = scores.shape
    shifted = scores.reshape(batch, heads, distances, queries)[:, :, 1:]
    return shifted.reshape(batch, heads, queries, distances - 1)[..., :num_keys]


class XLNetLayer(Block):
    """A post-norm block whose self-attention is XLNet's relative attention, run for both streams."""

    def __init__(self, config: XLNetConfig) -> None:
        super().__init__(BlockSpec(
            hidden_size=config.hidden_size, num_heads=config.num_heads, head_dim=config.head_dim,
            intermediate_size=config.intermediate_size, activation=config.hidden_act, norm_eps=config.layer_norm_eps,
            pre_norm=False, bias=True, attention_bias=False, dropout=config.hidden_dropout,
            attention_dropout=config.hidden_dropout, activation_dropout=config.hidden_dropout))
        heads, head_dim = config.num_heads, config.head_dim
        self.position = nn.Linear(config.hidden_size, heads * head_dim, bias=False)  # transformers' `r`
        self.content_bias = nn.Parameter(torch.zeros(heads, head_dim))  # r_w_bias
        self.position_bias = nn.Parameter(torch.zeros(heads, head_dim))  # r_r_bias
        self.segment_bias = nn.Parameter(torch.zeros(heads, head_dim))  # r_s_bias
        self.segment_embeddings = nn.Parameter(torch.zeros(2, heads, head_dim))  # seg_embed: same segment, other

    def forward(self, h: Tensor, g: Tensor | None, content_mask: Tensor | None,  # type: ignore[override]
                positions: Tensor, segments: Tensor | None, memory: Tensor | None,
                targets: Targets | None = None, content: bool = True,
                probabilities: list[Tensor] | None = None) -> tuple[Tensor, Tensor | None]:
        """h [B, L, H]; g [B, P, H] (the query stream at `targets`) or None; content_mask [B or 1, L, M + L]
        (True: may attend); positions [B or 1, R, H] (encoded distances); segments [B, L, M + L] (True: another
        segment); memory [B, M, H]. Without `content` the content stream's output is not computed (the last
        layer's, when only the query stream is read): h comes back as it came. The content stream's attention
        probabilities are appended to `probabilities` when it is given."""
        keys_from = h if memory is None else torch.cat([memory, h], 1)
        q, k, v = self.project(keys_from)
        q = self.heads_first(q[:, keys_from.shape[1] - h.shape[1]:])
        k, v = self.heads_first(k), self.heads_first(v)
        r = self.heads_first(self.position(positions))
        h_out = h
        if content or g is None:
            a, probs = self.relative_attention(q, k, v, r, segments, content_mask,
                                               need_weights=probabilities is not None)
            if probabilities is not None:
                probabilities.append(probs)
            h_out = self.feed_forward_residual(self.attention_residual(h, a.transpose(1, 2).flatten(2)))
        if g is None or targets is None:
            return h_out, None
        a_g = self.relative_attention(self.heads_first(self.query(g)), k, v, r, targets.segments, targets.mask,
                                      targets.columns)[0] * targets.present
        g_out = self.feed_forward_residual(self.attention_residual(g, a_g.transpose(1, 2).flatten(2)))
        return h_out, g_out

    def forward_packed(self, h: Tensor, g: Tensor | None, packed: Packed,
                       content: bool = True) -> tuple[Tensor, Tensor | None]:
        """`forward` on the real tokens alone: h [T, H] packed (`Layout`), attention run per group of equal-length
        rows, each in its own coordinates (relative positions make a row's padding irrelevant); g [B, P, H] as in
        `forward`. The projections run once over the stream; the groups are split off it (a slice per group would
        make autograd add a stream-sized zero gradient per group)."""
        q, k, v = (t.split(packed.sizes) for t in self.project(h))
        r_all = self.position(packed.positions)
        r_rows = r_all.split(packed.position_sizes) if packed.position_sizes is not None else None
        queries = None
        if g is not None:
            queries = self.heads_first(self.query(g))[packed.order].split(packed.counts)
        outputs, query_outputs = [], []
        for index, group in enumerate(packed.groups):
            count, n = group.count, group.length
            qc, kc, vc = (self.heads_first(t[index].view(count, n, -1)) for t in (q, k, v))
            r = r_rows[index].view(count, 2 * n, -1) if r_rows is not None \
                else r_all[packed.longest - n:packed.longest + n][None]
            r = self.heads_first(r)
            if content:
                a = self.relative_attention(qc, kc, vc, r, group.segments, group.content_mask)[0]
                outputs.append(a.transpose(1, 2).reshape(count * n, -1))
            if queries is not None and group.targets is not None:
                t = group.targets
                a_g = self.relative_attention(queries[index], kc, vc, r, t.segments, t.mask, t.columns)[0]
                query_outputs.append(a_g * t.present)
        h_out = self.feed_forward_residual(self.attention_residual(h, torch.cat(outputs))) if content else h
        if g is None:
            return h_out, None
        a_g = torch.cat(query_outputs)[packed.inverse]
        return h_out, self.feed_forward_residual(self.attention_residual(g, a_g.transpose(1, 2).flatten(2)))

    def relative_attention(self, q: Tensor, k: Tensor, v: Tensor, r: Tensor, segments: Tensor | None,
                           allowed: Tensor | None, columns: Tensor | None = None,
                           need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """[B, heads, Q, d] attention output of queries q over keys k and values v with relative position and
        segment terms added to the scores (and the probabilities [B, heads, Q, K] with `need_weights`). The queries
        are the last Q positions of the keys, or, given `columns` [B, 1, Q, K] (the distance column each query reads
        for each key), wherever those say (the targets)."""
        scale = 1 / math.sqrt(self.head_dim)
        by_distance = (q + self.position_bias[:, None]) @ r.transpose(-1, -2)  # [B, heads, Q, R]
        if columns is None:
            bias = rel_shift(by_distance, k.shape[-2])
        else:
            bias = by_distance.gather(-1, columns.expand(-1, by_distance.shape[1], -1, -1))
        if segments is not None:
            by_segment = torch.einsum("bnid,snd->bnis", q + self.segment_bias[:, None], self.segment_embeddings)
            bias = bias + torch.where(segments[:, None], by_segment[..., 1:], by_segment[..., :1])
        return attention(q + self.content_bias[:, None], k, v, mask=allowed[:, None] if allowed is not None else None,
                         bias=bias * scale, scale=scale, dropout=self.attention_dropout if self.training else 0.0,
                         prefix=self.prefix_states(), need_weights=need_weights)


class SequenceSummaryHead(nn.Module):
    """XLNet's sequence classification (kind "summary_last"): the vector at the last position (the <cls> token,
    which left padding keeps last) -> dense -> act -> dropout -> out."""

    def __init__(self, config: Any, spec: HeadSpec) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(spec.activation)
        self.out = nn.Linear(config.hidden_size, spec.num_labels)
        self.dropout = getattr(config, "summary_last_dropout", 0.0)

    def forward(self, inputs: HeadInputs) -> Tensor:
        x = self.act(self.dense(inputs.hidden[:, -1]))
        return self.out(fast_dropout(x, self.dropout, self.training))


register_head("summary_last", SequenceSummaryHead)


class XLNetModel(nn.Module):
    """XLNet with heads; the first head is the primary one (`logits`)."""

    config_class = XLNetConfig

    def __init__(self, config: XLNetConfig, heads: Sequence[HeadSpec] = ()) -> None:
        super().__init__()
        self.config = config
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.mask_embedding = nn.Parameter(torch.zeros(config.hidden_size))  # the query stream's start
        self.layers = nn.ModuleList(XLNetLayer(config) for _ in range(config.num_layers))
        self.head_specs = tuple(heads)
        self.heads = nn.ModuleDict({spec.name: build_head(config, spec) for spec in heads})
        self.extensions: dict[str, tuple[str, dict[str, Any]]] = {}

    @property
    def word_embeddings(self) -> nn.Embedding:
        return self.embeddings

    def blocks(self) -> list[nn.Module]:
        return list(self.layers)

    def add_extension(self, where: str, factory: str, **options: Any) -> nn.Module:
        return add_extension(self, where, factory, **options)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """BERT's initialisation for the linear layers, embeddings and norms; N(0, initializer_range) for the
        attention biases, segment vectors and the query stream's start, zero vocabulary biases (as transformers)."""
        init_parameters(self, self.config.initializer_range, generator)
        std = self.config.initializer_range
        self.mask_embedding.normal_(0.0, std, generator=generator)
        for layer in self.layers:
            for p in (layer.content_bias, layer.position_bias, layer.segment_bias, layer.segment_embeddings):
                p.normal_(0.0, std, generator=generator)
        for head in self.heads.values():
            if isinstance(head, TiedLMBiasHead):
                head.bias.zero_()

    def forward_inputs(self, batch: Any) -> dict[str, Any]:
        return {name: getattr(batch, name, None) for name in
                ("input_ids", "attention_mask", "token_type_ids", "perm_mask", "target_mapping", "masked_positions")}

    def layer_states(self, input_ids: Tensor, attention_mask: Tensor,
                     token_type_ids: Tensor | None = None) -> tuple[Tensor, ...]:
        """The content stream: the embedding output, then every layer's, [B, L, H] each."""
        out = self(input_ids, attention_mask, token_type_ids=token_type_ids, use_mems=False,
                   output_hidden_states=True)
        assert out.hidden_states is not None
        return out.hidden_states

    def relative_positions(self, length: int, num_keys: int, batch: int, device: torch.device) -> Tensor:
        """The encoded distances [B or 1, R, H] from the farthest key down: R = num_keys + length ("bi") or
        num_keys + 1 ("uni"); with bi_data the second half of the batch reads them negated."""
        config = self.config
        end = -length if config.attn_type == "bi" else -1
        forward = torch.arange(num_keys, end, -1, device=device)
        directions = [forward, -forward] if config.bi_data else [forward]
        if config.bi_data and batch % 2:
            raise InputError(f"bi_data runs half of the batch forward and half backward: the batch size must be even, "
                             f"got {batch}")
        encoded = []
        for distances in directions:
            if config.clamp_len > 0:
                distances = distances.clamp(-config.clamp_len, config.clamp_len)
            encoded.append(relative_sinusoids(distances, config.hidden_size)[None])
        if config.bi_data:
            return torch.cat([e.expand(batch // 2, -1, -1) for e in encoded])
        # In training each row drops out its own copy, as transformers' does.
        return encoded[0].expand(batch, -1, -1) if self.training and config.hidden_dropout else encoded[0]

    def masks(self, batch: int, length: int, memory: int, attention_mask: Tensor | None, perm_mask: Tensor | None,
              device: torch.device) -> tuple[Tensor | None, Tensor | None]:
        """(content, query) [B or 1, L, M + L], True where a query may attend, or None when all may. A key is
        hidden by padding, by `perm_mask` (1: may not attend) and, with "uni", when it comes later; the memory is
        visible unless `attention_mask` covers it too ([B, M + L]). The content stream always sees itself."""
        num_keys = memory + length
        blocked: Tensor | None = None
        if self.config.attn_type == "uni":
            q = torch.arange(length, device=device)[:, None] + memory
            k = torch.arange(num_keys, device=device)[None, :]
            blocked = k > q
            if self.config.same_length:
                blocked = blocked | (k < q - memory)
            blocked = blocked[None]
        data: Tensor | None = None
        hidden_memory: Tensor | None = None
        if attention_mask is not None:
            if attention_mask.shape[1] == num_keys and memory:  # the memory's columns first
                hidden_memory = (attention_mask[:, :memory] < 1)[:, None, :]
                attention_mask = attention_mask[:, memory:]
            data = (attention_mask < 1)[:, None, :]
        if perm_mask is not None:
            data = perm_mask > 0 if data is None else data | (perm_mask > 0)
        if data is not None:
            if memory:
                before = data.new_zeros(*data.shape[:2], memory) if hidden_memory is None \
                    else hidden_memory.expand(-1, data.shape[1], -1)
                data = torch.cat([before, data], -1)
            blocked = data if blocked is None else blocked | data
        if blocked is None:
            return None, None
        itself = torch.arange(length, device=device)[:, None] + memory == torch.arange(num_keys, device=device)
        return ~(blocked & ~itself), ~blocked

    @staticmethod
    def targets(target_mapping: Tensor, query_mask: Tensor | None, segments: Tensor | None, memory: int,
                distances: int, dtype: torch.dtype) -> Targets:
        """The query stream's rows, at the positions its one-hot `target_mapping` rows name: each reads, for key
        j, the distance column (L - i + j) that `rel_shift` gives position i, and its rows of the masks."""
        batch, _, length = target_mapping.shape
        num_keys = memory + length
        at = target_mapping.argmax(-1)  # [B, P]
        keys = torch.arange(num_keys, device=at.device)
        columns = (length - at[:, None, :, None] + keys).clamp(max=distances - 1)  # beyond: a hidden key ("uni")

        def rows(table: Tensor | None) -> Tensor | None:
            if table is None:
                return None
            return table.expand(batch, -1, -1).gather(1, at[:, :, None].expand(-1, -1, num_keys))

        present = target_mapping.sum(-1).to(dtype)[:, None, :, None]
        return Targets(columns, rows(query_mask), rows(segments), present)

    def layout(self, attention_mask: Tensor | None, memory: int, use_mems: bool, output_attentions: bool
               ) -> Layout | None:
        """The packed layout of the batch's real tokens, or None where the padded path runs: with a memory (kept
        or read: its positions are every row's, padding included, as transformers' memory), attention
        probabilities, "uni" attention or bi_data, without a mask, or where a row's real tokens are not one run
        (or a row has none)."""
        config = self.config
        if attention_mask is None or memory or use_mems or output_attentions or config.attn_type != "bi" \
                or config.bi_data:
            return None
        host = attention_mask.detach().to("cpu", torch.bool)  # the one host copy; free for a CPU mask
        lengths = host.sum(1)
        first = host.to(torch.uint8).argmax(1)
        columns = torch.arange(host.shape[1])
        one_run = (columns >= first[:, None]) & (columns < (first + lengths)[:, None])
        if not bool((lengths > 0).all()) or not torch.equal(one_run, host):
            return None
        return Layout(host).to(attention_mask.device)

    def packed(self, layout: Layout, perm_mask: Tensor | None, token_type_ids: Tensor | None,
               target_mapping: Tensor | None, dtype: torch.dtype) -> Packed:
        """Each group's masks, segments and targets in its rows' own coordinates (the content stream sees itself;
        a target slot on padding is empty) and the encoded distances (see `Packed`)."""
        length = layout.seq_len
        dropout = self.config.hidden_dropout if self.training else 0.0
        blocked_all = perm_mask > 0 if perm_mask is not None else None
        groups, rows_in_order, per_row = [], [], []
        for start, count, n in layout.groups:
            flat = layout.group_positions(start, count, n)
            rows, columns = flat[:, 0] // length, flat % length
            rows_in_order.append(rows)

            def local(table: Tensor) -> Tensor:  # [B, L, L] -> the group's [count, n, n]
                inner = table[rows].gather(1, columns[:, :, None].expand(-1, -1, length))
                return inner.gather(2, columns[:, None, :].expand(-1, n, -1))

            content_mask = query_mask = segments = None
            if blocked_all is not None:
                blocked = local(blocked_all)
                itself = torch.eye(n, dtype=torch.bool, device=blocked.device)
                content_mask, query_mask = ~(blocked & ~itself), ~blocked
            if token_type_ids is not None:
                types = token_type_ids[rows].gather(1, columns)
                segments = types[:, :, None] != types[:, None, :]
            targets = None
            if target_mapping is not None:
                mapping = target_mapping[rows].gather(2, columns[:, None, :].expand(-1, target_mapping.shape[1], -1))
                targets = self.targets(mapping, query_mask, segments, 0, 2 * n, dtype)
            if dropout:
                per_row.append(self.relative_positions(n, n, count, flat.device).flatten(0, 1))
            groups.append(Group(count, n, content_mask, segments, targets))
        longest = max(group.length for group in groups)
        device = layout.flat_index.device
        positions = torch.cat(per_row) if dropout else self.relative_positions(longest, longest, 1, device)[0]
        order = torch.cat(rows_in_order)
        return Packed(groups, [group.count * group.length for group in groups],
                      fast_dropout(positions.to(dtype), dropout, self.training),
                      [2 * group.count * group.length for group in groups] if dropout else None, longest, order,
                      [group.count for group in groups], order.argsort())

    def cache(self, h: Tensor, previous: Tensor | None) -> Tensor:
        """The next memory [M', B, H] from a layer's input h [B, L, H]: the first reuse_len positions appended to
        the previous memory, the last mem_len kept (all when mem_len is None or 0), detached."""
        reuse, keep = self.config.reuse_len, self.config.mem_len
        current = (h[:, :reuse] if reuse else h).transpose(0, 1)
        memory = current if previous is None else torch.cat([previous, current], 0)
        return (memory[-keep:] if keep else memory).detach()

    def memory_mask(self, previous: Tensor | None, attention_mask: Tensor) -> Tensor:
        """The [B, M'] mask of the next memory (1: a real token) as `cache` builds that memory from an input whose
        mask is `attention_mask` [B, L] after a memory whose mask is `previous` [B, M] (None: no memory)."""
        reuse, keep = self.config.reuse_len, self.config.mem_len
        current = attention_mask[:, :reuse] if reuse else attention_mask
        mask = current if previous is None else torch.cat([previous.to(current.dtype), current], 1)
        return mask[:, -keep:] if keep else mask

    def check_inputs(self, input_ids: Tensor, attention_mask: Tensor | None, token_type_ids: Tensor | None,
                     perm_mask: Tensor | None, target_mapping: Tensor | None, mems: Sequence[Tensor] | None) -> None:
        check_ids(input_ids, self.config.vocab_size)
        batch, length = input_ids.shape
        memory = mems[0].shape[0] if mems else 0
        if attention_mask is not None and memory and tuple(attention_mask.shape) == (batch, memory + length):
            attention_mask = attention_mask[:, memory:]  # [B, M + L]: the memory's visibility first
        for name, value, shape in (("attention_mask", attention_mask, (batch, length)),
                                   ("token_type_ids", token_type_ids, (batch, length)),
                                   ("perm_mask", perm_mask, (batch, length, length))):
            if value is not None and tuple(value.shape) != shape:
                raise InputError(f"{name} must be {list(shape)} for input_ids {list(input_ids.shape)}, got "
                                 f"{list(value.shape)}")
        if target_mapping is not None and (target_mapping.dim() != 3 or target_mapping.shape[0] != batch
                                           or target_mapping.shape[2] != length):
            raise InputError(f"target_mapping must be [batch, num_predict, length] = [{batch}, P, {length}], got "
                             f"{list(target_mapping.shape)}")
        if target_mapping is not None and target_mapping.numel():
            one_hot = ((target_mapping == 0) | (target_mapping == 1)).all() & (target_mapping.sum(-1) <= 1).all() \
                & (target_mapping.sum(1) <= 1).all()
            message = ("target_mapping: each row must be one-hot (prediction p is on one token) or all zeros, and no "
                       "token predicted twice")
            if target_mapping.device.type != "cpu":  # checked on the device: reading the values would wait for it
                torch._assert_async(one_hot, message)
            elif not bool(one_hot):
                raise InputError(message)
        if mems is not None:
            if len(mems) != len(self.layers):
                raise InputError(f"mems holds {len(mems)} layers' memory; the model has {len(self.layers)} layers")
            size = mems[0].shape[0]
            for index, memory in enumerate(mems):
                if memory.dim() != 3 or tuple(memory.shape[1:]) != (batch, self.config.hidden_size) \
                        or memory.shape[0] != size:
                    raise InputError(f"mems[{index}] must be [memory length, batch, hidden] = [{size}, {batch}, "
                                     f"{self.config.hidden_size}] (transformers' layout), got {list(memory.shape)}")

    def packed_streams(self, layout: Layout, input_ids: Tensor, token_type_ids: Tensor | None,
                       perm_mask: Tensor | None, target_mapping: Tensor | None, output_hidden_states: bool
                       ) -> tuple[Tensor, Tensor | None, list[Tensor] | None]:
        """The two streams on the real tokens alone (see `layout`): h [B, L, H] with zeros at padding (still
        packed when the query stream runs: then it is not read), g [B, P, H] or None, the content stream's states
        [B, L, H] when asked."""
        dropout = self.config.hidden_dropout if self.training else 0.0
        h = fast_dropout(self.embeddings(layout.pack(input_ids)), dropout, self.training)
        packed = self.packed(layout, perm_mask, token_type_ids, target_mapping, h.dtype)
        g = None
        if target_mapping is not None:
            g = fast_dropout(self.mask_embedding.expand(len(input_ids), target_mapping.shape[1], -1), dropout,
                             self.training)
        states = [layout.unpack(h)] if output_hidden_states else None
        for index, layer in enumerate(self.layers):
            content = g is None or states is not None or index < len(self.layers) - 1
            h, g = layer.forward_packed(h, g, packed, content)
            if states is not None:
                states.append(layout.unpack(h))
        return layout.unpack(h) if g is None else h, g, states

    def padded_streams(self, input_ids: Tensor, attention_mask: Tensor | None, token_type_ids: Tensor | None,
                       perm_mask: Tensor | None, target_mapping: Tensor | None, mems: Sequence[Tensor] | None,
                       use_mems: bool, output_hidden_states: bool, output_attentions: bool
                       ) -> tuple[Tensor, Tensor | None, list[Tensor] | None, list[Tensor], list[Tensor] | None]:
        """The two streams on the padded rows, with a memory: h, g, the states, the next memory, the content
        stream's attention probabilities (when asked)."""
        config = self.config
        batch, length = input_ids.shape
        device = input_ids.device
        memory = mems[0].shape[0] if mems else 0
        dropout = config.hidden_dropout if self.training else 0.0
        content_mask, query_mask = self.masks(batch, length, memory, attention_mask, perm_mask, device)
        h = fast_dropout(self.embeddings(input_ids), dropout, self.training)
        segments = None
        if token_type_ids is not None:
            keys = token_type_ids if not memory else torch.cat([token_type_ids.new_zeros(batch, memory),
                                                                token_type_ids], 1)
            segments = token_type_ids[:, :, None] != keys[:, None, :]
        positions = fast_dropout(self.relative_positions(length, memory + length, batch, device).to(h.dtype),
                                 dropout, self.training)
        g, targets = None, None
        if target_mapping is not None:
            g = fast_dropout(self.mask_embedding.expand(batch, target_mapping.shape[1], -1), dropout, self.training)
            targets = self.targets(target_mapping, query_mask, segments, memory, positions.shape[1], h.dtype)
        new_mems: list[Tensor] = []
        states = [h] if output_hidden_states else None
        probabilities: list[Tensor] | None = [] if output_attentions else None
        for index, layer in enumerate(self.layers):
            previous = mems[index] if mems else None
            if use_mems:
                new_mems.append(self.cache(h, previous))
            # The last layer's content stream is read only when no query stream runs, or for the hidden states.
            content = g is None or states is not None or index < len(self.layers) - 1
            h, g = layer(h, g, content_mask, positions, segments,
                         previous.transpose(0, 1).to(h.dtype) if previous is not None else None, targets, content,
                         probabilities)
            if states is not None:
                states.append(h)
        return h, g, states, new_mems, probabilities

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, *,
                token_type_ids: Tensor | None = None, perm_mask: Tensor | None = None,
                target_mapping: Tensor | None = None, mems: Sequence[Tensor] | None = None,
                use_mems: bool | None = None, labels: Tensor | None = None,
                masked_positions: Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False) -> XLNetOutput:
        """`attention_mask` [B, L] (0: padding) covers the input; [B, M + L] the memory too (0: a memory position
        hidden, e.g. from another document). `perm_mask` [B, L, L]: 1 where
        query i may not see token j. `target_mapping` [B, P, L]: the P positions the query stream predicts (one-hot
        rows); without it only the content stream runs. `mems`: each layer's memory from an earlier call, [M, B, H].
        `use_mems` (default: the config's use_mems_train or use_mems_eval) returns the next memory. `labels`
        [B, P or L]: the cross-entropy of the primary head's logits (-100 ignored). `output_attentions`: the content
        stream's attention probabilities per layer, [B, heads, L, M + L] (not with `target_mapping`)."""
        self.check_inputs(input_ids, attention_mask, token_type_ids, perm_mask, target_mapping, mems)
        if output_attentions and target_mapping is not None:
            raise InputError("output_attentions gives the content stream's probabilities; with target_mapping the "
                             "query stream runs at the targets only: call without target_mapping")
        config = self.config
        if use_mems is None:
            use_mems = config.use_mems_train if self.training else config.use_mems_eval
        length = input_ids.shape[1]
        memory = mems[0].shape[0] if mems else 0
        dropout = config.hidden_dropout if self.training else 0.0
        layout = self.layout(attention_mask, memory, use_mems, output_attentions)
        if layout is not None:
            h, g, states = self.packed_streams(layout, input_ids, token_type_ids, perm_mask, target_mapping,
                                               output_hidden_states)
            new_mems: list[Tensor] = []
            probabilities: list[Tensor] | None = None
        else:
            h, g, states, new_mems, probabilities = self.padded_streams(
                input_ids, attention_mask, token_type_ids, perm_mask, target_mapping, mems, use_mems,
                output_hidden_states, output_attentions)
        out = fast_dropout(g if g is not None else h, dropout, self.training)
        result = XLNetOutput(last_hidden_state=out, mems=new_mems if use_mems else None,
                             hidden_states=tuple(states) if states is not None else None,
                             attentions=tuple(probabilities) if probabilities is not None else None)
        if self.head_specs:
            mask = attention_mask[:, -length:] if g is None and attention_mask is not None \
                else out.new_ones(out.shape[:2])
            inputs = HeadInputs(hidden=out, attention_mask=mask, word_embeddings=self.embeddings.weight,
                                masked_positions=masked_positions, input_ids=input_ids if g is None else None)
            for spec in self.head_specs:
                result.head_logits[spec.name] = self.heads[spec.name](inputs)
            result.logits = result.head_logits[self.head_specs[0].name]
        if labels is not None and result.logits is not None:
            result.loss = F.cross_entropy(result.logits.flatten(0, -2).float(), labels.flatten(), ignore_index=-100)
        return result


register_model("xlnet", XLNetModel)
