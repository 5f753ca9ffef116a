"""What a fine-tuning task is to the recipe (``bertology.recipes.finetune``): where its files are and how to read
them, its heads and objectives, how its examples become batches, and how predictions are made, scored, and
written in the task's own format. A new task is one class registered here; the recipe and the training loop do
not change.

    class MyTask:  # the FinetuneTask protocol
        name = "mytask"; metrics = ("accuracy",); predictions_file = "dev_predictions.tsv"
        ...
    register_task(MyTask())
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from bertology.errors import ConfigError
from bertology.model.config import EncoderConfig
from bertology.model.heads import HeadSpec
from bertology.model.protocol import Model
from bertology.objectives.base import Objective
from bertology.tokenization import Tokenizer
from bertology.training.trainer import BatchSource


class FinetuneTask(Protocol):
    """A task the fine-tuning recipe can train, select on, predict and score."""

    name: str
    metrics: tuple[str, ...]  # dev metrics by name (x100, as the task's papers report them); the first selects
    predictions_file: str  # the file name of the dev predictions in the run directory

    def path(self, data: str, split: str) -> Path:
        """The file of ``split`` ("train", "dev") under the task's data folder ``data``."""
        ...

    def read(self, path: Path, limit: int | None = None) -> Sequence[Any]:
        """The examples of a file (the first ``limit`` only, when given)."""
        ...

    def label_names(self) -> tuple[str, ...] | None:
        """The task's label names in id order (written to config.json), None when there are none (regression)."""
        ...

    def heads(self, config: EncoderConfig) -> list[HeadSpec]:
        """The heads the task puts on an encoder of this config (the first is the primary one)."""
        ...

    def objectives(self, heads: Sequence[HeadSpec]) -> list[Objective]:
        """The training objectives on those heads."""
        ...

    def encode(self, tokenizer: Tokenizer, examples: Sequence[Any], max_length: int, *, train: bool,
               seed: int = 0) -> BatchSource:
        """Batches of the examples: shuffled, resumable and labelled for training (``train``), in an order cheap to
        run otherwise (labels kept when the examples have them, for the held-out loss)."""
        ...

    def predict(self, model: Model, encoded: BatchSource, examples: Sequence[Any],
                batch_size: int) -> list[Any]:
        """One prediction per example, in the examples' order."""
        ...

    def scores(self, predictions: Sequence[Any], examples: Sequence[Any]) -> dict[str, float]:
        """The task's metrics (x100) of predictions against the examples' gold labels."""
        ...

    def write(self, path: Path, predictions: Sequence[Any], examples: Sequence[Any]) -> None:
        """The predictions in the task's own file format (what ``bertology evaluate`` reads), written atomically."""
        ...

    def evaluate(self, predictions_path: Path, gold_path: Path) -> dict[str, Any]:
        """The official scoring of a written predictions file against the gold file (``bertology evaluate``)."""
        ...

    # Optional: ``extend_model(model)`` adds modules a task's predictions need beyond heads (through
    # ``model.add_extension``, so the native format saves and rebuilds them), before the weights are set.
    # Optional: ``for_model(model)`` returns the task as it runs on that model (GLUE and SQuAD on an encoder-decoder
    # without a classifier or a span head for them become text-to-text: ``bertology.tasks.text_to_text``).
    # Optional: ``labels_input_tokens = True`` (tagging): on an encoder-decoder the encoder alone is fine-tuned.
    # Optional: ``config_label_names()``: what the labels mean, when ``label_names`` are a file's codes (SST-2's
    # 0/1: negative/positive); config.json's ``id2label`` takes these (``bertology.pipeline`` reports them).
    # Optional: ``read_input(path)`` reads what ``bertology predict`` is given when that may be more than ``read``
    # takes (CoNLL tagging: a file of words only, without tags); without it ``predict`` reads with ``read``.


TASKS: dict[str, FinetuneTask] = {}


def register_task(task: FinetuneTask) -> FinetuneTask:
    """Make ``task`` available to ``bertology finetune --task NAME`` and ``predict``."""
    TASKS[task.name] = task
    return task


def get_task(name: str) -> FinetuneTask:
    """The registered task ``name`` (the built-in ones are registered on first use), or, for a name ending in
    .yaml, .yml or .json, the user's task that file describes (``bertology.tasks.user``)."""
    from bertology.tasks.user import is_task_file, load_task_file

    if is_task_file(name):
        return load_task_file(name)  # a ConfigError naming the file when it is missing or invalid
    from bertology.tasks import glue  # noqa: F401  (registers sst2, cola, mrpc, rte, stsb)
    from bertology.tasks import qa  # noqa: F401  (registers squad)
    from bertology.tasks import tagging  # noqa: F401  (registers conll2003)
    from bertology.tasks import spans  # noqa: F401  (registers conll2003-spans)
    from bertology.tasks import cloze  # noqa: F401  (registers sst2-cloze, rte-cloze)
    from bertology.tasks import retrieval  # noqa: F401  (registers retrieval, retrieval-dot)
    from bertology.tasks import rerank  # noqa: F401  (registers rerank)

    key = str(name).lower()
    if key not in TASKS:
        raise ConfigError(f"task.name: unknown task {name!r}; known: {', '.join(sorted(TASKS))}; or the path of a "
                          f"task file (.yaml, .yml, .json)")
    return TASKS[key]
