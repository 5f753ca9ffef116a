"""A task by name: a registered one (``bertology.tasks.base.TASKS``, the built-in ones included), or a user's task
file (``bertology.tasks.user``) or an instructions file (``bertology.tasks.instructions``). Above them, so that the
registry's module imports no task."""

from __future__ import annotations

from bertology.errors import ConfigError
from bertology.tasks.base import TASKS, FinetuneTask
from bertology.tasks.instructions import is_instructions_file, load_instructions
from bertology.tasks.user import is_task_file, load_task_file


def get_task(name: str) -> FinetuneTask:
    """The registered task ``name`` (the built-in ones are registered on first use), or, for a name ending in
    .yaml, .yml or .json, the user's task that file describes (``bertology.tasks.user``), or the instruction-tuning
    mixture it describes when it has an ``instructions:`` section (``bertology.tasks.instructions``)."""
    if is_task_file(name):
        if is_instructions_file(name):
            return load_instructions(name)  # type: ignore[return-value]
        return load_task_file(name)  # a ConfigError naming the file when it is missing or invalid
    key = str(name).lower()
    if key not in TASKS:
        raise ConfigError(f"task.name: unknown task {name!r}; known: {', '.join(sorted(TASKS))}; or the path of a "
                          f"task file (.yaml, .yml, .json)")
    return TASKS[key]
