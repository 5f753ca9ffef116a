"""One self-contained HTML report of every analysis whose data is present (`bertology analyze`).

Each analysis module (`bertology.analysis.<name>`) offers `report_section(pretrained, out_dir, data_dir) -> Section`
(keyword arguments `quick`, `model_dir`, `task` and `show_progress` are passed to those that accept them). A module
that is not installed, has no `report_section`, or whose data or model is not there (it raises FileNotFoundError or
`AnalysisUnavailable`) is skipped with a note saying why; a BertologyError (bad input) is recorded as the section's failure. The report
inlines the figures (base64 PNG), shows the numbers as tables, the command that redoes each analysis and the notes;
every text is escaped, and nothing is loaded from elsewhere (no scripts, no external styles or images).
"""

from __future__ import annotations

import base64
import html
import importlib
import inspect
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertology.analysis.base import Section, write_numbers
from bertology.errors import BertologyError, ConfigError
from bertology.io import atomic_write
from bertology.model.local import display_name

# Modules in report order.
ANALYSES: tuple[str, ...] = ("wsd", "geometry", "neighbours", "sense_map", "probing", "attention", "importance")
# Other names --only accepts for them.
ALIASES: dict[str, str] = {
    "anisotropy": "geometry", "rogue": "geometry", "rogue-dimensions": "geometry",
    "sense-map": "sense_map", "sensemap": "sense_map", "neighbors": "neighbours",
    "heads": "attention", "syntactic-heads": "attention", "pruning": "importance", "head-importance": "importance",
}


class AnalysisUnavailable(BertologyError):
    """A report_section's data or model lacks what it needs (a head, a data set): the report lists it as skipped;
    a command that runs the analysis alone refuses in one line."""


@dataclass
class Skipped:
    name: str
    reason: str


@dataclass
class ReportResult:
    path: Path
    sections: list[Section] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


def chosen_analyses(only: str | list[str] | None) -> list[str]:
    """The analyses `--only` names (module names or aliases, comma-separated), in report order; all without it."""
    if only is None:
        return list(ANALYSES)
    names = [n.strip() for n in (only.split(",") if isinstance(only, str) else only) if n.strip()]
    unknown = [n for n in names if n.replace("-", "_") not in ANALYSES and n not in ALIASES]
    if unknown or not names:
        raise ConfigError(f"--only: unknown analysis {', '.join(map(repr, unknown)) or '(none given)'}; known: "
                          f"{', '.join(ANALYSES)} (or {', '.join(sorted(ALIASES))})")
    wanted = {ALIASES.get(n, n.replace("-", "_")) for n in names}
    return [name for name in ANALYSES if name in wanted]


