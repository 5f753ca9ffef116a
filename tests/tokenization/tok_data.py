"""Texts and settings shared by the tokenization tests (a plainly named module: several test folders have a
conftest.py, so importing names from "conftest" would be ambiguous)."""

from __future__ import annotations

from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"

# A small corpus with some variety: case, punctuation, accents, digits, CJK, emoji, contractions.
CORPUS_LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "A bank can hold money; a river bank holds water.",
    "She deposited the cheque at the bank before noon.",
    "He hit the ball with a bat, and the bat flew out of the cave.",
    "I record the record, then play it again and again.",
    "Please turn your homework in by Friday, 3 March 2023.",
    "Café naïve résumé — Zürich is lovely in the spring.",
    "東京 and 北京 are large cities; 大阪 is too.",
    "It's a well-known fact that don't and can't are contractions.",
    "Emoji like 😀 and 🎉 appear in informal text!",
    "Numbers: 12345, 3.14159, and 1,000,000 dollars.",
    "The movie was surprisingly good, though the ending dragged.",
    "Tokenizers split words into subword units such as ##ing or ▁the.",
    "New York, Los Angeles and San Francisco are in the United States.",
    "Reading, writing and arithmetic were taught in the school house.",
    "Whether the weather is cold or hot, we shall weather the weather.",
    "He said \"hello\" and she said 'goodbye' -- then they left.",
    "Transformers use attention; attention is all you need, they said.",
    "The committee's recommendation was accepted unanimously yesterday.",
    "Mr. Smith went to Washington on the 4th of July.",
]
CORPUS = "\n".join(CORPUS_LINES * 5) + "\n"

# Texts for comparing with transformers: easy, cased, accented, CJK, emoji, odd whitespace, specials in the text.
TEXTS = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    "HELLO World, it's a TEST of Casing.",
    "Café naïve résumé — Zürich 東京 😀 co\u200boperate",
    "  leading and trailing spaces   ",
    "tabs\tand\nnewlines\r\nmixed",
    "unbelievably unrecognisable antidisestablishmentarianism",
    "A sentence with [MASK] and <mask> and [SEP] inside.",
    "Numbers 3.14159 and 1,000,000 and 2023-03-04.",
    "",
    "   ",
    "x",
    "control\x00chars\x07here\x1b and zero\u200dwidth\ufeffjoiners",
]
PAIRS = [
    ("Who went to Washington?", "Mr. Smith went to Washington on the 4th of July."),
    ("short", "a much longer second text that goes on and on"),
    ("", "empty first"),
    ("empty second", ""),
    ("Café", "東京 😀"),
]

# (kind, style) -> vocabulary size for the trained tokenizers.
KINDS = {("wordpiece", "bert"): 400, ("bpe", "roberta"): 500, ("unigram", "roberta"): 300, ("unigram", "bert"): 300}
