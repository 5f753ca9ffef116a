"""Real English text that an install brings along: the test data shipped inside the ``gensim`` wheel.

gensim (LGPL-2.1) ships, in ``gensim/test/test_data``, two texts that make a small but genuine pretraining corpus:

- ``news``: the Lee corpus (Lee, Pincombe & Welsh, 2005), Australian Broadcasting Corporation news articles used
  as a document-similarity benchmark: ``lee_background.cor`` (300 articles) and ``lee.cor`` (50 more), one article
  per line, about 64k words. gensim redistributes them with its tests; no separate licence is stated.
- ``wikipedia``: a shortened 2016 English Wikipedia dump (``enwiki-latest-pages-articles1.xml-...-shortened.bz2``,
  about 100 articles, e.g. Anarchism, Autism, Albedo, Aristotle) in raw MediaWiki markup; Wikipedia text is
  CC BY-SA 3.0 / GFDL. :func:`wikitext_to_text` strips the markup to plain paragraphs (about 0.5M words).

The files are read where pip put them, found with :func:`importlib.util.find_spec` and never imported: gensim's
own dependencies (scipy, smart_open) are not needed, so ``pip install --no-deps gensim`` is enough.
:func:`write_builtin_corpus` writes the texts as corpus files in the ``"bert"`` format (one sentence per line, a
blank line between documents), which ``bertology tokenizer train`` and ``bertology data prepare`` read as they are.
"""

from __future__ import annotations

import bz2
import html
import importlib.util
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bertology.text.corpus import read_lines
from bertology.text.sentences import split_sentences
from bertology.errors import DataError
from bertology.io import atomic_write

__all__ = [
    "BUILTIN_TEXTS",
    "GENSIM_INSTALL",
    "BuiltinCorpusFile",
    "WikiPage",
    "builtin_documents",
    "gensim_data_dir",
    "read_news",
    "read_wikipedia_dump",
    "wikitext_to_text",
    "write_builtin_corpus",
]

GENSIM_INSTALL = "pip install --no-deps gensim"
NEWS_FILES = ("lee_background.cor", "lee.cor")
NEWS_ENCODING = "latin-1"  # lee.cor has a Latin-1 pound sign; lee_background.cor is ASCII
WIKIPEDIA_FILE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"

# name -> the files (in gensim's test data) it is read from
BUILTIN_TEXTS: dict[str, tuple[str, ...]] = {"news": NEWS_FILES, "wikipedia": (WIKIPEDIA_FILE,)}


def gensim_data_dir() -> Path:
    """``gensim/test/test_data`` of the installed gensim package (located, not imported)."""
    spec = importlib.util.find_spec("gensim")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        directory = Path(location) / "test" / "test_data"
        if directory.is_dir():
            return directory
    if not locations:
        raise DataError(f"the bundled corpus comes with the gensim package, which is not installed: "
                        f"run `{GENSIM_INSTALL}` (its test data is all that is used; no other dependency is needed)")
    raise DataError(f"gensim is installed at {locations[0]} but without its test data (test/test_data): "
                    f"reinstall it with `pip install --force-reinstall {GENSIM_INSTALL.split(' ', 2)[2]}`")


def _text_file(directory: Path, name: str) -> Path:
    path = directory / name
    if not path.is_file():
        raise DataError(f"{path}: missing from gensim's test data; reinstall gensim "
                        f"(`pip install --force-reinstall {GENSIM_INSTALL.split(' ', 2)[2]}`)")
    return path


# ---------------------------------------------------------------------------------------------------------- news
def read_news(path: str | Path, encoding: str = NEWS_ENCODING) -> Iterator[str]:
    """The articles of a Lee corpus file: one article per line (blank lines skipped)."""
    for _, line in read_lines(Path(path), encoding):
        text = " ".join(line.split())
        if text:
            yield text


# ---------------------------------------------------------------------------------------------------------- wikipedia
@dataclass(frozen=True)
class WikiPage:
    """An article of a MediaWiki XML dump: its title and raw wikitext."""

    title: str
    wikitext: str


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]  # "{http://www.mediawiki.org/xml/export-0.10/}page" -> "page"


