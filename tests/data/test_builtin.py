"""The bundled corpus: locating gensim's test data, reading the Lee news and a Wikipedia dump, stripping markup."""

from __future__ import annotations

import bz2
import importlib.util
import re
from pathlib import Path

import pytest

from bertology.data import builtin, read_documents
from bertology.data.builtin import (
    GENSIM_INSTALL,
    NEWS_FILES,
    WIKIPEDIA_FILE,
    builtin_documents,
    gensim_data_dir,
    read_news,
    read_wikipedia_dump,
    wikitext_to_text,
    write_builtin_corpus,
)
from bertology.errors import DataError

ARTICLE = """{{Infobox country
| name = Example {{nowrap|Land}}
| capital = [[Exampleton]]
}}
'''Example Land''' is a [[country (nation)|country]] in the [[North Sea]], about {{convert|40|km|mi}} from the coast.<ref name="a">{{cite web|url=http://x.org|title=Source}}</ref> Its people speak [[Examplish]].<ref>Plain citation.</ref>
<!-- an editor's comment that is not prose -->
[[File:Flag.png|thumb|The [[flag]] of Example Land, adopted in 1900]]
== History ==
The island was settled in 800 AD by farmers from the mainland, according to [http://example.org the chronicles].
{| class="wikitable"
| a || b
|-
| {{flag|X}} || 1
|}
* A list item that is not running prose at all.
Prices rose by 5&nbsp;% a year &amp; wages fell behind.
Short line.
== See also ==
The text after See also is navigation, not prose, and is dropped.
[[Category:Islands]]
[[de:Beispielland]]
"""


def dump(pages: list[tuple[str, str, str, bool]]) -> str:
    """A MediaWiki export with (title, namespace, text, redirect) pages; the text is XML-escaped as in dumps."""
    from xml.sax.saxutils import escape

    parts = ['<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10">']
    for title, ns, text, redirect in pages:
        redirect_element = '<redirect title="X" />' if redirect else ""
        parts.append(f"<page><title>{escape(title)}</title><ns>{ns}</ns>{redirect_element}"
                     f'<revision><text xml:space="preserve">{escape(text)}</text></revision></page>')
    parts.append("</mediawiki>")
    return "\n".join(parts)


def test_wikitext_keeps_prose_and_drops_markup():
    text = wikitext_to_text(ARTICLE)
    paragraphs = text.split("\n\n")
    assert paragraphs == [
        "Example Land is a country in the North Sea, about 40 km from the coast. Its people speak Examplish.",
        "The island was settled in 800 AD by farmers from the mainland, according to the chronicles.",
        "Prices rose by 5 % a year & wages fell behind.",  # &nbsp; is a space
    ]


@pytest.mark.parametrize("markup, expected", [
    ("He met {{lang|fr|le roi}} and the {{citation needed|date=May 2010}} queen at the palace.",
     "He met le roi and the queen at the palace."),
    ("A {{outer|{{inner|{{innermost}}}}}} nested template vanishes from this sentence.",
     "A nested template vanishes from this sentence."),
    ("A [[:Category:Things|category link]] and an [[#Section|anchor]] read as text in this line.",
     "A and an anchor read as text in this line."),
    ("Water boils at 100 °C<ref group=n>At sea level.</ref> under normal pressure.",
     "Water boils at 100 °C under normal pressure."),
    ("The value<ref name=x/> is {{convert|1|to|2|m}} in every one of the cases.",
     "The value is 1 to 2 m in every one of the cases."),
    ("[[Image:X.jpg|thumb|A caption with a stray [ bracket and a [[link]]]] Then the real text of the article follows.",
     "Then the real text of the article follows."),
])
def test_wikitext_cases(markup, expected):
    assert wikitext_to_text(markup) == expected


def test_wikitext_without_prose_is_empty():
    assert wikitext_to_text("{{Infobox|a=b}}\n== Heading ==\n* item\n[[Category:X]]") == ""


def test_read_wikipedia_dump_skips_redirects_and_other_namespaces(tmp_path):
    xml = dump([("Alpha", "0", "Alpha is the first letter of the Greek alphabet, used widely.", False),
                ("Beta", "0", "#REDIRECT [[Alpha]]", False),
                ("Gamma", "0", "Text of a redirect page flagged by the element.", True),
                ("Talk:Alpha", "1", "A discussion page that is not an article at all.", False),
                ("Delta", "0", "Delta is the fourth letter; 'quoted' & <escaped> text.", False)])
    for path in (tmp_path / "dump.xml", tmp_path / "dump.xml.bz2"):
        data = xml.encode("utf-8")
        path.write_bytes(bz2.compress(data) if path.suffix == ".bz2" else data)
        pages = list(read_wikipedia_dump(path))
        assert [page.title for page in pages] == ["Alpha", "Delta"]
        assert pages[1].wikitext == "Delta is the fourth letter; 'quoted' & <escaped> text."