def build_report(model_dir: str | os.PathLike, out_dir: str | os.PathLike, only: str | list[str] | None = None,
                 data_dir: str | os.PathLike = "../shared/data", *, quick: bool = False, task: str | None = None,
                 show_progress: bool = False, device: Any = None, dtype: str = "float32") -> ReportResult:
    """Run the chosen analyses on the model in `model_dir` with the data sets under `data_dir`, each writing its
    JSON and figures under `out_dir`, and write `out_dir/report.html` (atomically) and `out_dir/report.json`.
    The model runs on `device` (None: the CPU; "auto", "cuda", ...), its forwards in `dtype` there
    (`bertology.device`): every analysis runs it where it is, under the autocast entered here."""
    from bertology.device import placement
    from bertology.model import load

    names = chosen_analyses(only)
    where = placement(device, dtype)  # before the model is loaded
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pretrained = where.move(load(model_dir))
    result = ReportResult(out / "report.html")
    options = {"quick": quick, "model_dir": str(model_dir), "task": task, "show_progress": show_progress}
    for name in names:
        try:
            module = importlib.import_module(f"bertology.analysis.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"bertology.analysis.{name}":
                raise
            result.skipped.append(Skipped(name, "this version of bertology has no such analysis module"))
            continue
        make = getattr(module, "report_section", None)
        if make is None:
            result.skipped.append(Skipped(name, "the module has no report_section"))
            continue
        accepted = inspect.signature(make).parameters
        kwargs = {k: v for k, v in options.items() if k in accepted}
        start = time.perf_counter()
        try:
            with where.autocast():
                section = make(pretrained, out, Path(data_dir), **kwargs)
        except (FileNotFoundError, AnalysisUnavailable) as error:  # its data (or a head it needs) is not there
            result.skipped.append(Skipped(name, str(error)))
            continue
        except BertologyError as error:
            result.skipped.append(Skipped(name, f"failed: {error}"))
            continue
        result.seconds[section.name] = round(time.perf_counter() - start, 1)
        result.sections.append(section)
    if only is not None:  # --only redoes its sections and keeps the rest of an earlier report of this model
        kept = earlier_report(out / "report.json", model_dir, data_dir, quick, set(names))
        result.sections = sorted(result.sections + kept.sections, key=lambda s: _order(s.name))
        result.seconds = {**kept.seconds, **result.seconds}
        done = {s.name for s in result.sections} | {s.name for s in result.skipped}
        result.skipped += [s for s in kept.skipped if s.name not in done]
    summary = {
        "model": str(model_dir),
        "name": display_name(model_dir),
        "data": str(data_dir),
        "quick": quick,
        "sections": {s.name: {"title": s.title, "numbers": s.numbers, "figures": [str(f) for f in s.figures],
                              "command": s.command, "notes": s.notes, "headline": s.headline,
                              "seconds": result.seconds.get(s.name)}
                     for s in result.sections},
        "skipped": {s.name: s.reason for s in result.skipped},
    }
    write_numbers(out / "report.json", summary)
    with atomic_write(result.path, "w", encoding="utf-8") as handle:
        handle.write(render(result, str(model_dir), str(data_dir), quick=quick))
    return result


# The module each section name comes from, where they differ (geometry's section is "anisotropy").
SECTION_MODULE = {"anisotropy": "geometry"}


def _order(section_name: str) -> int:
    module = SECTION_MODULE.get(section_name, section_name)
    return ANALYSES.index(module) if module in ANALYSES else len(ANALYSES)


def earlier_report(path: Path, model_dir: str | os.PathLike, data_dir: str | os.PathLike, quick: bool,
                   redone: set[str]) -> ReportResult:
    """The sections of an earlier report.json in the same folder, for the same model, data and --quick, that are not
    being redone; nothing when there is none, or it is of another run (then --only writes its sections alone)."""
    kept = ReportResult(path.with_name("report.html"))
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return kept
    same = (isinstance(earlier, dict) and earlier.get("model") == str(model_dir)
            and earlier.get("data") == str(data_dir) and earlier.get("quick") == quick)
    if not same or not isinstance(earlier.get("sections"), dict):
        return kept
    for name, part in earlier["sections"].items():
        if SECTION_MODULE.get(name, name) in redone or not isinstance(part, dict):
            continue
        kept.sections.append(Section(name, str(part.get("title", name)), part.get("numbers") or {},
                                     [Path(f) for f in part.get("figures") or []], str(part.get("command", "")),
                                     [str(n) for n in part.get("notes") or []], part.get("headline") or {}))
        if isinstance(part.get("seconds"), (int, float)):
            kept.seconds[name] = part["seconds"]
    skipped = earlier.get("skipped")
    if isinstance(skipped, dict):
        kept.skipped = [Skipped(name, str(reason)) for name, reason in skipped.items() if name not in redone]
    return kept


# ------------------------------------------------------------------------------------------------------ rendering

# One column on a phone; on a wide screen each section's figures beside its key numbers. Wide tables scroll inside
# their own box, so the page itself never scrolls sideways.
STYLE = """
* { box-sizing: border-box; }
body { font-family: system-ui, sans-serif; margin: 0 auto; padding: 1em; max-width: 78em; color: #222;
       line-height: 1.4; overflow-wrap: anywhere; }
h1 { font-size: 1.6em; margin: 0.2em 0; } h2 { border-bottom: 1px solid #ccc; margin-top: 1.6em; }
.meta, .note { color: #555; font-size: 0.9em; } .skipped { color: #8a4b00; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; margin: 0.4em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.5em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.headline td.num { font-weight: 600; }
.finding { display: flex; flex-wrap: wrap; gap: 1em; align-items: flex-start; }
.finding .figures { flex: 3 1 24em; min-width: 0; } .finding .keys { flex: 2 1 16em; min-width: 0; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
figure { margin: 0 0 0.5em 0; }
details { margin: 0.5em 0; } summary { cursor: pointer; color: #1a4f8b; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; white-space: pre-wrap; }
"""
MAX_ROWS = 60  # longer lists are summarised (the analysis's JSON file has them all)
MAX_DEPTH = 4


def _text(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _number(value: float) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return "\u2013"  # a NaN or infinity is a number the analysis could not compute
    return f"{value:.4g}" if abs(value) < 1e5 else f"{value:,.0f}"


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _cell(value: Any, depth: int) -> str:
    if value is None:
        return "<td>&ndash;</td>"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f'<td class="num">{_text(_number(value))}</td>'
    if _scalar(value):
        return f"<td>{_text(value)}</td>"
    return f"<td>{_table(value, depth + 1)}</td>"


def _table(value: Any, depth: int = 0) -> str:
    """Numbers as HTML tables: a mapping as key/value rows, a list of mappings as rows with their keys as columns, a
    list of lists as a matrix, a list of scalars on one line."""
    if _scalar(value):
        return _text(_number(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value)
    if depth >= MAX_DEPTH:
        return '<span class="note">(deeper levels: see the JSON file)</span>'
    if isinstance(value, dict):
        if not value:
            return '<span class="note">(none)</span>'
        rows = list(value.items())
        body = "".join(f"<tr><th>{_text(k)}</th>{_cell(v, depth)}</tr>" for k, v in rows[:MAX_ROWS])
        more = f'<tr><td colspan="2" class="note">{len(rows) - MAX_ROWS} more in the JSON file</td></tr>' \
            if len(rows) > MAX_ROWS else ""
        return f"<table>{body}{more}</table>"
    if isinstance(value, (list, tuple)):
        items = list(value)
        if not items:
            return '<span class="note">(none)</span>'
        if all(_scalar(v) for v in items):
            shown = ", ".join(_number(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else
                              ("\u2013" if v is None else str(v)) for v in items[:MAX_ROWS])
            return _text(shown + (f", \u2026 ({len(items)} in all)" if len(items) > MAX_ROWS else ""))
        more_rows = (f'<p class="note">the first {MAX_ROWS} of {len(items)} rows; all in the JSON file</p>'
                     if len(items) > MAX_ROWS else "")
        if all(isinstance(v, (list, tuple)) and all(_scalar(x) for x in v) for v in items):
            width = max(len(v) for v in items)
            head = "<tr><th></th>" + "".join(f"<th>{j}</th>" for j in range(width)) + "</tr>"
            body = "".join(f"<tr><th>{i}</th>{''.join(_cell(x, depth) for x in row)}</tr>"
                           for i, row in enumerate(items[:MAX_ROWS]))
            return f"<table>{head}{body}</table>{more_rows}"
        if all(isinstance(v, dict) for v in items):
            columns: list[str] = []
            for v in items:
                columns.extend(k for k in v if k not in columns)
            head = "<tr>" + "".join(f"<th>{_text(c)}</th>" for c in columns) + "</tr>"
            body = "".join("<tr>" + "".join(_cell(v.get(c), depth) for c in columns) + "</tr>"
                           for v in items[:MAX_ROWS])
            return f"<table>{head}{body}</table>{more_rows}"
        return "<ul>" + "".join(f"<li>{_table(v, depth + 1)}</li>" for v in items[:MAX_ROWS]) + "</ul>" + more_rows
    return _text(repr(value))


def _figure(path: Path) -> str:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        return f'<p class="skipped">figure {_text(path)} could not be read ({_text(error.strerror)})</p>'
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return f'<p class="skipped">figure {_text(path)} is not a PNG file</p>'
    encoded = base64.b64encode(data).decode("ascii")
    return f'<figure><img alt="{_text(path.name)}" src="data:image/png;base64,{encoded}"></figure>'


def _anchor(name: str) -> str:
    return "section-" + "".join(c if c.isalnum() else "-" for c in name)


def _keys_table(headline: dict[str, Any]) -> str:
    rows = "".join(f"<tr><th>{_text(label)}</th>{_cell(value, MAX_DEPTH)}</tr>" for label, value in headline.items()
                   if _scalar(value))
    return f'<table class="headline">{rows}</table>' if rows else ""


def _headline_table(sections: list[Section]) -> str:
    """The opening table: each analysis's key numbers, one row a number, linked to its section."""
    rows = []
    for section in sections:
        items = [(label, value) for label, value in section.headline.items() if _scalar(value)]
        for i, (label, value) in enumerate(items):
            first = (f'<th rowspan="{len(items)}"><a href="#{_anchor(section.name)}">{_text(section.title)}</a></th>'
                     if i == 0 else "")
            rows.append(f"<tr>{first}<td>{_text(label)}</td>{_cell(value, MAX_DEPTH)}</tr>")
    if not rows:
        return ""
    return (f'<div class="scroll"><table class="headline"><tr><th>analysis</th><th>finding</th><th>value</th></tr>'
            f'{"".join(rows)}</table></div>')


def render(result: ReportResult, model: str, data: str, *, quick: bool = False) -> str:
    """The report as one HTML document: the model's name, the headline table, then each analysis with its figures
    beside its key numbers, its full numbers and the command that redoes it folded away."""
    name = display_name(model)
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>bertology analysis: {_text(name)}</title><style>{STYLE}</style></head><body>",
             f"<h1>{_text(name)}: what its representations show</h1>",
             f'<p class="meta">Model <code>{_text(model)}</code>; data <code>{_text(data)}</code>'
             f'{"; quick run (smaller samples)" if quick else ""}; generated '
             f"{_text(time.strftime('%Y-%m-%d %H:%M:%S %Z'))}.</p>"]
    parts.append(_headline_table(result.sections))
    if result.skipped:
        parts.append('<details id="skipped"><summary>' + f"{len(result.skipped)} {'analysis' if len(result.skipped) == 1 else 'analyses'} skipped" + "</summary><ul>"
                     + "".join(f'<li class="skipped"><b>{_text(s.name)}</b>: {_text(s.reason)}</li>'
                               for s in result.skipped) + "</ul></details>")
    for section in result.sections:
        parts.append(f'<section id="{_anchor(section.name)}"><h2>{_text(section.title)}</h2>')
        figures = "".join(_figure(Path(f)) for f in section.figures)
        keys = _keys_table(section.headline)
        if section.notes:
            keys += "<ul>" + "".join(f'<li class="note">{_text(n)}</li>' for n in section.notes) + "</ul>"
        if section.name in result.seconds:
            keys += f'<p class="note">computed in {result.seconds[section.name]:.1f} s</p>'
        parts.append('<div class="finding">' + (f'<div class="figures">{figures}</div>' if figures else "")
                     + f'<div class="keys">{keys}</div></div>')
        parts.append(f'<details><summary>All numbers</summary><div class="scroll">{_table(section.numbers)}</div>'
                     "</details>")
        if section.command:
            parts.append(f"<details><summary>The command that redoes it</summary><pre><code>"
                         f"{_text(section.command)}</code></pre></details>")
        parts.append("</section>")
    if not result.sections:
        parts.append("<p>No analysis could run: see the skipped ones.</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