def read_wikipedia_dump(path: str | Path) -> Iterator[WikiPage]:
    """Articles (namespace 0, redirects skipped) of a MediaWiki XML dump, ``.bz2``-compressed or plain, streamed."""
    path = Path(path)
    opener = bz2.open if path.suffix == ".bz2" else open
    try:
        with opener(path, "rb") as handle:
            title, namespace, text, redirect = "", "0", "", False
            for event, element in ET.iterparse(handle, events=("end",)):
                tag = _local(element.tag)
                if tag == "title":
                    title = element.text or ""
                elif tag == "ns":
                    namespace = (element.text or "").strip()
                elif tag == "redirect":
                    redirect = True
                elif tag == "text":
                    text = element.text or ""
                elif tag == "page":
                    if namespace == "0" and not redirect and not text.lstrip().upper().startswith("#REDIRECT"):
                        yield WikiPage(title, text)
                    title, namespace, text, redirect = "", "0", "", False
                    element.clear()  # keep memory flat on a big dump
    except ET.ParseError as error:
        line, column = error.position
        raise DataError(f"{path}: line {line} column {column + 1}: invalid XML ({error.msg})") from None
    except (OSError, EOFError) as error:
        raise DataError(f"{path}: cannot read the dump: {error}") from None


# Sections after which an article holds only citations, link lists and navigation.
_END_SECTION_NAMES = {"references", "notes", "footnotes", "citations", "sources", "bibliography", "further reading",
                      "external links", "see also", "works cited", "notes and references", "references and notes",
                      "primary sources", "secondary sources", "general references"}
_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.DOTALL)
# Elements whose content is not prose: dropped whole (self-closing <ref .../> too).
_DROPPED_ELEMENTS = re.compile(
    r"<(ref|math|gallery|timeline|table|source|syntaxhighlight|score|imagemap|pre|code|chem|hiero|graph|mapframe)"
    r"\b[^>]*?(?:/>|>.*?</\1\s*>)", re.DOTALL | re.IGNORECASE)
_UNCLOSED_REF = re.compile(r"<ref\b[^>]*>", re.IGNORECASE)
_TAG = re.compile(r"</?[a-zA-Z][^>]*?/?>")
_TEMPLATE = re.compile(r"\{\{[^{}]*\}\}")
_PARAMETER = re.compile(r"\{\{\{[^{}]*\}\}\}")
_LINK = re.compile(r"\[\[([^\[\]]*)\]\]")
# Namespaced links that are not prose: files, categories, interlanguage and interwiki links.
_NON_PROSE_LINK = re.compile(r"^\s*:?\s*(file|image|media|category|wikipedia|wp|wikt|wiktionary|template|help|portal|"
                             r"special|commons|s|q|n|b|v|[a-z]{2,3}(-[a-z]+)?|simple)\s*:", re.IGNORECASE)
_FILE_LINK = re.compile(r"\[\[\s*:?\s*(?:file|image|media)\s*:", re.IGNORECASE)
_STRAY_BRACKETS = re.compile(r"\[\[|\]\]")
_EXTERNAL_LINK = re.compile(r"\[(?:https?:|ftp:)?//[^\s\]]+(?:\s+([^\]]*))?\]")
_BARE_URL = re.compile(r"https?://\S+")
_EMPHASIS = re.compile(r"'{2,}")
_MAGIC = re.compile(r"__[A-Z]+__")
_HEADING = re.compile(r"^(=+)\s*(.*?)\s*\1\s*$")
_EMPTY_BRACKETS = re.compile(r"\(\s*[,;:]?\s*\)|\[\s*\]")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?)])")
_SPACE_AFTER_OPEN = re.compile(r"([(])\s+")
_REPEATED_PUNCT = re.compile(r"([,;])(\s*[,;])+")
_SPACES = re.compile(r"[ \t\u00a0\u2009\u200b]+")
_MIN_PARAGRAPH_WORDS = 6


def _remove_nested(text: str, pattern: re.Pattern, replacement: str | Callable[[re.Match], str] = "") -> str:
    """Remove (innermost first) constructs like templates that nest in themselves."""
    while True:
        text, count = pattern.subn(replacement, text)
        if count == 0:
            return text