def test_read_wikipedia_dump_bad_xml_names_file_and_line(tmp_path):
    path = tmp_path / "broken.xml"
    path.write_text("<mediawiki>\n<page><title>A</title>\n<text>unclosed</page>\n</mediawiki>\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"broken\.xml: line 3 column \d+: invalid XML"):
        list(read_wikipedia_dump(path))


def test_read_wikipedia_dump_bad_bz2_names_file(tmp_path):
    path = tmp_path / "dump.xml.bz2"
    path.write_bytes(b"not bzip2 data at all")
    with pytest.raises(DataError, match=r"dump\.xml\.bz2: cannot read the dump"):
        list(read_wikipedia_dump(path))


def test_read_news_one_article_per_line(tmp_path):
    path = tmp_path / "news.cor"
    path.write_bytes(b"First  article.\tIt costs \xa33.\n\n   \nSecond article.\n")
    assert list(read_news(path)) == ["First article. It costs \u00a33.", "Second article."]


def test_read_news_decoding_error_names_line_and_byte_offset(tmp_path):
    path = tmp_path / "news.cor"
    path.write_bytes(b"ok line\nbad \xa3 here\n")
    with pytest.raises(DataError, match=r"news\.cor: line 2: cannot decode as utf-8 at byte offset 12"):
        list(read_news(path, encoding="utf-8"))


def test_missing_gensim_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(builtin.importlib.util, "find_spec",
                        lambda name, *a: None if name == "gensim" else real(name, *a))
    with pytest.raises(DataError, match=re.escape(GENSIM_INSTALL)):
        gensim_data_dir()
    with pytest.raises(DataError, match=re.escape(GENSIM_INSTALL)):
        write_builtin_corpus("unused", ["news"])


def fake_data_dir(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / NEWS_FILES[0]).write_text("Rain fell on Sydney. Crops recovered fast.\nA second story ran today.\n",
                                      encoding="ascii")
    (root / NEWS_FILES[1]).write_bytes(b"A third story cost \xa35 to print.\n")
    article = ("'''Alpha''' is a [[letter]]. It comes first in the alphabet.\n\n"
               "Alpha also names the brightest star of a constellation.")
    xml = dump([("Alpha", "0", article, False)])
    (root / WIKIPEDIA_FILE).write_bytes(bz2.compress(xml.encode("utf-8")))
    return root


def test_write_builtin_corpus_in_bert_format(tmp_path):
    data = fake_data_dir(tmp_path / "gensim")
    files = write_builtin_corpus(tmp_path / "corpus", data_dir=data)
    assert [(f.name, f.documents) for f in files] == [("news", 3), ("wikipedia", 1)]
    assert files[0].words == 19 and files[1].words == 19
    assert files[0].path.read_text(encoding="utf-8") == (
        "Rain fell on Sydney.\nCrops recovered fast.\n\nA second story ran today.\n\n"
        "A third story cost \u00a35 to print.\n\n")
    documents = list(read_documents([f.path for f in files], "bert"))
    assert documents[-1] == ["Alpha is a letter.", "It comes first in the alphabet.",
                             "Alpha also names the brightest star of a constellation."]
    sliced = write_builtin_corpus(tmp_path / "slice", ["news"], max_documents=1, data_dir=data)
    assert sliced[0].documents == 1


def test_write_builtin_corpus_bad_arguments(tmp_path):
    data = fake_data_dir(tmp_path / "gensim")
    with pytest.raises(DataError, match="unknown bundled text 'poems'"):
        write_builtin_corpus(tmp_path / "c", ["news", "poems"], data_dir=data)
    with pytest.raises(DataError, match="max_documents must be >= 1"):
        write_builtin_corpus(tmp_path / "c", ["news"], max_documents=0, data_dir=data)
    with pytest.raises(DataError, match="no bundled text named"):
        write_builtin_corpus(tmp_path / "c", [], data_dir=data)
    (data / WIKIPEDIA_FILE).unlink()
    with pytest.raises(DataError, match=re.escape(f"{WIKIPEDIA_FILE}: missing from gensim's test data")):
        write_builtin_corpus(tmp_path / "c", ["wikipedia"], data_dir=data)


@pytest.fixture(scope="module")
def gensim_dir() -> Path:
    if importlib.util.find_spec("gensim") is None:
        pytest.skip(f"gensim's test data is not installed ({GENSIM_INSTALL})")
    return gensim_data_dir()


def test_real_bundled_texts(gensim_dir):
    news = list(builtin_documents("news", gensim_dir))
    assert len(news) == 350 and 60_000 < sum(len(d.split()) for d in news) < 70_000
    assert news[0].startswith("Hundreds of people have been forced to vacate their homes")
    wiki = list(builtin_documents("wikipedia", gensim_dir))
    text = "\n\n".join(wiki)
    assert len(wiki) > 100 and len(text.split()) > 350_000
    assert wiki[0].startswith("Anarchism is a political philosophy that advocates self-governed societies")
    # Markup leftovers are rare: a handful of pipes and braces in quoted text, no templates, links or tags.
    for leftover in ("{{", "}}", "[[", "]]", "<ref", "&nbsp;", "thumb|"):
        assert leftover not in text
    assert text.count("|") < 10
