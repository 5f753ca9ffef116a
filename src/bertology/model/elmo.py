"""ELMo (Peters et al. 2018): a character CNN and a forward and a backward LSTM language model.

    x_t   = Proj(Highway^n(relu/tanh(max_k Conv_w(E_char[c_t]))))    the token layer, one vector per word
    f_1   = LSTM_f1(x),  f_l = LSTM_fl(f_{l-1}) + f_{l-1}              the forward LM (residual from layer 2 on)
    b_1   = LSTM_b1(x),  b_l = LSTM_bl(b_{l-1}) + b_{l-1}              the backward LM, reading right to left
    h_0   = [x; x],  h_l = [f_l; b_l]                                  the three output layers (`hidden_states`)
    P(w_{t+1} | w_<=t) = softmax(W f_L[t] + b),  P(w_{t-1} | w_>=t) = softmax(W b_L[t] + b)   W, b shared

Each LSTM has a memory cell of `cell_size` and a projection of its output to `projection_dim` (the recurrent input
is the projected state), with the released model's clipping of the cell (`cell_clip`) and of the projected state
(`proj_clip`). Two code paths compute it: with either clipping on, a step-by-step loop (exact: the clipped cell is
what the next step reads, which no fused kernel does); with both off, `torch.lstm` with a projection (`proj_size`),
one fused call per layer and direction. Both read the same parameters, and agree to float rounding (tested).
Without gradients (inference), a clipped layer runs the fused kernel first and keeps its result when no clip would
have bitten (the projected states and the cells recomputed from them are checked), else the loop.

Words are given as characters (`word_to_char_ids`, `batch_to_ids`): at most `max_characters_per_token` (50) ids
per word, the UTF-8 bytes between begin- and end-of-word markers, padded; AllenNLP's convention of 262 ids (256
bytes, begin/end of sentence, begin/end of word, padding within a word) shifted up by one so that 0 is a padded
word. `<S>` and `</S>` are the sentence markers' own character sequences.

The word vocabulary's softmax (`word_embeddings`, tied across directions, with its bias in the `tied_lm_bias` head)
is only for pretraining; a model without one (`vocab_size` 0, as the released weight files) still gives the
three layers. Features that only a transformer has (heads masks and pruning, attention probabilities, a key/value
cache) are not offered: ELMo declares no such capability, and `protocol.require` refuses it where one is needed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertology.errors import ConfigError, InputError
from bertology.model.config import config_to_dict
from bertology.model.dropout import fast_dropout
from bertology.model.base import BaseModel
from bertology.model.heads import HeadInputs, HeadSpec
from bertology.model.protocol import CHARACTERS, SCALAR_MIX, check_id_range

# --- characters ---------------------------------------------------------------------------------------------------

NUM_CHARACTERS = 262  # 256 bytes, 5 markers, and 0 for a padded word (every id below is stored + 1)
BOS_CHAR, EOS_CHAR, BOW_CHAR, EOW_CHAR, PAD_CHAR = 256, 257, 258, 259, 260
BOS_WORD, EOS_WORD = "<S>", "</S>"


def _marker_word(marker: int, length: int) -> list[int]:
    ids = [PAD_CHAR] * length
    ids[:3] = [BOW_CHAR, marker, EOW_CHAR]
    return [c + 1 for c in ids]


class CharacterMapper:
    """Words to character ids. A word of more than `max_characters - 2` UTF-8 bytes is cut to that many (the
    first time, a warning says so); a word that cannot be encoded as UTF-8 (a lone surrogate) is an InputError
    naming it."""

    def __init__(self, max_characters: int = 50) -> None:
        if max_characters < 3:
            raise ConfigError(f"max_characters_per_token must be >= 3 (begin, end and one byte), got "
                              f"{max_characters}")
        self.max_characters = max_characters
        self.warned = False
        self.bos = _marker_word(BOS_CHAR, max_characters)
        self.eos = _marker_word(EOS_CHAR, max_characters)

    def word(self, word: str) -> list[int]:
        if word == BOS_WORD:
            return list(self.bos)
        if word == EOS_WORD:
            return list(self.eos)
        try:
            data = word.encode("utf-8")
        except UnicodeEncodeError as error:
            raise InputError(f"word {word!r}: character {error.start} ({word[error.start]!r}) is not a Unicode scalar "
                             "value and has no UTF-8 bytes") from None
        room = self.max_characters - 2
        if len(data) > room:
            if not self.warned:
                warnings.warn(f"word {word[:20]!r}... is {len(data)} UTF-8 bytes long; ELMo reads at most {room} "
                              "(max_characters_per_token - 2), so it and any other longer word are truncated",
                              stacklevel=3)
                self.warned = True
            data = data[:room]
        ids = [BOW_CHAR, *data, EOW_CHAR] + [PAD_CHAR] * (room - len(data))
        return [c + 1 for c in ids]

    def sentences(self, sentences: Sequence[Sequence[str]], boundaries: bool = True) -> tuple[Tensor, Tensor]:
        """Right-padded character ids [B, L, max_characters] and the word mask [B, L] of `sentences` (lists of
        words), each between `<S>` and `</S>` when `boundaries`."""
        rows = [[self.word(w) for w in ([BOS_WORD, *s, EOS_WORD] if boundaries else s)] for s in sentences]
        length = max((len(r) for r in rows), default=0)
        ids = torch.zeros(len(rows), length, self.max_characters, dtype=torch.long)
        mask = torch.zeros(len(rows), length, dtype=torch.long)
        for i, row in enumerate(rows):
            if row:
                ids[i, :len(row)] = torch.tensor(row)
                mask[i, :len(row)] = 1
        return ids, mask


def word_to_char_ids(word: str, max_characters: int = 50) -> list[int]:
    return CharacterMapper(max_characters).word(word)


def batch_to_ids(sentences: Sequence[Sequence[str]], max_characters: int = 50,
                 boundaries: bool = True) -> tuple[Tensor, Tensor]:
    """Character ids [B, L, max_characters] and mask [B, L] of tokenised sentences (see CharacterMapper)."""
    return CharacterMapper(max_characters).sentences(sentences, boundaries)


# --- config -------------------------------------------------------------------------------------------------------

RELEASED_FILTERS = [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]


# The most character ids a word may have: each word of a batch is that many character vectors through the CNN, so
# the cap bounds that work; 256 holds 254 UTF-8 bytes, more than any word of any script needs (the released models
# have 50, and cut longer words).
MAX_CHARACTERS_PER_TOKEN = 256


@dataclass
class ElmoConfig:
    """The released "original" ELMo by default (2 x 4096 -> 512, 2048 filters, 2 highway layers)."""

    family: str = "elmo"
    vocab_size: int = 0  # the word softmax's vocabulary (0: none, as in the released weight files)
    max_characters_per_token: int = 50
    char_embedding_dim: int = 16
    filters: list[list[int]] = field(default_factory=lambda: [list(f) for f in RELEASED_FILTERS])  # [width, count]
    num_highway: int = 2
    char_activation: str = "relu"  # relu or tanh, after max-pooling
    projection_dim: int = 512
    cell_size: int = 4096
    num_layers: int = 2
    cell_clip: float | None = 3.0  # None: no clipping
    proj_clip: float | None = 3.0
    skip_connections: bool = True  # the residual connection from the second layer on
    dropout: float = 0.1  # on each LSTM layer's output and the token layer, in training
    pad_token_id: int = 0  # the word id of padding in the vocabulary (never predicted)
    initializer_range: float = 0.02
    classifier_dropout: float | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.family != "elmo":
            raise ConfigError(f"ElmoConfig.family must be 'elmo', got {self.family!r}")
        for name in ("max_characters_per_token", "char_embedding_dim", "projection_dim", "cell_size", "num_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if not 3 <= self.max_characters_per_token <= MAX_CHARACTERS_PER_TOKEN:
            raise ConfigError(f"max_characters_per_token must lie in [3, {MAX_CHARACTERS_PER_TOKEN}] (a word's "
                              "UTF-8 bytes and its two markers; longer words are cut, and every word of a batch costs "
                              f"this many character vectors), got {self.max_characters_per_token}")
        if not isinstance(self.vocab_size, int) or self.vocab_size < 0:
            raise ConfigError(f"vocab_size must be >= 0, got {self.vocab_size!r}")
        if not isinstance(self.num_highway, int) or self.num_highway < 0:
            raise ConfigError(f"num_highway must be >= 0, got {self.num_highway!r}")
        if self.char_activation not in ("relu", "tanh"):
            raise ConfigError(f"char_activation must be relu or tanh, got {self.char_activation!r}")
        try:
            filters = [[int(w), int(n)] for w, n in self.filters]
        except (TypeError, ValueError):
            raise ConfigError(f"filters must be a list of [width, count] pairs, got {self.filters!r}") from None
        if not filters or any(w < 1 or n < 1 or w > self.max_characters_per_token for w, n in filters):
            raise ConfigError(f"filters: each [width, count] needs 1 <= width <= max_characters_per_token "
                              f"({self.max_characters_per_token}) and count >= 1, got {self.filters!r}")
        self.filters = filters
        for name in ("cell_clip", "proj_clip"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{name} must be > 0 or null, got {value!r}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}")

    @property
    def num_filters(self) -> int:
        return sum(n for _, n in self.filters)

    @property
    def hidden_size(self) -> int:
        """The width of every output layer: both directions' projections side by side."""
        return 2 * self.projection_dim

    @property
    def token_embedding_size(self) -> int:
        return self.projection_dim

    @property
    def head_dropout(self) -> float:
        return self.classifier_dropout if self.classifier_dropout is not None else self.dropout

    @property
    def sentence_head(self) -> str:
        """The sentence classifier a task puts on ELMo, which has no [CLS] to read: a linear layer on the mean of
        the words' vectors (``task.pooling: max`` for their max)."""
        return "mean_pooled"

    @property
    def clipped(self) -> bool:
        return self.cell_clip is not None or self.proj_clip is not None

    @property
    def max_length(self) -> int:
        return 1 << 30  # an LSTM has no position limit

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ElmoConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown elmo config key(s): {', '.join(unknown)}")
        return cls(**data)