def _template_text(match: re.Match) -> str:
    """What a template shows in running text: a quantity for ``{{convert|5|km|mi}}`` ("5 km"), the text of
    ``{{lang|fr|...}}`` and ``{{nowrap|...}}``; nothing for every other template (infoboxes, citations, ...)."""
    name, *arguments = match.group(0)[2:-2].split("|")
    name = name.strip().lower()
    positional = [a.strip() for a in arguments if "=" not in a]
    if name in ("convert", "cvt") and len(positional) >= 2:
        if len(positional) >= 4 and positional[1] in ("to", "-", "–", "and", "or"):
            return f"{positional[0]} {positional[1]} {positional[2]} {positional[3]}"
        return f"{positional[0]} {positional[1]}"
    if name == "lang" and len(positional) >= 2:
        return positional[1]
    if name.startswith("lang-") and positional:
        return positional[0]
    if name in ("nowrap", "nobr") and positional:
        return positional[0]
    return ""


def _remove_tables(text: str) -> str:
    """Drop ``{| ... |}`` tables (nested ones too), which hold infoboxes and data, not running prose."""
    kept, depth = [], 0
    for line in text.split("\n"):
        stripped = line.lstrip(" :")
        if stripped.startswith("{|"):
            depth += 1
        if depth == 0:
            kept.append(line)
        elif stripped.startswith("|}"):
            depth -= 1
    return "\n".join(kept)


def _link_text(match: re.Match) -> str:
    inner = match.group(1)
    target, _, label = inner.partition("|")
    if _NON_PROSE_LINK.match(target):
        return ""
    if label:
        return label.rsplit("|", 1)[-1]  # [[a|b]] -> b
    return target.lstrip(":").split("#", 1)[0] if not target.startswith("#") else target[1:]


def _clean_line(line: str) -> str:
    line = _EXTERNAL_LINK.sub(lambda m: m.group(1) or "", line)
    line = _BARE_URL.sub("", line)
    line = _EMPHASIS.sub("", line)
    line = html.unescape(line)
    line = _SPACES.sub(" ", line)
    line = _EMPTY_BRACKETS.sub("", line)
    line = _REPEATED_PUNCT.sub(r"\1", line)
    line = _SPACE_BEFORE_PUNCT.sub(r"\1", line)
    line = _SPACE_AFTER_OPEN.sub(r"\1", line)
    return _SPACES.sub(" ", line).strip()


def wikitext_to_text(wikitext: str) -> str:
    """Plain prose paragraphs (separated by blank lines) of an article's MediaWiki markup.

    Dropped: comments, references and other non-prose elements (``<ref>``, ``<math>``, ``<gallery>`` ...),
    templates ``{{...}}`` (nested ones too: infoboxes, citations, navigation boxes), tables ``{| ... |}``,
    file/category/interlanguage links, headings, list and indented lines, and everything from a "References" /
    "See also" / "External links" section on. Kept as text: link labels (``[[a|b]]`` -> ``b``, ``[[a]]`` ->
    ``a``), external link labels, emphasised words, HTML entities decoded. Paragraphs shorter than a few words
    (leftovers of removed markup) are dropped.
    """
    text = wikitext.replace("\r\n", "\n")
    text = html.unescape(text) if "&lt;" in text else text  # markup that was escaped twice in the dump
    text = _COMMENT.sub("", text)
    text = _DROPPED_ELEMENTS.sub("", text)
    text = _UNCLOSED_REF.sub("", text)
    text = _remove_tables(text)
    text = _remove_nested(text, _PARAMETER)
    text = _remove_nested(text, _TEMPLATE, _template_text)
    text = _remove_file_links(text)
    text = _remove_links(text)
    text = _STRAY_BRACKETS.sub("", text)  # halves of links the editors left unclosed
    text = _TAG.sub("", text)
    text = _MAGIC.sub("", text)
    paragraphs = []
    for line in text.split("\n"):
        heading = _HEADING.match(line.strip())
        if heading:
            if heading.group(2).strip().lower() in _END_SECTION_NAMES:
                break
            continue
        stripped = line.strip()
        if not stripped or stripped[0] in "*#:;|!{}" or stripped.startswith("----"):
            continue
        cleaned = _clean_line(stripped)
        if "{{" in cleaned or "}}" in cleaned or len(cleaned.split()) < _MIN_PARAGRAPH_WORDS:
            continue  # an unbalanced template left markup behind, or a fragment
        paragraphs.append(cleaned)
    return "\n\n".join(paragraphs)


