"""Every built-in is registered in one place (bertology.builtins) and every registry sees all of them whatever was
imported first: each registry is asked, in a fresh interpreter, having imported only the registry's own module."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bertology.builtins import BUILT_IN, Registry, resolve

SRC = Path(__file__).resolve().parents[1] / "src" / "bertology"

# registry kind -> (its module, the registry's name there, how a registered value names itself, or None)
OWNERS = {
    "models": ("bertology.model.registry", "MODELS", "value.name"),
    "heads": ("bertology.model.heads", "HEAD_REGISTRY", None),
    "families": ("bertology.model.convert", "REGISTRY", "value.model_type"),
    "framings": ("bertology.tokenization.framing", "FRAMINGS", "value.name"),
    "extensions": ("bertology.model.extensions", "EXTENSIONS", None),
    "tasks": ("bertology.tasks.base", "TASKS", "value.name"),
    "objectives": ("bertology.objectives", "OBJECTIVES", None),
    "run_configs": ("bertology.model.registry", "RUN_CONFIGS", None),
    "index_kinds": ("bertology.retrieval.kinds", "INDEX_KINDS", "value.kind"),
}


def test_every_kind_of_built_in_has_an_owner():
    assert set(OWNERS) == set(BUILT_IN)


@pytest.mark.parametrize("kind", sorted(OWNERS))
def test_a_registry_sees_every_built_in_whatever_was_imported_first(kind):
    module, attribute, own_name = OWNERS[kind]
    names = [name for name, _, _ in BUILT_IN[kind]]
    code = f"""
import json, sys
from {module} import {attribute} as registry
before = sorted(m for m in sys.modules if m.startswith("bertology"))
found = {{}}
for name in {names!r}:
    value = registry[name]  # a lookup, the first use of this registry in this interpreter
    found[name] = {own_name or "name"}
print(json.dumps({{"names": list(registry), "found": found, "before": before}}))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr.strip().splitlines()[-3:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["names"] == names  # all of them, in the table's order, and nothing else
    assert out["found"] == {name: name for name in names}  # each registered under its own name
    # The lookups found built-ins whose modules nothing had imported yet (the model and objectives packages' own
    # __init__ imports their classes; the framings are defined beside their registry)
    defining = {target.partition(":")[0] for _, target, _ in BUILT_IN[kind]}
    if kind in ("extensions", "families", "tasks"):
        assert defining - set(out["before"]), kind


def test_the_table_names_what_it_registers():
    for kind, entries in BUILT_IN.items():
        names = [name for name, _, _ in entries]
        assert len(names) == len(set(names)), kind
        for name, target, options in entries:
            assert resolve(target) is not None, (kind, name)
            assert isinstance(options, dict)


def test_built_ins_are_registered_nowhere_else():
    """No module of the library calls a register function at import time: the table is the one place."""
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "builtins.py" and path.parent == SRC:
            continue
        # what runs at import: module level (in a loop or an if too), not in a function, a class or a lambda
        todo = list(ast.parse(path.read_text(encoding="utf-8")).body)
        while todo:
            node = todo.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id.startswith("register_")):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno}: {node.func.id}")
            todo.extend(ast.iter_child_nodes(node))
    assert not offenders, offenders


def test_a_registry_registers_its_built_ins_before_anything_else():
    calls = []
    registry = Registry("framings", lambda name, value: calls.append(name) or registry._entries.update({name: value}))
    registry["mine"] = "a layout of my own"
    assert list(registry) == [*(name for name, _, _ in BUILT_IN["framings"]), "mine"]
    assert calls == [name for name, _, _ in BUILT_IN["framings"]]
    with pytest.raises(KeyError, match="no built-ins of kind 'nothing'"):
        Registry("nothing")


def test_threads_that_use_a_registry_first_at_once_all_see_every_built_in():
    """Four threads use a registry first at once. The first built-in is registered only once all four have come
    to the registry's lock, so that the others always look while the built-ins are being registered (a 10 ms sleep
    per entry made that likely, not certain), and each of them sees every built-in."""
    import threading

    class Arrivals:
        """The registry's lock, counting the threads that come to it."""

        def __init__(self, lock) -> None:
            self.lock, self.came = lock, threading.Semaphore(0)

        def __enter__(self):
            self.came.release()
            return self.lock.__enter__()

        def __exit__(self, *exc):
            return self.lock.__exit__(*exc)

    names = [name for name, _, _ in BUILT_IN["framings"]]
    registered: list[str] = []

    def register(name, value) -> None:
        if not registered:
            for _ in range(4):
                assert arrivals.came.acquire(timeout=60), "the other threads never came to the registry's lock"
        registered.append(name)
        registry._entries[name] = value

    registry: Registry = Registry("framings", register)
    arrivals = Arrivals(registry._lock)
    registry._lock = arrivals
    seen, start = [], threading.Barrier(4)

    def look() -> None:
        start.wait()
        seen.append(list(registry))

    threads = [threading.Thread(target=look) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    assert seen == [names] * 4 and registered == names  # each built-in registered once
