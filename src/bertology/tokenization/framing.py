"""Framing: where a family puts its special tokens around one text or a pair, the segment id of every part, and
the side it pads on. The tokenizer's post-processor, pretraining instances and embed backbones all build their
layouts from it; nothing else places special tokens.

A family is a `Layout` (registered by name in `FRAMINGS`): which special tokens it has (each optional: cls, also
called bos; sep, also called eos; pad; mask; numbered sentinels), templates for one text and for a pair, the keys
of special_tokens_map.json that name each token, and the padding side. A `Framing` is a layout with the ids of
one tokenizer's tokens (`Tokenizer.framing`).

Built in:

========  ======================================  ==========================================  =============
family    one text                                pair (segment ids)                          padding
========  ======================================  ==========================================  =============
bert      ``[CLS] A [SEP]``                       ``[CLS] A [SEP]`` 0, ``B [SEP]`` 1          right
roberta   ``<s> A </s>``                          ``<s> A </s></s> B </s>``, all 0            right
bart      as roberta                              as roberta                                  right
gpt2      ``A`` (nothing added)                   ``A`` 0, ``B`` 1                            right
t5        ``A </s>``                              ``A </s> B </s>``, all 0                    right
xlnet     ``A <sep> <cls>``                       ``A <sep>`` 0, ``B <sep>`` 1, ``<cls>`` 2   left
deberta   as bert                                 as bert                                     right
========  ======================================  ==========================================  =============

ALBERT, ELECTRA and DistilBERT use bert's; XLM-R uses roberta's. deberta frames as bert does; it is a style of
its own for DeBERTa-v3's SentencePiece vocabulary ([PAD] 0, [CLS] 1, [SEP] 2, [UNK] 3, its normaliser). T5's sentinels ``<extra_id_0>``,
``<extra_id_1>``, ... are found by name (T5 numbers them downward from the end of its vocabulary).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar, Literal

from tokenizers import processors

from bertology.builtins import Registry
from bertology.errors import ConfigError, TokenizerError

ROLES: tuple[str, ...] = ("cls", "sep", "pad", "mask", "unk")
# The roles a template can place around the texts.
PLACED: tuple[str, ...] = ("cls", "sep")
# The parts of a template that are texts: the first and the second of a pair.
TEXTS: tuple[str, ...] = ("A", "B")

Slot = tuple[str, int]  # (a role of PLACED or a text of TEXTS, segment id)


@dataclass(frozen=True)
class Layout:
    """A family's special tokens and templates (see the module docstring).

    ``single`` / ``pair``: the parts in order, each ``(what, segment id)`` with ``what`` a text ("A", "B") or a
    placed role ("cls", "sep"). ``tokens``: the default text of each role, None where the family has no such
    token. ``needs``: roles the vocabulary must hold (every placed role is needed). ``keys``: the
    special_tokens_map.json keys of a role (read in order, all written; default ``<role>_token``).
    ``sentinels``: the pattern of numbered sentinel tokens (``str.format`` with the number), if any.
    ``trims_offsets``: byte-level BPE uses RoBERTa's post-processor, which trims whitespace off the offsets."""

    name: str
    single: tuple[Slot, ...]
    pair: tuple[Slot, ...]
    tokens: Mapping[str, str | None]
    needs: tuple[str, ...] = ()
    keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    sentinels: str | None = None
    padding_side: Literal["right", "left"] = "right"
    trims_offsets: bool = False

    def __post_init__(self) -> None:
        where = f"Layout {self.name!r}"
        for name, template, texts in (("single", self.single, ("A",)), ("pair", self.pair, TEXTS)):
            found = [what for what, _ in template if what in TEXTS]
            if found != list(texts):
                raise ConfigError(f"{where}: the {name} template must hold {' then '.join(texts)} once each, "
                                  f"got {[what for what, _ in template]}")
            for what, segment in template:
                if what not in TEXTS and what not in PLACED:
                    raise ConfigError(f"{where}: unknown part {what!r} in the {name} template; expected one of "
                                      f"{', '.join(TEXTS + PLACED)}")
                if not isinstance(segment, int) or segment < 0:
                    raise ConfigError(f"{where}: segment id of {what!r} must be an integer >= 0, got {segment!r}")
        unknown = sorted(set(self.tokens) - set(ROLES))
        if unknown:
            raise ConfigError(f"{where}: unknown role(s) {', '.join(unknown)}; expected {', '.join(ROLES)}")
        if self.padding_side not in ("right", "left"):
            raise ConfigError(f"{where}: padding_side must be 'right' or 'left', got {self.padding_side!r}")
        placed = {what for what, _ in self.single + self.pair if what in PLACED}
        object.__setattr__(self, "needs", tuple(dict.fromkeys((*sorted(placed), *self.needs))))
        missing = [role for role in self.needs if self.tokens.get(role) is None]
        if missing:
            raise ConfigError(f"{where}: needs {', '.join(missing)} but names no default token for it")

    def token_keys(self, role: str) -> tuple[str, ...]:
        return self.keys.get(role, (f"{role}_token",))

    def frames_like(self, other: Layout) -> bool:
        """Whether texts framed by one are framed the same by the other (bart's framing is roberta's)."""
        return (self.single, self.pair, self.padding_side) == (other.single, other.pair, other.padding_side)

    def describe(self) -> str:
        """The pair template with the default tokens and the padding side, e.g. ``A <sep> B <sep> <cls>, padded on
        the left``."""
        parts = [what if what in TEXTS else str(self.tokens.get(what)) for what, _ in self.pair]
        return f"{' '.join(parts)}, padded on the {self.padding_side}"


