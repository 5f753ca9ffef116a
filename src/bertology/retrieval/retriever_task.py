"""Dense retriever training (DPR, Karpukhin et al. 2020) as a fine-tuning task: ``retrieval`` (cosine similarity
over a temperature, sentence-transformers' MultipleNegativesRankingLoss) and ``retrieval-dot`` (DPR's plain dot
product).

A bi-encoder with one shared encoder: a query and a passage are each the mean of the encoder's last layer over
their real tokens, specials included (what `bertology index build` embeds for a model without sentence-transformers
settings), truncated at ``task.max_length`` (256). For a batch of B queries, the candidates are the B positives
and every hard negative of the batch; the loss of query i is the cross-entropy of its scores against those
candidates, its own positive the target (in-batch negatives plus hard negatives). The score is the cosine divided
by the temperature (0.05, MultipleNegativesRankingLoss's scale 20) or the dot product. A candidate whose text is
query i's own positive, in another row (two questions on one paragraph), is left out of query i's softmax: it is
no negative.

Data (``--data``):

- SQuAD, exactly as ``--task squad`` takes it (a folder with the official files, or one file split by article):
  each question, its own paragraph as the positive, and ``hard_negatives`` (1) of BM25's top paragraphs of the
  same split (bm25s, `bertology.retrieval.SparseIndex`) that hold none of its answers (DPR's string match) and are
  not its own.
- a folder with ``train.jsonl`` and ``dev.jsonl``, one ``{"query", "positive", "negatives"}`` object a line
  (``negatives``: a list of passage texts, may be empty; ``answers``: optional strings that the positive must
  contain by DPR's match, else the line is refused; ``id`` optional).

Dev metrics (x100): MRR@10 (selects the kept model), recall@1/5/20 of each dev query's own positive among all
distinct dev passages (positives and negatives). Predictions: ``dev_rankings.jsonl``, per query its id, its
positive's passage id and its first 100 passage ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from bertology.data.corpus import read_lines
from bertology.errors import ConfigError, DataError
from bertology.inputs import check_unicode, json_object
from bertology.io import atomic_write
from bertology.model.heads import HeadSpec
from bertology.objectives.base import Objective, ObjectiveOutput, Passes, count, ratio
from bertology.tasks.lookup import get_task

JSONL_FILES = {"train": "train.jsonl", "dev": "dev.jsonl"}
RANKING_DEPTH = 100
KS = (1, 5, 20)


@dataclass(frozen=True)
class RetrievalExample:
    """A query, its positive passage, its hard negatives (texts) and the answers the positive holds (if known)."""

    id: str
    query: str
    positive: str
    negatives: tuple[str, ...] = ()
    answers: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------------- readers
def read_pairs(path: str | Path, limit: int | None = None) -> list[RetrievalExample]:
    """The examples of a JSON-lines file of ``{"query", "positive", "negatives", "answers"?, "id"?}`` objects;
    every error names the file and the line."""
    from bertology.retrieval.evaluate import has_answer

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: {'is a directory' if path.is_dir() else 'no such file'}")
    examples: list[RetrievalExample] = []
    seen: dict[str, int] = {}
    for number, line in read_lines(path, "utf-8"):
        if not line.strip():
            continue
        where = f"{path}: line {number}"
        record = json_object(line, where)  # invalid JSON, too deep, not an object: errors naming the line
        check_unicode(record, where)
        for key in ("query", "positive"):
            if not isinstance(record.get(key), str) or not record[key].strip():
                raise DataError(f"{where}: field {key!r} must be a non-empty string")
        negatives = record.get("negatives", [])
        if not isinstance(negatives, list) or not all(isinstance(n, str) and n.strip() for n in negatives):
            raise DataError(f"{where}: field 'negatives' must be a list of non-empty strings")
        answers = record.get("answers", [])
        if not isinstance(answers, list) or not all(isinstance(a, str) and a.strip() for a in answers):
            raise DataError(f"{where}: field 'answers' must be a list of non-empty strings")
        if answers and not has_answer(answers, record["positive"]):
            raise DataError(f"{where}: the positive passage holds none of the answers {answers[:3]} (DPR's string "
                            f"match); fix the pair or leave 'answers' out")
        key = str(record.get("id", f"line-{number}"))
        if key in seen:
            raise DataError(f"{where}: id {key!r} repeats the one on line {seen[key]}")
        seen[key] = number
        examples.append(RetrievalExample(key, record["query"], record["positive"], tuple(negatives), tuple(answers)))
        if limit is not None and len(examples) >= limit:
            break
    if not examples:
        raise DataError(f"{path}: no examples")
    return examples


def squad_pairs(questions: Sequence[Any], hard_negatives: int, source: str) -> list[RetrievalExample]:
    """SQuAD questions with their own paragraph as the positive and BM25's best paragraphs of the same questions'
    file that hold none of the answers as hard negatives."""
    from bertology.retrieval.evaluate import has_answer
    from bertology.retrieval.sparse import SparseIndex

    if not questions:
        raise DataError(f"{source}: no questions")
    contexts = list(dict.fromkeys(q.context for q in questions))
    negatives: list[tuple[str, ...]] = [() for _ in questions]
    if hard_negatives > 0 and len(contexts) > 1:
        bm25 = SparseIndex.build([{"id": str(i), "text": c} for i, c in enumerate(contexts)])
        _, rows = bm25.rank([q.question for q in questions], min(len(contexts), hard_negatives + 20))
        for i, (question, ranked) in enumerate(zip(questions, rows)):
            answers = [a.text for a in question.answers]
            picked = [contexts[r] for r in ranked.tolist()
                      if contexts[r] != question.context and not has_answer(answers, contexts[r])]
            negatives[i] = tuple(picked[:hard_negatives])
    return [RetrievalExample(q.id, q.question, q.context, negatives[i], tuple(a.text for a in q.answers))
            for i, q in enumerate(questions)]


# --------------------------------------------------------------------------------------------------- batches
@dataclass
class RetrievalBatch:
    """Queries then passages in one padded batch: rows ``[0, queries)`` are the queries, row ``queries + i`` is
    query i's positive, the rows after them the batch's hard negatives. ``passage_keys [P]`` and ``query_keys [B]``
    number distinct passage texts (a query's positive has its key), ``example_ids [B]`` index the examples."""

    input_ids: Tensor
    attention_mask: Tensor
    passage_keys: Tensor
    query_keys: Tensor
    example_ids: Tensor

    @property
    def queries(self) -> int:
        return int(self.query_keys.shape[0])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> RetrievalBatch:
        return RetrievalBatch(*(t.to(device, non_blocking=non_blocking) for t in (
            self.input_ids, self.attention_mask, self.passage_keys, self.query_keys, self.example_ids)))

    def __len__(self) -> int:
        return self.queries


class ShuffledBatches:
    """The batch plan of a ``BatchSource`` whose examples are tokenised once: training order a permutation seeded by
    ``(seed, epoch)`` (whole batches only with ``drop_last``), dealt round-robin to ranks, so each batch is a pure
    function of epoch, index, rank and world size and runs resume exactly; without ``shuffle`` the examples in
    order. A subclass holds ``shuffle`` and ``seed`` and gives ``__len__`` and ``collate(rows)``."""

    shuffle: bool
    seed: int

    def __len__(self) -> int:
        raise NotImplementedError

    def collate(self, rows: np.ndarray) -> Any:
        raise NotImplementedError

    def _order(self, epoch: int, batch_size: int, rank: int, world_size: int, drop_last: bool) -> list[np.ndarray]:
        if batch_size < 1 or world_size < 1 or not 0 <= rank < world_size:
            raise ConfigError(f"batch_size {batch_size}, rank {rank} of {world_size}: invalid")
        n = len(self)
        order = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
        if drop_last and self.shuffle:
            order = order[: n // (batch_size * world_size) * batch_size * world_size]
        order = order[rank::world_size]
        chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
        return [c for c in chunks if len(c) == batch_size] if drop_last and self.shuffle else chunks

    def num_batches(self, epoch: int, batch_size: int, rank: int = 0, world_size: int = 1,
                    drop_last: bool = True) -> int:
        return len(self._order(epoch, batch_size, rank, world_size, drop_last))

    def batches(self, epoch: int, batch_size: int, start_batch: int = 0, rank: int = 0, world_size: int = 1,
                drop_last: bool = True) -> Iterator[Any]:
        plan = self._order(epoch, batch_size, rank, world_size, drop_last)
        return (self.collate(rows) for rows in plan[start_batch:])


class RetrievalBatches(ShuffledBatches):
    """Retrieval examples tokenised once, as a ``BatchSource`` (the plan: ``ShuffledBatches``)."""

    def __init__(self, tokenizer: Any, examples: Sequence[RetrievalExample], max_length: int, *,
                 shuffle: bool, seed: int = 0) -> None:
        self.tokenizer, self.examples, self.max_length = tokenizer, list(examples), max_length
        self.shuffle, self.seed = shuffle, seed
        texts = list(dict.fromkeys(t for e in self.examples for t in (e.positive, *e.negatives)))
        self.key = {text: i for i, text in enumerate(texts)}
        self.passage_ids = _encode(tokenizer, texts, max_length)
        self.query_ids = [e.ids for e in tokenizer.encode_batch([e.query for e in self.examples]).encodings]
        for example, ids in zip(self.examples, self.query_ids):
            if len(ids) > max_length:
                raise DataError(f"query {example.id!r}: {len(ids)} tokens, more than the {max_length} the model "
                                f"reads (task.max_length or its positions); shorten it or drop the example")
        self.pad_id = tokenizer.fill_id

    def __len__(self) -> int:
        return len(self.examples)


    def collate(self, rows: np.ndarray) -> RetrievalBatch:
        examples = [self.examples[int(r)] for r in rows]
        positives = [self.key[e.positive] for e in examples]
        negatives = [self.key[n] for e in examples for n in e.negatives]
        sequences = [self.query_ids[int(r)] for r in rows] + [self.passage_ids[k] for k in positives + negatives]
        width = max(len(s) for s in sequences)
        ids = torch.full((len(sequences), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for i, sequence in enumerate(sequences):
            ids[i, :len(sequence)] = torch.tensor(sequence, dtype=torch.long)
            mask[i, :len(sequence)] = 1
        return RetrievalBatch(ids, mask, torch.tensor(positives + negatives, dtype=torch.long),
                              torch.tensor(positives, dtype=torch.long), torch.from_numpy(rows.astype(np.int64)))


def _encode(tokenizer: Any, texts: Sequence[str], max_length: int) -> list[list[int]]:
    ids: list[list[int]] = []
    for start in range(0, len(texts), 2048):
        batch = tokenizer.encode_batch(list(texts[start:start + 2048]), max_length=max_length)
        ids.extend(e.ids for e in batch.encodings)
    return ids


# ------------------------------------------------------------------------------------------------- objective
def mean_vectors(hidden: Tensor, mask: Tensor) -> Tensor:
    """The mean of each row's real tokens' vectors [B, H] (embed's ``sentence="mean"``)."""
    weights = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * weights).sum(1) / weights.sum(1).clamp_min(1.0)


def contrastive_logits(queries: Tensor, passages: Tensor, similarity: str, temperature: float) -> Tensor:
    """Scores [B, P] of every query against every candidate: cosine / temperature, or the dot product."""
    if similarity == "cosine":
        return F.normalize(queries, dim=-1) @ F.normalize(passages, dim=-1).T / temperature
    return queries @ passages.T


@dataclass
class ContrastiveRetrieval(Objective):
    """In-batch and hard negatives' cross-entropy of a bi-encoder (see the module docstring). Stats:
    ``retrieval_units`` (queries), ``retrieval_loss_sum``, ``retrieval_correct`` (queries whose positive scores
    highest in the batch)."""

    similarity: Literal["cosine", "dot"] = "cosine"
    temperature: float = 0.05
    name: str = "retrieval"
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.similarity not in ("cosine", "dot"):
            raise ConfigError(f"retrieval similarity: expected cosine or dot, got {self.similarity!r}")
        if not self.temperature > 0:
            raise ConfigError(f"retrieval temperature: must be > 0, got {self.temperature}")

    def heads(self) -> Sequence[HeadSpec]:
        return []

    def reads(self, batch: RetrievalBatch) -> Tensor | None:
        return None  # every token: the mean over the last layer

    def units(self, batch: RetrievalBatch) -> Tensor:
        return count(batch.queries, batch.input_ids.device)

    def __call__(self, passes: Passes, batch: RetrievalBatch) -> ObjectiveOutput:
        vectors = mean_vectors(passes.shared.last_hidden_state, batch.attention_mask)
        b = batch.queries
        logits = contrastive_logits(vectors[:b], vectors[b:], self.similarity, self.temperature)
        # another row holding this query's own positive text is no negative
        same = batch.passage_keys[None, :] == batch.query_keys[:, None]
        own = torch.zeros_like(same)
        own[torch.arange(b), torch.arange(b)] = True
        logits = logits.masked_fill(same & ~own, float("-inf"))
        target = torch.arange(b, device=logits.device)
        loss_sum = F.cross_entropy(logits.float(), target, reduction="sum")
        with torch.no_grad():
            correct = (logits.argmax(-1) == target).sum()
        return ObjectiveOutput(loss_sum, {f"{self.name}_units": count(b, logits.device),
                                          f"{self.name}_loss_sum": loss_sum.detach().float(),
                                          f"{self.name}_correct": correct})

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        units = totals.get(f"{self.name}_units", 0.0)
        return {f"{self.name}_loss": ratio(totals.get(f"{self.name}_loss_sum", 0.0), units),
                f"{self.name}_accuracy": ratio(totals.get(f"{self.name}_correct", 0.0), units)}


# ------------------------------------------------------------------------------------------------------ task
def ranking_scores(predictions: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """MRR@10 and recall@1/5/20 (x100) of rankings ``{"positive": id, "ranking": [ids]}``."""
    if not predictions:
        raise DataError("no rankings to score")
    reciprocal = 0.0
    found = {k: 0 for k in KS}
    for prediction in predictions:
        ranking = list(prediction["ranking"])
        rank = ranking.index(prediction["positive"]) if prediction["positive"] in ranking else None
        if rank is not None and rank < 10:
            reciprocal += 1.0 / (rank + 1)
        for k in KS:
            found[k] += rank is not None and rank < k
    n = len(predictions)
    return {"mrr@10": 100.0 * reciprocal / n, **{f"recall@{k}": 100.0 * found[k] / n for k in KS}}


class RetrievalTask:
    """``finetune --task retrieval`` (see the module docstring)."""

    metrics = ("mrr@10", "recall@1", "recall@5", "recall@20")
    predictions_file = "dev_rankings.jsonl"
    max_length = 256

    def __init__(self, name: str = "retrieval", similarity: str = "cosine", temperature: float = 0.05,
                 hard_negatives: int = 1) -> None:
        self.name, self.similarity, self.temperature, self.hard_negatives = name, similarity, temperature, \
            hard_negatives

    def path(self, data: str, split: str) -> Path:
        root = Path(data)
        if root.is_dir() and all((root / f).is_file() for f in JSONL_FILES.values()):
            return root / JSONL_FILES[split]
        return get_task("squad").path(data, split)

    def read(self, path: Path, limit: int | None = None) -> list[RetrievalExample]:
        if Path(path).suffix == ".jsonl":
            return read_pairs(path, limit)
        questions = get_task("squad").read(path)
        questions = questions if limit is None else questions[:limit]
        return squad_pairs(questions, self.hard_negatives, str(path))

    def label_names(self) -> tuple[str, ...] | None:
        return None

    def heads(self, config: Any) -> list[HeadSpec]:
        return []

    def objectives(self, heads: Sequence[HeadSpec]) -> list[ContrastiveRetrieval]:
        return [ContrastiveRetrieval(self.similarity, self.temperature)]

    def encode(self, tokenizer: Any, examples: Sequence[RetrievalExample], max_length: int, *, train: bool,
               seed: int = 0) -> RetrievalBatches:
        return RetrievalBatches(tokenizer, examples, max_length, shuffle=train, seed=seed)

    def predict(self, model: Any, encoded: RetrievalBatches, examples: Sequence[RetrievalExample],
                batch_size: int) -> list[dict[str, Any]]:
        from bertology.embeddings import embed

        texts = list(encoded.key)
        options = dict(tokenizer=encoded.tokenizer, sentence="mean", levels=("sentence",), batch_size=batch_size,
                       max_length=encoded.max_length, long_texts="truncate", normalize=self.similarity == "cosine")
        passages = embed(model, texts, **options).sentences
        queries = embed(model, [e.query for e in examples], **options).sentences
        scores = queries @ passages.T
        order = np.argsort(-scores, axis=1, kind="stable")[:, :RANKING_DEPTH]
        return [{"id": e.id, "positive": f"p{encoded.key[e.positive]}", "ranking": [f"p{r}" for r in row.tolist()]}
                for e, row in zip(examples, order)]

    def scores(self, predictions: Sequence[Mapping[str, Any]], examples: Sequence[RetrievalExample]
               ) -> dict[str, float]:
        return ranking_scores(predictions)

    def write(self, path: Path, predictions: Sequence[Mapping[str, Any]],
              examples: Sequence[RetrievalExample]) -> None:
        with atomic_write(path, "w", encoding="utf-8") as handle:
            for prediction in predictions:
                handle.write(json.dumps(prediction, ensure_ascii=False) + "\n")

    def evaluate(self, predictions_path: Path, gold_path: Path | None) -> dict[str, Any]:
        rows = []
        for number, line in read_lines(Path(predictions_path), "utf-8"):
            if not line.strip():
                continue
            row = json_object(line, f"{predictions_path}: line {number}")
            if not isinstance(row.get("ranking"), list) or "positive" not in row:
                raise DataError(f"{predictions_path}: line {number}: expected {{\"id\", \"positive\", \"ranking\"}}")
            rows.append(row)
        if gold_path is not None:
            gold = [e.id for e in self.read(Path(gold_path))]
            if [r.get("id") for r in rows] != gold:
                raise DataError(f"{predictions_path}: its queries are not those of {gold_path} ({len(rows)} rankings, "
                                f"{len(gold)} questions)")
        return {**ranking_scores(rows), "queries": len(rows)}


RETRIEVAL = RetrievalTask()  # registered from bertology.builtins
RETRIEVAL_DOT = RetrievalTask("retrieval-dot", similarity="dot")
