"""The analysis report: sections from analysis modules, skipped ones with their reason, escaping, and the page
rendered by a real headless Chromium with no console errors and no request leaving the file."""

from __future__ import annotations

import shutil
import sys
import types
from pathlib import Path

import pytest
import torch

from bertology.analysis import report
from bertology.analysis.base import Section
from bertology.cli.main import main
from bertology.errors import ConfigError, DataError
from bertology.model import EncoderModel, Pretrained, preset
from bertology.tokenization import train_tokenizer

ROOT = Path(__file__).resolve().parents[2]
UD = ROOT.parent / "shared" / "data" / "ud-english-ewt"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
EVIL = '<script>console.error("injected")</script> & "quotes"'


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def model_dir(tmp_path) -> Path:
    texts = ["the cat sat on the mat .", "a dog ran , and birds sang !"] * 5
    tokenizer = train_tokenizer(iter(texts), "wordpiece", 60, show_progress=False, min_frequency=1)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=2, hidden_size=32, num_heads=2,
                    intermediate_size=64, max_position_embeddings=512)
    model = EncoderModel(config)
    model.init_weights(torch.Generator().manual_seed(0))
    Pretrained(model, tokenizer).save(tmp_path / "model")
    return tmp_path / "model"


def fake_module(monkeypatch, name: str, make) -> None:
    module = types.ModuleType(f"bertology.analysis.{name}")
    if make is not None:
        module.report_section = make
    monkeypatch.setitem(sys.modules, f"bertology.analysis.{name}", module)
    monkeypatch.setattr(report, "ANALYSES", (*report.ANALYSES, name))


def png(path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 1.5), dpi=50)
    ax.plot([0, 1], [1, 0])
    fig.savefig(path, format="png")
    plt.close(fig)
    return path


def test_sections_skips_and_escaping(monkeypatch, model_dir, tmp_path):
    seen = {}

    def evil_section(pretrained, out_dir, data_dir, *, quick=False, model_dir=None):
        seen.update(quick=quick, model_dir=model_dir, data_dir=data_dir)
        return Section(name="evil", title=f"Title {EVIL}", numbers={"k<b>": EVIL, "grid": [[1, 2.5], [None, 3]],
                                                                    "rows": [{"a": 1, "b": EVIL}]},
                       figures=[png(Path(out_dir) / "f.png")], command=f"bertology x --arg '{EVIL}'", notes=[EVIL])

    def missing_data(pretrained, out_dir, data_dir):
        raise FileNotFoundError(f"{data_dir}/nothing: not there")

    def bad_input(pretrained, out_dir, data_dir):
        raise DataError("corpus.txt:3: malformed")

    fake_module(monkeypatch, "evil", evil_section)
    fake_module(monkeypatch, "nodata", missing_data)
    fake_module(monkeypatch, "badinput", bad_input)
    fake_module(monkeypatch, "nofunction", None)
    result = report.build_report(model_dir, tmp_path / "out", "evil,nodata,badinput,nofunction,wsd",
                                 tmp_path / "no-data", quick=True)
    assert seen == {"quick": True, "model_dir": str(model_dir), "data_dir": tmp_path / "no-data"}
    assert [s.name for s in result.sections] == ["evil"]
    reasons = {s.name: s.reason for s in result.skipped}
    assert reasons["nodata"].endswith("nothing: not there")
    assert reasons["badinput"] == "failed: corpus.txt:3: malformed"
    assert reasons["nofunction"] == "the module has no report_section"
    assert "wsd" in reasons
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert "<script" not in page and "&lt;script&gt;" in page and "k&lt;b&gt;" in page
    assert page.count('src="data:image/png;base64,') == 1
    assert "bertology x --arg &#x27;" in page
    assert (tmp_path / "out" / "report.json").is_file()
    with pytest.raises(ConfigError, match="unknown analysis 'nonsense'"):
        report.chosen_analyses("attention,nonsense")
    assert report.chosen_analyses("heads,anisotropy") == ["geometry", "attention"]