def register_framing(layout: Layout) -> Layout:
    """Make ``layout`` available by its name (as a tokenizer's ``style``); a name is registered once."""
    if layout.name in FRAMINGS and FRAMINGS[layout.name] != layout:
        raise ConfigError(f"framing {layout.name!r} is already registered")
    FRAMINGS[layout.name] = layout
    return layout


# name -> Layout; the built-in framings (below) are registered from bertology.builtins on first use.
FRAMINGS: Registry[Layout] = Registry("framings", lambda name, layout: register_framing(layout))


_BOTH_NAMES = {"cls": ("cls_token", "bos_token"), "sep": ("sep_token", "eos_token")}

BERT = Layout(
    "bert",
    single=(("cls", 0), ("A", 0), ("sep", 0)),
    pair=(("cls", 0), ("A", 0), ("sep", 0), ("B", 1), ("sep", 1)),
    tokens={"cls": "[CLS]", "sep": "[SEP]", "pad": "[PAD]", "mask": "[MASK]", "unk": "[UNK]"},
    needs=("pad", "mask", "unk"),
)
ROBERTA = Layout(
    "roberta",
    single=(("cls", 0), ("A", 0), ("sep", 0)),
    pair=(("cls", 0), ("A", 0), ("sep", 0), ("sep", 0), ("B", 0), ("sep", 0)),
    tokens={"cls": "<s>", "sep": "</s>", "pad": "<pad>", "mask": "<mask>", "unk": "<unk>"},
    needs=("pad", "mask", "unk"),
    keys=_BOTH_NAMES,
    trims_offsets=True,
)
BART = dataclasses.replace(ROBERTA, name="bart")
DEBERTA = dataclasses.replace(BERT, name="deberta")
GPT2 = Layout(
    "gpt2",
    single=(("A", 0),),
    pair=(("A", 0), ("B", 1)),
    tokens={"cls": None, "sep": None, "pad": None, "mask": None, "unk": "<|endoftext|>"},
    keys={"unk": ("unk_token", "eos_token", "bos_token")},
)
T5 = Layout(
    "t5",
    single=(("A", 0), ("sep", 0)),
    pair=(("A", 0), ("sep", 0), ("B", 0), ("sep", 0)),
    tokens={"cls": None, "sep": "</s>", "pad": "<pad>", "mask": None, "unk": "<unk>"},
    needs=("pad", "unk"),
    keys={"sep": ("eos_token", "sep_token")},
    sentinels="<extra_id_{}>",
)
XLNET = Layout(
    "xlnet",
    single=(("A", 0), ("sep", 0), ("cls", 2)),
    pair=(("A", 0), ("sep", 0), ("B", 1), ("sep", 1), ("cls", 2)),
    tokens={"cls": "<cls>", "sep": "<sep>", "pad": "<pad>", "mask": "<mask>", "unk": "<unk>"},
    needs=("pad", "mask", "unk"),
    padding_side="left",
)


@dataclass(frozen=True)
class Piece:
    """One part of an expanded template: special ``ids`` (empty for a text), or ``text`` (0: A, 1: B)."""

    ids: tuple[int, ...]
    text: int | None
    segment: int


@dataclass(frozen=True)
class Framed:
    """A framed text or pair: ``ids``, ``type_ids`` (segment ids), ``spans`` (``[start, stop)`` of each text in
    ``ids``) and ``summary`` (the position of the cls token, None without one)."""

    ids: list[int]
    type_ids: list[int]
    spans: tuple[tuple[int, int], ...]
    summary: int | None


