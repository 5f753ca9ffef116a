"""Rule-based English sentence splitter for raw running text.

A boundary is considered only where terminal punctuation (``.`` ``!`` ``?`` ``...`` ``…``), optionally followed by
closing quotes or brackets, is followed by whitespace. It is accepted when the next word (after any opening quotes or
brackets) starts with an upper-case letter or a digit, except after:

- titles that precede a name (``Mr.`` ``Dr.`` ``St.`` ...) and Latin abbreviations that introduce more text
  (``e.g.`` ``i.e.`` ``cf.`` ``vs.``), which never end a sentence here;
- single upper-case initials (``J. R. R. Tolkien``); the pronoun ``I`` is not an initial;
- abbreviations that precede a number (``No. 5``, ``p. 12``, ``Fig. 3``) when the next word is a number;
- dotted acronyms (``U.S.`` ``a.m.`` ``Ph.D.``), which end a sentence only before a common sentence-initial word
  (``The``, ``He``, ``It`` ...), because ``U.S. Army`` is far more common than a sentence ending in an acronym.

Decimals (``3.14``) and dotted names (``example.com``) never contain whitespace after the period, so they are never
candidates. Whitespace (including line breaks) inside the text is collapsed to single spaces.
"""

from __future__ import annotations

import re

__all__ = ["split_sentences"]

_OPENERS = "\"'“‘«([{_*"
_CLOSERS = "\"'”’»)]}_*"

# A candidate end: a terminal mark, any closing quotes/brackets, then the single space left after collapsing.
_CANDIDATE = re.compile(r"(?:[.!?…])[" + re.escape(_CLOSERS) + r"]*(?= )")
_WHITESPACE = re.compile(r"\s+")
_DOTTED_ACRONYM = re.compile(r"(?:[A-Za-z]{1,2}\.)+[A-Za-z]{1,2}")

# Abbreviations (lower-cased, without the final period) after which a sentence does not end.
_NEVER_FINAL = frozenset(
    """mr mrs ms messrs mme mlle dr prof rev revd fr gen col capt lt sgt cpl maj adm cmdr gov sen rep hon pres
    supt insp st mt ste e.g i.e cf viz vs approx esp""".split()
)
# Abbreviations that end no sentence when a number follows them.
_BEFORE_NUMBER = frozenset("no nos vol vols fig figs p pp ch chap sec sect art eq op pl ed".split())
# Words that commonly begin a sentence: after a dotted acronym, only these make a boundary.
_SENTENCE_STARTERS = frozenset(
    """the a an it its he she they we i you this that these those there then but and so yet however in on at
    after before when while if as his her their our my one many some most all no not what who why how where""".split()
)


def _is_boundary(word: str, following: str) -> bool:
    """Whether a sentence ends after ``word`` (which ends in a terminal mark) when ``following`` comes next."""
    nxt = following.lstrip(_OPENERS) or following
    if not (nxt[0].isupper() or nxt[0].isdigit()):
        return False
    core = word.rstrip(_CLOSERS)
    if core.endswith(("!", "?", "..", "…")):
        return True
    stem = core[:-1].lstrip(_OPENERS)
    if not stem:
        return True
    lowered = stem.lower()
    if lowered in _NEVER_FINAL:
        return False
    if lowered in _BEFORE_NUMBER and nxt[0].isdigit():
        return False
    if len(stem) == 1 and stem.isupper() and stem != "I":
        return False
    if _DOTTED_ACRONYM.fullmatch(stem):
        return nxt.lower().rstrip(",;:") in _SENTENCE_STARTERS
    return True


def split_sentences(text: str) -> list[str]:
    """Split one paragraph of running text into sentences (see the module docstring for the rules)."""
    text = _WHITESPACE.sub(" ", text).strip()
    if not text:
        return []
    sentences: list[str] = []
    start = 0
    for match in _CANDIDATE.finditer(text):
        end = match.end()
        word_start = text.rfind(" ", 0, end) + 1
        next_end = text.find(" ", end + 1)
        following = text[end + 1 : next_end if next_end >= 0 else len(text)]
        if _is_boundary(text[word_start:end], following):
            sentences.append(text[start:end])
            start = end + 1
    sentences.append(text[start:])
    return sentences