def _remove_file_links(text: str) -> str:
    """Drop ``[[File:...]]`` / ``[[Image:...]]`` whole, captions included, matching nested brackets by depth
    (captions hold links, and sometimes a stray bracket that defeats the innermost-first rule)."""
    out, position = [], 0
    while (start := _FILE_LINK.search(text, position)) is not None:
        out.append(text[position:start.start()])
        depth, index = 0, start.start()
        while index < len(text):
            if text.startswith("[[", index):
                depth, index = depth + 1, index + 2
            elif text.startswith("]]", index):
                depth, index = depth - 1, index + 2
                if depth == 0:
                    break
            elif text[index] == "\n" and text.startswith("\n", index + 1):
                break  # an unclosed file link never runs past its paragraph
            else:
                index += 1
        position = index
    out.append(text[position:])
    return "".join(out)


def _remove_links(text: str) -> str:
    """Replace wiki links by their visible text, innermost first (links nest inside file captions)."""
    while True:
        text, count = _LINK.subn(_link_text, text)
        if count == 0:
            return text


# ---------------------------------------------------------------------------------------------------------- corpus
def builtin_documents(name: str, data_dir: str | Path | None = None) -> Iterator[str]:
    """The documents of bundled text ``name`` (``"news"`` or ``"wikipedia"``) as plain text; paragraphs are
    separated by blank lines."""
    if name not in BUILTIN_TEXTS:
        raise DataError(f"unknown bundled text {name!r}; expected one of {', '.join(BUILTIN_TEXTS)}")
    directory = Path(data_dir) if data_dir is not None else gensim_data_dir()
    paths = [_text_file(directory, file) for file in BUILTIN_TEXTS[name]]  # all checked before reading any
    if name == "news":
        for path in paths:
            yield from read_news(path)
        return
    for page in read_wikipedia_dump(paths[0]):
        text = wikitext_to_text(page.wikitext)
        if text:
            yield text


@dataclass(frozen=True)
class BuiltinCorpusFile:
    """One written corpus file: its path, the bundled text it holds, and how much."""

    name: str
    path: Path
    documents: int
    words: int


def write_builtin_corpus(directory: str | Path, names: Sequence[str] = ("news", "wikipedia"),
                         max_documents: int | None = None, data_dir: str | Path | None = None
                         ) -> list[BuiltinCorpusFile]:
    """Write each bundled text in ``names`` to ``<directory>/<name>.txt`` in the ``"bert"`` corpus format (one
    sentence per line, a blank line after each document), so the files serve as they are for ``bertology tokenizer
    train`` and ``bertology data prepare``. ``max_documents`` keeps only the first documents of each text."""
    if not names:
        raise DataError("no bundled text named; expected some of " + ", ".join(BUILTIN_TEXTS))
    for name in names:
        if name not in BUILTIN_TEXTS:
            raise DataError(f"unknown bundled text {name!r}; expected one of {', '.join(BUILTIN_TEXTS)}")
    if max_documents is not None and max_documents < 1:
        raise DataError(f"max_documents must be >= 1, got {max_documents}")
    source = Path(data_dir) if data_dir is not None else gensim_data_dir()
    written = []
    for name in names:
        path = Path(directory) / f"{name}.txt"
        documents = words = 0
        with atomic_write(path, "w", encoding="utf-8") as handle:
            for text in _first(builtin_documents(name, source), max_documents):
                sentences = [s for paragraph in text.split("\n\n") for s in split_sentences(paragraph)]
                if not sentences:
                    continue
                handle.write("\n".join(sentences) + "\n\n")
                documents += 1
                words += sum(len(sentence.split()) for sentence in sentences)
        if documents == 0:
            raise DataError(f"{source}: the bundled {name} text has no documents")
        written.append(BuiltinCorpusFile(name, path, documents, words))
    return written


def _first(items: Iterable[str], count: int | None) -> Iterator[str]:
    for index, item in enumerate(items):
        if count is not None and index >= count:
            return
        yield item