def tiny_config(**overrides: Any) -> ElmoConfig:
    """A small ELMo for tests and CPU pretraining: 4 filter widths, 1 highway, 2 x 256 -> 64."""
    values: dict[str, Any] = dict(char_embedding_dim=8, filters=[[1, 16], [2, 16], [3, 32], [4, 64]], num_highway=1,
                                  projection_dim=64, cell_size=256)
    values.update(overrides)
    return ElmoConfig(**values)


# --- the character encoder -----------------------------------------------------------------------------------------


class Highway(nn.Module):
    """y = g * relu(W_t x + b_t) + (1 - g) * x,  g = sigmoid(W_c x + b_c)  (bilm-tf's form)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.transform = nn.Linear(width, width)
        self.carry = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        gate = torch.sigmoid(self.carry(x))
        return x + gate * (F.relu(self.transform(x)) - x)


class CharacterEncoder(nn.Module):
    """Character ids [N, C] -> token vectors [N, projection_dim]."""

    def __init__(self, config: ElmoConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(NUM_CHARACTERS, config.char_embedding_dim, padding_idx=0)
        self.convs = nn.ModuleList(nn.Conv1d(config.char_embedding_dim, count, width) for width, count in
                                   config.filters)
        self.act = torch.relu if config.char_activation == "relu" else torch.tanh
        self.highways = nn.ModuleList(Highway(config.num_filters) for _ in range(config.num_highway))
        self.projection = nn.Linear(config.num_filters, config.projection_dim)
        self.widest = max(width for width, _ in config.filters)

    def forward(self, chars: Tensor) -> Tensor:
        if chars.device.type == "cpu" and len(chars):
            # Words end in padding characters, and every window of padding alone gives a filter the same value, so
            # the max-pool needs the windows that read a real character and one of padding alone: the positions up
            # to the longest word plus the widest filter (not reading the GPU's data on the host).
            longest = int((chars != PAD_CHAR + 1).any(0).nonzero().max()) + 1
            chars = chars[:, :min(chars.shape[1], longest + self.widest)]
        x = self.embed(chars).transpose(1, 2)  # [N, dim, C]
        x = torch.cat([self.act(conv(x).amax(-1)) for conv in self.convs], dim=-1)
        for highway in self.highways:
            x = highway(x)
        return self.projection(x)


def distinct_rows(rows: Tensor) -> tuple[Tensor, Tensor]:
    """Indices of one row of each distinct value of `rows` [N, C] (small non-negative ids) and each row's place
    among them: rows[first][inverse] == rows. Rows are told apart by a key (a fixed weighted sum of their ids,
    no overflow for ids below 2^20 and C below 2^23), checked against the rows themselves: where two distinct
    rows share a key every row is its own."""
    weights = torch.randint(1, 1 << 20, (rows.shape[1],), generator=torch.Generator().manual_seed(0))
    keys = (rows * weights.to(rows.device)).sum(1)  # not a matmul: CUDA has no integer matmul
    unique, inverse = torch.unique(keys, return_inverse=True)
    first = torch.empty(len(unique), dtype=torch.long, device=rows.device)
    first.scatter_(0, inverse, torch.arange(len(rows), device=rows.device))
    if not torch.equal(rows[first][inverse], rows):
        return torch.arange(len(rows), device=rows.device), torch.arange(len(rows), device=rows.device)
    return first, inverse


# --- the LSTM with a projected state ---------------------------------------------------------------------------------


class ProjectedLSTM(nn.Module):
    """One LSTM layer, gates in PyTorch's order (input, forget, cell, output), with a projection of the output to
    `hidden` (the state the next step reads) and optional clipping of the cell and of the projected state."""

    def __init__(self, input_size: int, cell_size: int, hidden: int, cell_clip: float | None,
                 proj_clip: float | None) -> None:
        super().__init__()
        self.input_size, self.cell_size, self.hidden = input_size, cell_size, hidden
        self.cell_clip, self.proj_clip = cell_clip, proj_clip
        self.weight_ih = nn.Parameter(torch.empty(4 * cell_size, input_size))
        self.weight_hh = nn.Parameter(torch.empty(4 * cell_size, hidden))
        self.bias = nn.Parameter(torch.zeros(4 * cell_size))
        self.weight_hr = nn.Parameter(torch.empty(hidden, cell_size))
        self.fused = cell_clip is None and proj_clip is None  # False: the exact step loop (set it to test both)

    def forward(self, x: Tensor, lengths: Tensor | None, state: tuple[Tensor, Tensor] | None
                ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """x [B, T, in], right-padded to `lengths` [B] (CPU; None: all T real); state (h [B, hidden], c [B, cell]).
        Returns the outputs [B, T, hidden] (zeros at padding) and the state after each row's last real step."""
        batch = x.shape[0]
        if state is None:
            state = (x.new_zeros(batch, self.hidden), x.new_zeros(batch, self.cell_size))
        if self.fused:
            if self.cell_clip is not None or self.proj_clip is not None:
                raise ConfigError("the fused LSTM cannot clip its cell or state: use the step loop (fused=False)")
            return self._fused(x, lengths, state)
        return self._loop(x, lengths, state)

    def _loop(self, x: Tensor, lengths: Tensor | None, state: tuple[Tensor, Tensor]
              ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        h, c = state
        projected = F.linear(x, self.weight_ih, self.bias)  # every step's input part at once
        real = None if lengths is None else \
            (torch.arange(x.shape[1])[None] < lengths[:, None]).to(x.device)[..., None]
        outputs = []
        for t in range(x.shape[1]):
            gates = projected[:, t] + F.linear(h, self.weight_hh)
            i, f, g, o = gates.chunk(4, 1)
            c_next = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            if self.cell_clip is not None:
                c_next = c_next.clamp(-self.cell_clip, self.cell_clip)
            h_next = F.linear(torch.sigmoid(o) * torch.tanh(c_next), self.weight_hr)
            if self.proj_clip is not None:
                h_next = h_next.clamp(-self.proj_clip, self.proj_clip)
            if real is not None:
                h = torch.where(real[:, t], h_next, h)
                c = torch.where(real[:, t], c_next, c)
                outputs.append(h_next * real[:, t])
            else:
                h, c = h_next, c_next
                outputs.append(h_next)
        return torch.stack(outputs, 1), (h, c)

    def _fused(self, x: Tensor, lengths: Tensor | None, state: tuple[Tensor, Tensor]
               ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        weights = [self.weight_ih, self.weight_hh, self.bias, torch.zeros_like(self.bias), self.weight_hr]
        h, c = state[0][None].contiguous(), state[1][None].contiguous()
        with warnings.catch_warnings():  # on CPU torch notes that oneDNN has no projection: the result is the same
            warnings.filterwarnings("ignore", message="LSTM with projections is not supported with oneDNN")
            if lengths is None or bool((lengths == x.shape[1]).all()):
                out, h, c = torch.lstm(x, (h, c), weights, True, 1, 0.0, self.training, False, True)
                return out, (h[0], c[0])
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths.clamp(min=1), batch_first=True,
                                                       enforce_sorted=False)
            order = packed.sorted_indices
            out, h, c = torch.lstm(packed.data, packed.batch_sizes, (h[:, order], c[:, order]), weights, True, 1,
                                   0.0, self.training, False)
        unpacked, _ = nn.utils.rnn.pad_packed_sequence(
            nn.utils.rnn.PackedSequence(out, packed.batch_sizes, order, packed.unsorted_indices), batch_first=True,
            total_length=x.shape[1])
        back = packed.unsorted_indices
        unpacked = unpacked * (torch.arange(x.shape[1])[None] < lengths[:, None]).to(x.device)[..., None]
        empty = (lengths == 0).to(x.device)[:, None]  # a row without words keeps its state
        return unpacked, (torch.where(empty, state[0], h[0, back]), torch.where(empty, state[1], c[0, back]))


def reverse_rows(x: Tensor, lengths: Tensor) -> Tensor:
    """Each row's first lengths[b] positions in reverse order, padding left in place (its own inverse)."""
    steps = torch.arange(x.shape[1])[None]
    index = torch.where(steps < lengths[:, None], lengths[:, None] - 1 - steps, steps).to(x.device)
    return x.gather(1, index[..., None].expand_as(x))


def paired_loop(first: ProjectedLSTM, second: ProjectedLSTM, x1: Tensor, x2: Tensor, lengths1: Tensor,
                lengths2: Tensor, state1: tuple[Tensor, Tensor] | None, state2: tuple[Tensor, Tensor] | None
                ) -> tuple[tuple[Tensor, tuple[Tensor, Tensor]], tuple[Tensor, tuple[Tensor, Tensor]]]:
    """Two layers of the same sizes and clipping (a forward and a backward one) stepped together over inputs of
    the same shape: the exact loop's arithmetic on packed sequences. Rows are taken longest first (the longer
    direction's length), and step t reads the first active[t] rows, the ones with a word in either direction
    there; the positions so read are gathered step-major into one block per step, every step's input part is one
    batched product over them (no padding), and each step is one batched product for both layers' states. A row
    whose words ended keeps its state; a direction without a word at a step keeps its state there."""
    batch, steps = x1.shape[:2]
    cell, hidden = first.cell_size, first.hidden
    longest = torch.maximum(lengths1, lengths2)
    order = torch.sort(longest, descending=True, stable=True)[1]
    longest = longest[order]
    active = (torch.arange(steps)[None] < longest[:, None]).sum(0)  # rows with a word at step t: the first active[t]
    active = active[active > 0]
    rows = torch.arange(batch)[None].expand(len(active), -1)[torch.arange(batch)[None] < active[:, None]]
    at = torch.repeat_interleave(torch.arange(len(active)), active)  # the step of each packed position
    flat = (order[rows] * steps + at).to(x1.device)  # each packed position in [B * T], step-major
    active = active.tolist()
    # tanh(z) = 2 sigmoid(2 z) - 1: the cell gate's rows and the projection are doubled (exactly, in floating point),
    # so one sigmoid serves all four gates and a second one the cell's tanh (a sigmoid is several times cheaper
    # than a tanh on the CPU)
    double = torch.ones(4 * cell, 1, dtype=x1.dtype, device=x1.device)
    double[2 * cell:3 * cell] = 2.0
    weight_ih = (torch.stack([first.weight_ih, second.weight_ih]) * double).transpose(1, 2)  # [2, in, 4c]
    weight_hh = (torch.stack([first.weight_hh, second.weight_hh]) * double).transpose(1, 2).contiguous()
    weight_hr = (torch.stack([first.weight_hr, second.weight_hr]) * 2.0).transpose(1, 2).contiguous()  # [2, c, p]
    bias = (torch.stack([first.bias, second.bias]) * double[:, 0])[:, None]
    inputs = torch.stack([x1, x2]).reshape(2, batch * steps, -1).index_select(1, flat)  # [2, N, in]
    # each step's input part as a view of one product; split, not a slice per step: the backward of a slice writes
    # a zeroed gradient of the whole tensor for every step, the backward of split concatenates the steps' once
    projected = torch.baddbmm(bias, inputs, weight_ih).split(active, 1)
    zeros = (x1.new_zeros(batch, hidden), x1.new_zeros(batch, cell))
    sorted_rows = order.to(x1.device)
    h = torch.stack([(state1 or zeros)[0], (state2 or zeros)[0]])[:, sorted_rows]
    c = torch.stack([(state1 or zeros)[1], (state2 or zeros)[1]])[:, sorted_rows]
    real = torch.stack([lengths1[order], lengths2[order]])[:, :, None] > torch.arange(steps)  # [2, B, T] (CPU)
    # the steps where an active row has a word in one direction only (the other keeps its state there)
    uneven = [not bool(real[:, :n, t].all()) for t, n in enumerate(active)]
    real = real.to(x1.device)[..., None]
    cell_clip, proj_clip = first.cell_clip, first.proj_clip
    outputs, ended_h, ended_c = [], [h[:, active[0] if active else 0:]], [c[:, active[0] if active else 0:]]
    for t, n in enumerate(active):
        hn, cn = h[:, :n], c[:, :n]  # views: the rows past n ended at an earlier step (kept in ended_*)
        gates = torch.baddbmm(projected[t], hn, weight_hh)
        i, f, g, o = torch.sigmoid(gates).chunk(4, -1)  # g: sigmoid(2 g)
        # c = f c + i tanh(g) = f c + 2 i (sigmoid(2 g) - 1/2)
        c_next = torch.addcmul(f * cn, i, g - 0.5, value=2.0)
        if cell_clip is not None:
            c_next = c_next.clamp(-cell_clip, cell_clip)
        # h = W_hr (o tanh(c)) = (2 W_hr) (o (sigmoid(2 c) - 1/2))
        h_next = torch.bmm(o * (torch.sigmoid(c_next * 2.0) - 0.5), weight_hr)
        if proj_clip is not None:
            h_next = h_next.clamp(-proj_clip, proj_clip)
        if uneven[t]:
            keep = real[:, :n, t]
            h_next, c_next, out = torch.where(keep, h_next, hn), torch.where(keep, c_next, cn), h_next * keep
        else:
            out = h_next
        h, c = h_next, c_next
        following = active[t + 1] if t + 1 < len(active) else 0
        if following < n:  # rows following..n-1 had their last word here
            ended_h.append(h[:, following:])
            ended_c.append(c[:, following:])
        outputs.append(out)
    back = torch.argsort(order).to(x1.device)
    h, c = torch.cat(ended_h[::-1], 1)[:, back], torch.cat(ended_c[::-1], 1)[:, back]
    packed = torch.cat(outputs, 1) if outputs else x1.new_zeros(2, 0, hidden)
    out = packed.new_zeros(2, batch * steps, hidden).index_copy(1, flat, packed).view(2, batch, steps, hidden)
    return (out[0], (h[0], c[0])), (out[1], (h[1], c[1]))


# --- the model ----------------------------------------------------------------------------------------------------


@dataclass
class ElmoState:
    """Both directions' LSTM states after a call (what truncated backpropagation carries to the next window):
    h [2 * layers, B, projection_dim], c [2 * layers, B, cell_size]; forward layers first."""

    h: Tensor
    c: Tensor

    def detach(self) -> ElmoState:
        return ElmoState(self.h.detach(), self.c.detach())


@dataclass
class ElmoOutput:
    last_hidden_state: Tensor  # [B, L, 2p]: the top layer (both directions), or the scalar mix when there is one
    hidden_states: tuple[Tensor, ...] | None = None  # the token layer [x; x], then each layer's [f; b]
    forward_top: Tensor | None = None  # [B, L, p]: the forward LM's top layer (what its softmax reads)
    backward_top: Tensor | None = None  # [B, L, p]: the backward LM's (at the backward input's positions)
    state: ElmoState | None = None
    logits: Tensor | None = None
    head_logits: dict[str, Tensor] = field(default_factory=dict)


LM_HEAD_KINDS = ("tied_lm", "tied_lm_bias")


class ElmoModel(BaseModel):
    """The ELMo biLM with heads. Input: character ids [B, L, C] (`input_ids`), the word mask [B, L]. Under the
    extension "scalar_mix" (`mix`) the task heads read the mix of the three layers."""

    config_class = ElmoConfig
    CAPABILITIES = frozenset({CHARACTERS, SCALAR_MIX})

    def __init__(self, config: ElmoConfig, heads: Sequence[HeadSpec] = ()) -> None:
        super().__init__(config)
        self.characters = CharacterEncoder(config)
        p, cell = config.projection_dim, config.cell_size

        def stack() -> nn.ModuleList:
            return nn.ModuleList(ProjectedLSTM(p, cell, p, config.cell_clip, config.proj_clip)
                                 for _ in range(config.num_layers))

        self.forward_layers, self.backward_layers = stack(), stack()
        self.softmax = nn.Embedding(config.vocab_size, p) if config.vocab_size else None
        self.init_heads(heads)

    # --- the Model protocol --------------------------------------------------------------------------------------
    @property
    def word_embeddings(self) -> nn.Embedding:
        """The output vocabulary's softmax matrix [vocab, projection_dim] (ELMo reads characters, not word ids)."""
        if self.softmax is None:
            raise ConfigError("this ELMo model has no word softmax (vocab_size 0)")
        return self.softmax

    def blocks(self) -> list[nn.Module]:
        """No transformer blocks: FSDP shards ELMo as one unit and activation checkpointing leaves it alone."""
        return []

    def forward_inputs(self, batch: Any) -> dict[str, Any]:
        return {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                "backward_input_ids": getattr(batch, "backward_input_ids", None),
                "backward_attention_mask": getattr(batch, "backward_attention_mask", None)}

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """N(0, initializer_range) weights, zero biases; bilm-tf's carry bias of -2 (highways start near the
        identity) and a forget-gate bias of 1."""
        std = self.config.initializer_range
        for name, parameter in self.named_parameters():
            if name.endswith("bias") or name.endswith(".scalars"):
                parameter.zero_()
            elif name.endswith(".gamma"):
                parameter.fill_(1.0)
            else:
                parameter.normal_(0.0, std, generator=generator)
        self.characters.embed.weight[0].zero_()
        for highway in self.characters.highways:
            highway.carry.bias.fill_(-2.0)
        cell = self.config.cell_size
        for layer in (*self.forward_layers, *self.backward_layers):
            layer.bias[cell:2 * cell].fill_(1.0)

    def bilm_parameters(self) -> Iterator[nn.Parameter]:
        """The biLM's own parameters: the character encoder's and the LSTMs' (not the softmax, heads or mix)."""
        for part in (self.characters, self.forward_layers, self.backward_layers):
            yield from part.parameters()

    def layer_states(self, input_ids: Tensor, attention_mask: Tensor,
                     token_type_ids: Tensor | None = None) -> tuple[Tensor, ...]:
        """The three output layers [B, L, 2 * projection_dim]: the token layer twice, then each biLSTM layer."""
        out = self(input_ids, attention_mask, output_hidden_states=True)
        assert out.hidden_states is not None
        return out.hidden_states

    # --- the computation -----------------------------------------------------------------------------------------
    def check_chars(self, input_ids: Tensor, attention_mask: Tensor | None, what: str) -> Tensor:
        width = self.config.max_characters_per_token
        if input_ids.dim() != 3 or input_ids.shape[-1] != width:
            raise InputError(f"{what} must be character ids [batch, words, {width}] (bertology.model.elmo."
                             f"batch_to_ids), got shape {tuple(input_ids.shape)}")
        check_id_range(input_ids, NUM_CHARACTERS, f"{what} (character ids)")
        if attention_mask is None:
            return input_ids.ne(0).any(-1).long()
        if attention_mask.shape != input_ids.shape[:2]:
            raise InputError(f"attention_mask {tuple(attention_mask.shape)} must be [batch, words] "
                             f"{tuple(input_ids.shape[:2])}")
        return attention_mask

    def tokens(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The token layer [B, L, p] (zeros at padding): the character CNN runs once per distinct real word of the
        batch (in training too: a word's gradients from its occurrences are summed before the CNN's backward)."""
        real = attention_mask.bool()
        out = torch.zeros(*input_ids.shape[:2], self.config.projection_dim, device=input_ids.device,
                          dtype=self.characters.projection.weight.dtype)
        words = input_ids[real]
        first, inverse = distinct_rows(words)
        out[real] = self.characters(words[first])[inverse]
        return out

    def bilstm(self, fx: Tensor, flengths: Tensor, bx: Tensor, blengths: Tensor, state: ElmoState | None,
               dropping: bool | None = None) -> tuple[list[Tensor], list[Tensor], ElmoState]:
        """Both directions' layers: the forward LM over `fx` [B, L, p], the backward LM over `bx` from each row's
        end. Returns each layer's outputs per direction (in the input's order) and the final state. `dropping`:
        dropout between the layers (None: in training)."""
        dropping = self.training if dropping is None else dropping
        bx = reverse_rows(bx, blengths)
        layers = self.config.num_layers
        forward, backward, hs, cs = [], [], [[], []], [[], []]
        for index in range(layers):
            fl, bl = self.forward_layers[index], self.backward_layers[index]
            initial = [None, None] if state is None else \
                [(state.h[d * layers + index], state.c[d * layers + index]) for d in range(2)]
            if not fl.fused and not bl.fused and fx.shape == bx.shape:
                (fy, fstate), (by, bstate) = paired_loop(fl, bl, fx, bx, flengths, blengths, *initial)
            else:
                fy, fstate = fl(fx, flengths, initial[0])
                by, bstate = bl(bx, blengths, initial[1])
            if index > 0 and self.config.skip_connections:
                fy, by = fy + fx, by + bx
            for d, (h, c) in enumerate((fstate, bstate)):
                hs[d].append(h)
                cs[d].append(c)
            forward.append(fy)
            backward.append(reverse_rows(by, blengths))
            fx = fast_dropout(fy, self.config.dropout, dropping)
            bx = fast_dropout(by, self.config.dropout, dropping)
        return forward, backward, ElmoState(torch.stack(hs[0] + hs[1]), torch.stack(cs[0] + cs[1]))

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, *,
                backward_input_ids: Tensor | None = None, backward_attention_mask: Tensor | None = None,
                state: ElmoState | None = None, output_hidden_states: bool = False) -> ElmoOutput:
        """Both LMs over the words `input_ids` [B, L, C]. `state`: the LSTMs' state to start from (the previous
        window's, `ElmoOutput.state`; None: zeros). `backward_input_ids` (truncated backpropagation through a
        document in both directions): the backward LM reads these words instead (a window of the document read
        from its end); the output layers then exist only per direction (`forward_top`, `backward_top`)."""
        attention_mask = self.check_chars(input_ids, attention_mask, "input_ids")
        # A frozen biLM (no parameter of it trains: the frozen-feature strategies) is a fixed feature extractor: it
        # runs without gradients and without its dropout; the mix and the heads above it still train.
        frozen = not any(p.requires_grad for p in self.bilm_parameters())
        dropping = self.training and not frozen
        with torch.no_grad() if frozen else contextlib.nullcontext():
            lengths = attention_mask.sum(1).cpu()
            if backward_input_ids is None:
                x = self.tokens(input_ids, attention_mask)
                x_in = fast_dropout(x, self.config.dropout, dropping)
                bx, bx_in, blengths = x, x_in, lengths
            else:
                backward_attention_mask = self.check_chars(backward_input_ids, backward_attention_mask,
                                                           "backward_input_ids")
                blengths = backward_attention_mask.sum(1).cpu()
                if backward_input_ids.shape == input_ids.shape:  # both windows' words through the CNN at once
                    both = self.tokens(torch.cat([input_ids, backward_input_ids]),
                                       torch.cat([attention_mask, backward_attention_mask]))
                    x, bx = both.chunk(2)
                else:
                    x = self.tokens(input_ids, attention_mask)
                    bx = self.tokens(backward_input_ids, backward_attention_mask)
                x_in = fast_dropout(x, self.config.dropout, dropping)
                bx_in = fast_dropout(bx, self.config.dropout, dropping)
            forward, backward, new_state = self.bilstm(x_in, lengths, bx_in, blengths, state, dropping)
        if backward_input_ids is not None:
            return ElmoOutput(last_hidden_state=forward[-1], forward_top=forward[-1], backward_top=backward[-1],
                              state=new_state)
        states = (torch.cat([x, x], -1), *(torch.cat(pair, -1) for pair in zip(forward, backward)))
        hidden = self.mix(states) if self.mix is not None else states[-1]
        out = ElmoOutput(last_hidden_state=hidden, hidden_states=states if output_hidden_states else None,
                         forward_top=forward[-1], backward_top=backward[-1], state=new_state)
        task_heads = [spec for spec in self.head_specs if spec.kind not in LM_HEAD_KINDS]
        if task_heads:
            softmax = self.softmax.weight if self.softmax is not None else hidden.new_zeros(0)
            self.apply_heads(out, HeadInputs(hidden=hidden, attention_mask=attention_mask, word_embeddings=softmax),
                             task_heads)
        return out

    def lm_logits(self, states: Tensor, head: str = "lm") -> Tensor:
        """Word logits of LM states [..., p] through the softmax shared by both directions (head `head`)."""
        if head not in self.heads:
            raise ConfigError(f"this ELMo model has no LM head {head!r}; it has {', '.join(self.heads) or 'none'}")
        rows = states.reshape(-1, states.shape[-1])
        mask = rows.new_ones(rows.shape[0], dtype=torch.long)
        logits = self.heads[head](HeadInputs(hidden=rows, attention_mask=mask,
                                             word_embeddings=self.word_embeddings.weight))
        return logits.reshape(*states.shape[:-1], -1)
