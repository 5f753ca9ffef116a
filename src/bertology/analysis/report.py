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
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertology.analysis.base import Section, write_numbers
from bertology.errors import BertologyError, ConfigError
from bertology.io import atomic_write

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
        result.seconds[name] = round(time.perf_counter() - start, 1)
        result.sections.append(section)
    summary = {
        "model": str(model_dir),
        "data": str(data_dir),
        "quick": quick,
        "sections": {s.name: {"title": s.title, "numbers": s.numbers, "figures": [str(f) for f in s.figures],
                              "command": s.command, "notes": s.notes, "seconds": result.seconds.get(s.name)}
                     for s in result.sections},
        "skipped": {s.name: s.reason for s in result.skipped},
    }
    write_numbers(out / "report.json", summary)
    with atomic_write(result.path, "w", encoding="utf-8") as handle:
        handle.write(render(result, str(model_dir), str(data_dir)))
    return result


# ------------------------------------------------------------------------------------------------------ rendering

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; line-height: 1.4; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.4em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.5em; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; white-space: pre-wrap; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }
.note { color: #555; } .skipped { color: #8a4b00; }
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
        return str(value)
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
        return '<span class="note">(nested further: see the JSON file)</span>'
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
                              ("–" if v is None else str(v)) for v in items[:MAX_ROWS])
            return _text(shown + (f", … ({len(items)} in all)" if len(items) > MAX_ROWS else ""))
        if all(isinstance(v, (list, tuple)) and all(_scalar(x) for x in v) for v in items):
            width = max(len(v) for v in items)
            head = "<tr><th></th>" + "".join(f"<th>{j}</th>" for j in range(width)) + "</tr>"
            body = "".join(f"<tr><th>{i}</th>{''.join(_cell(x, depth) for x in row)}</tr>"
                           for i, row in enumerate(items[:MAX_ROWS]))
            return f"<table>{head}{body}</table>"
        if all(isinstance(v, dict) for v in items):
            columns: list[str] = []
            for v in items:
                columns.extend(k for k in v if k not in columns)
            head = "<tr>" + "".join(f"<th>{_text(c)}</th>" for c in columns) + "</tr>"
            body = "".join("<tr>" + "".join(_cell(v.get(c), depth) for c in columns) + "</tr>"
                           for v in items[:MAX_ROWS])
            more = (f'<tr><td colspan="{len(columns)}" class="note">{len(items) - MAX_ROWS} more rows in the JSON '
                    "file</td></tr>") if len(items) > MAX_ROWS else ""
            return f"<table>{head}{body}{more}</table>"
        return "<ul>" + "".join(f"<li>{_table(v, depth + 1)}</li>" for v in items[:MAX_ROWS]) + "</ul>"
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


def render(result: ReportResult, model: str, data: str) -> str:
    """The report as one HTML document."""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>bertology analysis: {_text(model)}</title><style>{STYLE}</style></head><body>",
             f"<h1>What the representations of {_text(model)} reveal</h1>",
             f"<p>Model <code>{_text(model)}</code>; data <code>{_text(data)}</code>; generated "
             f"{_text(time.strftime('%Y-%m-%d %H:%M:%S %Z'))}.</p>"]
    if result.sections:
        parts.append("<ul>" + "".join(f'<li><a href="#{_anchor(s.name)}">{_text(s.title)}</a></li>'
                                      for s in result.sections) + "</ul>")
    if result.skipped:
        parts.append('<h2 id="skipped">Skipped</h2><ul>' + "".join(
            f'<li class="skipped"><b>{_text(s.name)}</b>: {_text(s.reason)}</li>' for s in result.skipped) + "</ul>")
    for section in result.sections:
        parts.append(f'<section id="{_anchor(section.name)}"><h2>{_text(section.title)}</h2>')
        if section.name in result.seconds:
            parts.append(f'<p class="note">computed in {result.seconds[section.name]:.1f} s</p>')
        parts.append(_table(section.numbers))
        parts.extend(_figure(Path(f)) for f in section.figures)
        if section.command:
            parts.append(f"<p>To redo it:</p><pre><code>{_text(section.command)}</code></pre>")
        if section.notes:
            parts.append("<ul>" + "".join(f'<li class="note">{_text(n)}</li>' for n in section.notes) + "</ul>")
        parts.append("</section>")
    if not result.sections:
        parts.append("<p>No analysis could run: see Skipped.</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
