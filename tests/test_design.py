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


# Imports made by name at run time, which the import contract (pyproject.toml, [tool.importlinter]: `lint-imports`)
# cannot see: each place, and the modules it may load. Every other import is a plain import statement, checked there.
DYNAMIC_IMPORTS = {
    "builtins.py": "any module the table of built-ins names (tests/test_builtins.py resolves every entry)",
    "__init__.py": "bertology's top-level names, loaded on first use",
    "cli/main.py": "bertology.cli.<command>",
    "analysis/report.py": "bertology.analysis.<section>",
    "serve/__init__.py": "the service's optional third-party dependencies",
}


def test_imports_by_name_are_only_where_they_are_declared():
    import ast

    root = Path(__file__).resolve().parents[1] / "src" / "bertology"
    found: dict[str, list[int]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and (
                    (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                    or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))):
                found.setdefault(path.relative_to(root).as_posix(), []).append(node.lineno)
    assert set(found) <= set(DYNAMIC_IMPORTS), {k: v for k, v in found.items() if k not in DYNAMIC_IMPORTS}
    for place in ("cli/main.py", "analysis/report.py"):  # within their own package
        text = (root / place).read_text(encoding="utf-8")
        package = "bertology." + place.split("/")[0]
        assert all(f'import_module(f"{package}.' in line for line in text.splitlines() if "import_module(" in line)