@dataclass(frozen=True)
class Framing:
    """A family's layout (``style``, a name in `FRAMINGS`) with the ids of one tokenizer's special tokens; a
    token the tokenizer lacks is None. ``source`` names the tokenizer's file in errors."""

    cls_id: int | None
    sep_id: int | None
    pad_id: int | None
    mask_id: int | None
    style: str = "bert"
    sentinels: tuple[int, ...] = ()
    source: str | None = field(default=None, compare=False)

    _STYLES: ClassVar[tuple[str, ...] | None] = None  # a subclass may allow fewer styles

    def __post_init__(self) -> None:
        where = type(self).__name__
        allowed = self._STYLES or tuple(FRAMINGS)
        if not isinstance(self.style, str) or self.style not in allowed:
            raise ConfigError(f"{where}.style: expected one of {', '.join(map(repr, allowed))}, got {self.style!r}")
        for key in ("cls_id", "sep_id", "pad_id", "mask_id"):
            value = getattr(self, key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{where}.{key}: expected an integer or None, got {value!r}")
            if value < 0:
                raise ConfigError(f"{where}.{key}: must be >= 0, got {value}")
        sentinels = tuple(self.sentinels)
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in sentinels):
            raise ConfigError(f"{where}.sentinels: expected integers >= 0, got {list(sentinels)}")
        object.__setattr__(self, "sentinels", sentinels)
        for role in self.layout.needs:
            if role in PLACED and getattr(self, f"{role}_id") is None:
                raise ConfigError(f"{where}.{role}_id: the {self.style} framing places a {role} token, got None")

    # ------------------------------------------------------------------ what the family has
    @property
    def layout(self) -> Layout:
        return FRAMINGS[self.style]

    @property
    def padding_side(self) -> str:
        return self.layout.padding_side

    @property
    def ids(self) -> frozenset[int]:
        """The ids of the framing's special tokens (cls, sep, pad, mask, sentinels) the tokenizer has."""
        present = (self.cls_id, self.sep_id, self.pad_id, self.mask_id, *self.sentinels)
        return frozenset(int(i) for i in present if i is not None)

    @property
    def fill_id(self) -> int:
        """The id padded positions get: the pad token, else 0 (padding is masked out, any id will do)."""
        return 0 if self.pad_id is None else self.pad_id

    @property
    def document_break(self) -> tuple[int, ...]:
        """What marks a document boundary inside a packed sequence: the separator, nothing without one."""
        return () if self.sep_id is None else (self.sep_id,)

    def overhead(self, pair: bool = False) -> int:
        """Special tokens around one text (``pair=False``) or a pair."""
        return sum(len(p.ids) for p in self.pieces(pair))

    @property
    def pair_overhead(self) -> int:
        return self.overhead(True)

    def missing(self, role: str, purpose: str) -> TokenizerError:
        """The error for a feature (``purpose``) that needs a ``role`` token this tokenizer lacks."""
        where = self.source or "the tokenizer"
        return TokenizerError(f"{where}: no {role} token ({self.style} framing); {purpose} needs one")

    def require(self, role: str, purpose: str) -> int:
        """The id of ``role``'s token, or the error `missing` describes."""
        value = getattr(self, f"{role}_id")
        if value is None:
            raise self.missing(role, purpose)
        return value

    # ------------------------------------------------------------------ layouts
    def pieces(self, pair: bool = False) -> tuple[Piece, ...]:
        """The expanded template: runs of special ids and the texts, each with its segment id."""
        return self._pieces[bool(pair)]

    @cached_property
    def _pieces(self) -> tuple[tuple[Piece, ...], tuple[Piece, ...]]:
        out = []
        for template in (self.layout.single, self.layout.pair):
            pieces: list[Piece] = []
            for what, segment in template:
                if what in TEXTS:
                    pieces.append(Piece((), TEXTS.index(what), segment))
                elif pieces and pieces[-1].text is None and pieces[-1].segment == segment:
                    pieces[-1] = Piece((*pieces[-1].ids, getattr(self, f"{what}_id")), None, segment)
                else:
                    pieces.append(Piece((getattr(self, f"{what}_id"),), None, segment))
            out.append(tuple(pieces))
        return out[0], out[1]

    def frame(self, a: Sequence[int], b: Sequence[int] | None = None) -> Framed:
        """Token ids of one text (``a``) or a pair framed with the family's specials."""
        ids: list[int] = []
        types: list[int] = []
        spans: list[tuple[int, int]] = []
        summary = None
        for piece in self.pieces(b is not None):
            if piece.text is None:
                if self.cls_id is not None and self.cls_id in piece.ids and summary is None:
                    summary = len(ids) + piece.ids.index(self.cls_id)
                part: Sequence[int] = piece.ids
            else:
                part = a if piece.text == 0 else b
                spans.append((len(ids), len(ids) + len(part)))
            ids.extend(int(i) for i in part)
            types.extend([piece.segment] * len(part))
        return Framed(ids, types, tuple(spans), summary)

    def post_processor(self, tokens: Mapping[int, str], kind: str, *, trim_offsets: bool,
                       add_prefix_space: bool) -> processors.PostProcessor:
        """The ``tokenizers`` post-processor that frames encodings this way (``tokens``: id -> text of each
        special token). Byte-level BPE in a family that trims offsets gets RoBERTa's processor, as transformers
        builds it; everything else a template."""
        if kind == "bpe" and self.layout.trims_offsets:
            return processors.RobertaProcessing((tokens[self.sep_id], self.sep_id), (tokens[self.cls_id], self.cls_id),
                                                trim_offsets, add_prefix_space)
        templates = []
        for pieces in (self.pieces(False), self.pieces(True)):
            parts = []
            for piece in pieces:
                if piece.text is None:
                    parts.extend(f"{tokens[i]}:{piece.segment}" for i in piece.ids)
                else:
                    parts.append(f"${TEXTS[piece.text]}:{piece.segment}")
            templates.append(parts)
        used = sorted({i for piece in self.pieces(True) + self.pieces(False) for i in piece.ids})
        return processors.TemplateProcessing(single=templates[0], pair=templates[1],
                                             special_tokens=[(tokens[i], i) for i in used])