@pytest.mark.skipif(not UD.is_dir(), reason="UD English-EWT not in ../shared/data/ud-english-ewt")
def test_analyze_command_report_renders_in_headless_chromium(model_dir, tmp_path):
    if not Path(CHROMIUM).is_file():
        pytest.skip("chromium is not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    out = tmp_path / "out"
    code = main(["analyze", "--model", str(model_dir), "--out", str(out), "--only", "attention,importance",
                 "--data", str(UD.parent), "--quick"])
    assert code == 0
    page_path = out / "report.html"
    text = page_path.read_text(encoding="utf-8")
    assert "Attention heads (Clark et al. 2019)" in text
    assert "bertology heads stats --model " + str(model_dir) in text
    assert "no loss to take the gradient of" in text  # importance: the random model has no head
    messages, errors, requests, layouts = [], [], [], {}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            for width, height in ((1280, 800), (390, 844)):  # a desktop window and a phone
                page = browser.new_page(viewport={"width": width, "height": height})
                page.on("console", lambda m: messages.append((m.type, m.text)))
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.on("request", lambda r: requests.append(r.url))
                page.goto(page_path.as_uri())
                page.wait_for_load_state("load")
                layouts[width] = page.evaluate(LAYOUT)
                images = page.eval_on_selector_all("img", "imgs => imgs.map(i => [i.complete, i.naturalWidth])")
                title = page.title()
                page.screenshot(path=str(tmp_path / f"report-{width}.png"), full_page=True)
                page.close()
        finally:
            browser.close()
    assert not errors, errors
    assert not [m for m in messages if m[0] in ("error", "warning")], messages
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
    assert len(images) == 2 and all(done and width > 0 for done, width in images)
    assert title == f"bertology analysis: {model_dir.parent.name}/{model_dir.name}"  # a model/ folder: by its run
    for width, layout in layouts.items():
        assert layout["scrollWidth"] <= width, (width, layout)  # nothing makes the page scroll sideways
        assert layout["headline"] is not None and layout["headline"] < layout["height"], (width, layout)
        for section in layout["sections"]:  # each figure starts within one screen of its section's heading
            if section["figure"] is not None:
                assert section["figure"] - section["heading"] < layout["height"], (width, section)
    assert (tmp_path / "report-390.png").stat().st_size > 1000


# Where the page puts things, in CSS pixels from the top of the document.
LAYOUT = """() => {
  const top = e => e ? e.getBoundingClientRect().top + window.scrollY : null;
  return {
    scrollWidth: document.documentElement.scrollWidth, height: window.innerHeight,
    headline: top(document.querySelector("table.headline")),
    sections: [...document.querySelectorAll("section")].map(s => ({
      id: s.id, heading: top(s.querySelector("h2")), figure: top(s.querySelector("img"))})),
  };
}"""


def test_only_redoes_its_sections_and_keeps_the_others(monkeypatch, model_dir, tmp_path):
    calls = []

    def section(name, value):
        def make(pretrained, out_dir, data_dir, *, quick=False):
            calls.append(name)
            return Section(name=name, title=f"The {name}", numbers={"value": value, "bad": float("nan")},
                           headline={f"{name} value": value})
        return make

    fake_module(monkeypatch, "first", section("first", 1.5))
    fake_module(monkeypatch, "second", section("second", 2.5))
    out = tmp_path / "out"
    report.build_report(model_dir, out, None, tmp_path / "no-data", quick=True)
    assert calls[-2:] == ["first", "second"]
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "first value" in page and "second value" in page and "nan" not in page.lower()
    assert page.index('class="headline"') < page.index('<section id="section-first"')  # the headline table first
    monkeypatch.setattr(sys.modules["bertology.analysis.second"], "report_section", section("second", 7.25))
    calls.clear()
    result = report.build_report(model_dir, out, "second", tmp_path / "no-data", quick=True)
    assert calls == ["second"]
    assert [s.name for s in result.sections][-2:] == ["first", "second"]  # in report order, the first kept
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "first value" in page and "7.25" in page and "2.5<" not in page
    # another model's report is not merged: --only then writes its own sections alone
    other = tmp_path / "other-model"
    shutil.copytree(model_dir, other)
    result = report.build_report(other, out, "second", tmp_path / "no-data", quick=True)
    assert "first" not in [s.name for s in result.sections]


@pytest.mark.skipif(not UD.is_dir(), reason="UD English-EWT not in ../shared/data/ud-english-ewt")
def test_importance_section_of_a_model_with_a_masked_lm_head(tmp_path, capsys):
    """A model bertology pretrained has its MLM head: importance uses the masked-LM loss on UD dev texts."""
    texts = [line for line in (UD / "en_ewt-ud-dev.conllu").read_text(encoding="utf-8").splitlines()
             if line.startswith("# text = ")][:300]
    tokenizer = train_tokenizer(iter(texts), "wordpiece", 400, show_progress=False, min_frequency=1)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=2, hidden_size=32, num_heads=2,
                    intermediate_size=64, max_position_embeddings=512)
    from bertology.model.encoder import HeadSpec

    model = EncoderModel(config, [HeadSpec("mlm", "masked_lm")])
    model.init_weights(torch.Generator().manual_seed(0))
    Pretrained(model, tokenizer).save(tmp_path / "model")
    result = report.build_report(tmp_path / "model", tmp_path / "out", "importance", UD.parent, quick=True)
    assert [s.name for s in result.sections] == ["importance"], result.skipped
    numbers = result.sections[0].numbers
    assert numbers["metric"] == "masked-token accuracy" and numbers["heads"] == 4
    # Steps of 25 % up to 90 % of 4 heads: 1, 2, 3, then round(3.6) = all 4.
    assert list(numbers["metric by share of heads removed"]) == ["0%", "25%", "50%", "75%", "100%"]
    assert "--ud" in result.sections[0].command
    assert main(["analyze", "--model", str(tmp_path / "model"), "--out", str(tmp_path / "o"), "--only", "nope"]) == 2
    assert "unknown analysis 'nope'" in capsys.readouterr().err


def test_redo_commands_quote_every_path():
    import shlex

    from bertology.analysis.base import shell_command

    nasty = ["dir with spaces/model", "$(rm -rf ~)", "it's", "a;b", "plain"]
    command = shell_command("bertology", "probe", "--model", *nasty)
    assert shlex.split(command) == ["bertology", "probe", "--model", *nasty]
    assert command.endswith(" plain")  # words that need no quotes stay readable
