"""``bertology finetune --task rag``: retrieval-augmented generation (`bertology.retrieval.rag`) trained end to end
on SQuAD questions through the marginal likelihood of their first answer, the generator and the query encoder
updated, the index's passage vectors fixed.

    bertology finetune --task rag --model GEN_DIR --retriever ENC_DIR --index IDX --data SQUAD --out OUT \\
        --set task.k=5 --set task.marginalise=token

``--data`` is read as ``--task squad`` reads it (a folder with the official files, or one file split by article);
``--model`` is an encoder-decoder (BART, T5); ``--retriever`` an encoder whose vectors have the dense index's
width, embedding as the index records. Dev metric: the official SQuAD v1.1 F1 and EM of the generated answers
(RAG-token greedy; RAG-sequence thorough decoding with one beam per passage). ``OUT/model`` is the generator with
``rag.json`` and ``query_encoder/`` beside it (`bertology.retrieval.rag.load_rag`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bertology.errors import ConfigError
from bertology.model.heads import HeadSpec
from bertology.retrieval.rag import (GeneratorInputs, RagExamples, RagLoss, RagOptions, Retriever, check_generator,
                                     check_k, copy_rag, doc_log_prior, open_retriever, rag_generate, save_rag)
from bertology.tasks.lookup import get_task


class RagTask:
    """``finetune --task rag`` (see the module docstring). Unbound (as registered) it names its metrics and files;
    `configure(task_config)` binds it to the retriever, the index and the options of one run, `for_model` to the
    generator."""

    metrics = ("f1", "exact_match")
    predictions_file = "dev_predictions.json"
    max_length = 384

    def __init__(self, retriever: Retriever | None = None, options: RagOptions | None = None,
                 index_dir: str | None = None, start_id: int | None = None, head: HeadSpec | None = None) -> None:
        self.name = "rag"
        self.retriever, self.options, self.index_dir = retriever, options or RagOptions(), index_dir
        self.start_id, self.head = start_id, head
        self.objective: RagLoss | None = None
        self.inputs: GeneratorInputs | None = None

    # ---------------------------------------------------------------------------------------------- binding
    def configure(self, task: Any) -> RagTask:
        """This task for a run's ``task`` section: ``retriever`` and ``index`` (required), ``k``,
        ``marginalise``, ``temperature``."""
        for key, flag in (("retriever", "--retriever"), ("index", "--index")):
            if not getattr(task, key, None):
                raise ConfigError(f"task.{key}: --task rag needs {flag} DIR (the query encoder and the dense "
                                  f"passage index)")
        options = RagOptions(k=task.k, marginalise=task.marginalise, temperature=task.temperature)
        retriever = open_retriever(task.retriever, task.index)
        check_k(options.k, retriever)
        return RagTask(retriever, options, str(task.index))

    def for_model(self, model: Any) -> RagTask:
        from bertology.tasks.text_to_text import lm_head, start_token

        check_generator(model)
        if self.retriever is None:
            raise ConfigError("task rag: needs its retriever and index (finetune --task rag --retriever DIR --index "
                              "DIR); a fine-tuned RAG model answers with bertology generate or evaluate --task "
                              "open-qa --generator DIR")
        return RagTask(self.retriever, self.options, self.index_dir, start_token(model), lm_head(model.config))

    # ------------------------------------------------------------------------------------------ the task
    def path(self, data: str, split: str) -> Path:
        return get_task("squad").path(data, split)

    def read(self, path: Path, limit: int | None = None) -> list[Any]:
        return get_task("squad").read(path, limit)

    def label_names(self) -> None:
        return None

    def heads(self, config: Any) -> list[HeadSpec]:
        from bertology.tasks.text_to_text import lm_head

        return [lm_head(config)]

    def objectives(self, heads: Sequence[HeadSpec]) -> list[RagLoss]:
        assert self.retriever is not None and self.inputs is not None and self.start_id is not None
        self.objective = RagLoss(self.retriever, self.inputs, self.options, heads[0], self.start_id)
        return [self.objective]

    def encode(self, tokenizer: Any, examples: Sequence[Any], max_length: int, *, train: bool,
               seed: int = 0) -> RagExamples:
        if self.retriever is None:
            raise ConfigError("task rag: configure it with the retriever and the index first (RagTask.configure)")
        if self.inputs is None or self.inputs.max_length != max_length:
            self.inputs = GeneratorInputs(tokenizer, self.retriever.passages, max_length)
        return RagExamples(self.retriever, self.inputs, examples, shuffle=train, seed=seed)

    @torch.no_grad()
    def predict(self, model: Any, encoded: RagExamples, examples: Sequence[Any], batch_size: int) -> list[str]:
        assert self.retriever is not None
        device = next(model.parameters()).device
        training = self.retriever.training
        self.retriever.eval()
        out = [""] * len(encoded)
        try:
            for batch in encoded.batches(0, batch_size, drop_last=False):
                batch = batch.to(device)
                scores, rows = self.retriever.scores(batch.input_ids, batch.attention_mask, batch.token_type_ids,
                                                     batch.summary, self.options.k)
                ids, mask = encoded.inputs.batch(batch.questions(), rows)
                tokens = rag_generate(model, ids.to(device), mask.to(device),
                                      doc_log_prior(scores, self.options.temperature), self.options.marginalise,
                                      start_id=self.start_id)
                for index, answer in zip(batch.example_ids.tolist(), tokens):
                    out[index] = encoded.inputs.tokenizer.decode(answer, skip_special_tokens=True).strip()
        finally:
            self.retriever.train(training)
        return out

    def scores(self, predictions: Sequence[str], examples: Sequence[Any]) -> dict[str, float]:
        return get_task("squad").scores(predictions, examples)

    def write(self, path: Path, predictions: Sequence[str], examples: Sequence[Any]) -> None:
        get_task("squad").write(path, predictions, examples)

    def evaluate(self, predictions_path: Path, gold_path: Path) -> dict[str, Any]:
        return get_task("squad").evaluate(predictions_path, gold_path)

    # ---------------------------------------------------------------------- what is saved with the model
    def save_with_model(self, directory: Path) -> None:
        """The query encoder as it is now and ``rag.json``, into a model directory being written."""
        assert self.retriever is not None and self.index_dir is not None and self.inputs is not None
        save_rag(directory, self.retriever, self.options, self.index_dir, self.inputs.max_length)

    def keep_with_model(self, best: Path, final: Path) -> None:
        """The kept (best) model's query encoder and ``rag.json`` beside the final generator."""
        copy_rag(best, final)


RAG = RagTask()  # registered from bertology.builtins
