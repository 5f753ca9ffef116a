"""docs/DESIGN.md's worked example (a head and an objective trained by the shared loop) runs as written."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "DESIGN.md"


def test_the_worked_example_runs(tmp_path):
    text = DESIGN.read_text(encoding="utf-8")
    section = text[text.index("### Worked example"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, "the worked example has no python block"
    module = types.ModuleType("design_example")  # dataclasses look their module up in sys.modules
    module.workdir = tmp_path
    sys.modules[module.__name__] = module
    try:
        exec(compile(code.group(1), str(DESIGN), "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    assert (tmp_path / "run" / "model" / "bertology.json").is_file()
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
