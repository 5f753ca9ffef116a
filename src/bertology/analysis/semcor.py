"""SemCor in its own tag format (the 3.0 distribution's `brown*/tagfiles/br-*`), one token a line:

    <s snum=1>
    <wf cmd=done rdf=group pos=NNP lemma=group wnsn=1 lexsn=1:03:00:: pn=group>Fulton_County_Grand_Jury</wf>
    <wf cmd=done pos=NN lemma=year wnsn=2;1 lexsn=1:28:02::;1:28:01::>year</wf>
    <punc>.</punc>
    </s>

A tagged token's sense keys are `lemma%lexsn` for each `;`-separated lexsn (paired with the wnsn list); a key
whose wnsn is 0 lost its sense in the WordNet 1.6 -> 3.0 mapping and is skipped and counted. A satellite's
head word loses SemCor's adjective marker ("preceding(a)" -> "preceding"), as WordNet spells its keys. Multi-word
expressions are one token whose text joins the words with `_`; the sentence text spells them with spaces.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bertology.errors import DataError

_WF = re.compile(r"^<wf((?: [A-Za-z_]+=[^ >]*)*)>(.*)</wf>$")
_PUNC = re.compile(r"^<punc>(.*)</punc>$")
_ATTRIBUTE = re.compile(r" ([A-Za-z_]+)=([^ >]*)")
_STRUCTURE = re.compile(r"^</?(?:contextfile|context|p|s)(?: [A-Za-z_]+=[^ >]*)*>$")
# SemCor writes a satellite's head word with its adjective marker ("preceding(a)"); WordNet's keys have none.
_HEAD_MARKER = re.compile(r"\((?:a|p|ip)\)(?=:\d+$)")


class SemcorError(DataError):
    """A SemCor tag file cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class SemcorToken:
    """One token: `text` as it stands in the sentence (multi-word expressions with spaces), the character span of
    that text in the sentence, and the sense keys it is tagged with (empty for untagged tokens)."""

    text: str
    start: int
    end: int
    pos: str
    lemma: str | None
    keys: tuple[str, ...]


@dataclass(frozen=True)
class SemcorSentence:
    file: str
    line: int  # of the <s> tag
    snum: str
    text: str  # the tokens joined by single spaces
    tokens: tuple[SemcorToken, ...]


@dataclass
class Semcor:
    sentences: list[SemcorSentence]
    counts: Counter = field(default_factory=Counter)  # files, sentences, tokens, tagged tokens, keys, skipped ...


def semcor_files(directory: str | os.PathLike) -> list[Path]:
    """The tag files under `directory`: files inside folders named `tagfiles`, or the directory's own `br-*`
    files when it is such a folder."""
    directory = Path(directory)
    if not directory.is_dir():
        raise SemcorError(f"{directory}: not a directory (expected SemCor's root or a tagfiles folder)")
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.parent.name == "tagfiles")
    if not files:
        files = sorted(p for p in directory.iterdir() if p.is_file() and p.name.startswith("br-"))
    if not files:
        raise SemcorError(f"{directory}: no SemCor tag files (brown*/tagfiles/br-*) found")
    return files


def read_semcor(directory: str | os.PathLike, max_sentences: int | None = None) -> Semcor:
    """Every sentence of the tag files under `directory` (see `semcor_files`), or the first `max_sentences`."""
    corpus = Semcor([])
    for path in semcor_files(directory):
        corpus.counts["files"] += 1
        read_tagfile(path, corpus)
        if max_sentences is not None and len(corpus.sentences) >= max_sentences:
            del corpus.sentences[max_sentences:]
            break
    corpus.counts["sentences"] = len(corpus.sentences)
    return corpus


def read_tagfile(path: str | os.PathLike, corpus: Semcor) -> None:
    """Append the sentences of one tag file to `corpus` and add to its counts."""
    path = Path(path)
    counts = corpus.counts
    open_sentence: tuple[int, str] | None = None
    tokens: list[SemcorToken] = []
    length = 0
    try:
        handle = open(path, "rb")
    except OSError as error:
        raise SemcorError(f"{path}: cannot be read ({error.strerror})") from None
    offset = 0
    with handle:
        for number, raw_bytes in enumerate(handle, 1):
            try:
                raw = raw_bytes.decode("utf-8")
            except UnicodeDecodeError as error:
                raise SemcorError(f"{path}, line {number}: cannot decode as utf-8 at byte offset "
                                  f"{offset + error.start} (byte 0x{raw_bytes[error.start]:02x})") from None
            offset += len(raw_bytes)
            line = raw.strip()
            if not line:
                continue
            where = f"{path}, line {number}"
            wf, punc = _WF.match(line), _PUNC.match(line)
            if wf or punc:
                if open_sentence is None:
                    raise SemcorError(f"{where}: a token outside any <s> sentence: {line[:80]!r}")
                text = (wf.group(2) if wf else punc.group(1)).replace("_", " ")
                if not text.strip():
                    raise SemcorError(f"{where}: an empty token: {line[:80]!r}")
                start = length + (1 if tokens else 0)
                attributes = dict(_ATTRIBUTE.findall(wf.group(1))) if wf else {}
                keys = _keys(attributes, where, line, counts) if wf else ()
                tokens.append(SemcorToken(text, start, start + len(text), attributes.get("pos", "PUNC"),
                                          attributes.get("lemma"), keys))
                length = start + len(text)
                counts["tokens"] += 1
                counts["tagged tokens"] += bool(keys)
                counts["keys"] += len(keys)
            elif line.startswith("<s ") and _STRUCTURE.match(line):
                if open_sentence is not None:
                    raise SemcorError(f"{where}: <s> inside the sentence opened at line {open_sentence[0]}")
                snum = dict(_ATTRIBUTE.findall(line[2:-1])).get("snum", "")
                open_sentence, tokens, length = (number, snum), [], 0
            elif line == "</s>":
                if open_sentence is None:
                    raise SemcorError(f"{where}: </s> without an open <s>")
                if tokens:
                    corpus.sentences.append(SemcorSentence(str(path), open_sentence[0], open_sentence[1],
                                                           " ".join(t.text for t in tokens), tuple(tokens)))
                else:
                    counts["empty sentences"] += 1
                open_sentence = None
            elif _STRUCTURE.match(line):
                continue
            else:
                raise SemcorError(f"{where}: not a SemCor tag line: {line[:80]!r}")
    if open_sentence is not None:
        raise SemcorError(f"{path}, line {open_sentence[0]}: <s> is never closed")


def _keys(attributes: dict[str, str], where: str, line: str, counts: Counter) -> tuple[str, ...]:
    if "lexsn" not in attributes and "wnsn" not in attributes:
        return ()
    lemma = attributes.get("lemma")
    lexsns = attributes.get("lexsn", "").split(";")
    wnsns = attributes.get("wnsn", "").split(";")
    if not lemma or not all(lexsns) or len(lexsns) != len(wnsns) or not all(w.isdigit() for w in wnsns):
        raise SemcorError(f"{where}: a tagged token needs lemma=, and wnsn= and lexsn= lists of equal length: "
                          f"{line[:100]!r}")
    keys = []
    for wnsn, lexsn in zip(wnsns, lexsns):
        if wnsn == "0":
            counts["keys skipped (wnsn=0)"] += 1
            continue
        bare = _HEAD_MARKER.sub("", lexsn)
        counts["keys with a head-word marker removed"] += bare != lexsn
        key = f"{lemma.lower()}%{bare}"
        if key not in keys:
            keys.append(key)
    return tuple(keys)
