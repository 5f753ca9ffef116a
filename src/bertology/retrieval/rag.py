"""Retrieval-augmented generation (RAG, Lewis et al. 2020): a query encoder over a fixed dense passage index, the
top k passages z of a question x with scores s(x, z) = q(x) . z, and an encoder-decoder generator reading each
passage with the question.

    p(z|x)              = softmax over the top k of s(x, z) / temperature          (log space: log_softmax)
    RAG-sequence p(y|x) = sum_z p(z|x) prod_i p(y_i | x, z, y_<i)     log: logsumexp_z(log p(z|x) + sum_i log p_i)
    RAG-token    p(y|x) = prod_i sum_z p(z|x) p(y_i | x, z, y_<i)     log: sum_i logsumexp_z(log p(z|x) + log p_i)

The query vector q(x) is made as the index embeds its queries (the options its ``index.json`` records: the last
layer's mean, [CLS] or max over the framed tokens, L2-normalised), so s(x, z) is the score the index itself gives
(`Index.search`); the passage vectors are the index's, read once and never recomputed: only the query encoder gets
gradient, through p(z|x), as the paper trains it. Retrieval during training is exact inner product over those
vectors (what an exact index searches).

The generator reads, for each passage, RAG's input without a title (bertology's passages have none): the tokens of
the passage text, then those of ``" //"``, then those of ``" " + question`` (each part tokenised alone), framed with
the generator family's specials; the passage's tokens are cut at the end so that the whole fits the generator's
length. Targets are the answer's tokens as text-to-text SQuAD has them (``bertology.tasks.text_to_text``).

Decoding: RAG-token by the marginal next-token distribution through `bertology.generation`'s greedy and beam search
(`MarginalStepper`); RAG-sequence by "thorough" decoding: a beam search per passage gives the candidates, each
candidate is scored by its marginal log-likelihood over all k passages (teacher forcing), the best kept.

Saved beside a fine-tuned generator (``OUT/model``): ``rag.json`` (the index directory, k, marginalisation,
temperature) and ``query_encoder/`` (the trained query encoder, a bertology model directory); `load_rag` reads them
back (`bertology generate`, `evaluate --task open-qa --generator`).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertology.config import to_mapping, validate
from bertology.errors import ConfigError, DataError
from bertology.inputs import json_value
from bertology.io import atomic_directory, atomic_write
from bertology.model import Pretrained
from bertology.model.protocol import ENCODER_DECODER, GENERATES, capabilities, model_kind, require
from bertology.objectives.base import Objective, ObjectiveOutput, Passes, count, ratio
from bertology.retrieval.retriever_task import ShuffledBatches

RAG_FILE = "rag.json"
RAG_FORMAT = "bertology-rag"
RAG_VERSION = 1
QUERY_ENCODER_DIR = "query_encoder"
SEPARATOR = " //"  # between the passage and the question, as RAG's doc_sep (" // ")
MARGINALISATIONS = ("token", "sequence")


# --------------------------------------------------------------------------------------------------- options
@dataclass(frozen=True)
class RagOptions:
    """``k`` passages per question, ``marginalise`` ``token`` (RAG-token) or ``sequence`` (RAG-sequence),
    ``temperature`` dividing s(x, z) in p(z|x) (1: the plain inner product)."""

    k: int = 5
    marginalise: Literal["token", "sequence"] = "token"
    temperature: float = 1.0

    def __post_init__(self) -> None:
        validate(self, "task")
        if self.k < 1:
            raise ConfigError(f"task.k: must be >= 1, got {self.k}")
        if not self.temperature > 0:
            raise ConfigError(f"task.temperature: must be > 0, got {self.temperature}")


# ------------------------------------------------------------------------------------------- query encoder
class QueryEncoder(nn.Module):
    """A bertology encoder making query vectors as a dense index embeds its queries, differentiably: the framed
    tokens' last layer pooled by the index's ``sentence`` option (mean, cls, max), L2-normalised. `where` names
    the index in errors."""

    def __init__(self, pretrained: Pretrained, options: Any, where: str) -> None:
        super().__init__()
        from bertology.embeddings.backbone import as_backbone
        from bertology.embeddings.sentence_config import read_sentence_config
        from bertology.retrieval.index import SENTENCE_TRANSFORMERS

        if options.layers not in ("last", -1) or options.combine is not None:
            raise ConfigError(f"{where}: the index embeds with layers {options.layers!r} (combine "
                              f"{options.combine!r}); a RAG query encoder reads the last layer alone")
        if pretrained.tokenizer is None:
            raise ConfigError(f"{where}: the query encoder has no tokenizer files")
        settings = read_sentence_config(pretrained.directory) if options.source == SENTENCE_TRANSFORMERS \
            and getattr(pretrained, "directory", None) else None
        if settings is not None and settings.default_prompt is not None:
            raise ConfigError(f"{where}: the query encoder's sentence-transformers settings prepend a prompt "
                              f"({settings.default_prompt!r}); RAG's query encoder does not apply prompts")
        self.pretrained = pretrained
        self.backbone = as_backbone(pretrained, pretrained.tokenizer)
        self.options = options
        self.lower = settings is not None and settings.lower_case

    @property
    def model(self) -> Any:
        return self.pretrained.model

    @property
    def dim(self) -> int:
        return int(self.backbone.hidden_size)

    def tokenize(self, questions: Sequence[str]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """ids, mask, segment ids [B, L] (right-padded) and the summary position [B] of each question; a question
        longer than the encoder reads (or the index's max_length) is refused, as the index refuses it."""
        from bertology.retrieval.index import check_query_lengths

        check_query_lengths(self.pretrained, questions, self.options.max_length)
        tokenizer = self.pretrained.tokenizer
        framed = [self.backbone.frame(tokenizer.encode(q.lower() if self.lower else q,
                                                       add_special_tokens=False).ids) for q in questions]
        width = max(len(f.ids) for f in framed)
        ids = torch.full((len(framed), width), self.backbone.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        types = torch.zeros_like(ids)
        for row, f in enumerate(framed):
            ids[row, :len(f.ids)] = torch.tensor(f.ids)
            mask[row, :len(f.ids)] = 1
            if f.type_ids is not None:
                types[row, :len(f.ids)] = torch.tensor(f.type_ids)
        summary = torch.tensor([f.summary if f.summary is not None else 0 for f in framed], dtype=torch.long)
        return ids, mask, types, summary

    def forward(self, ids: Tensor, mask: Tensor, types: Tensor, summary: Tensor) -> Tensor:
        hidden = self.backbone.hidden_states(ids, mask, types)[-1]
        if hidden.dtype in (torch.float16, torch.bfloat16):
            hidden = hidden.float()
        weights = mask.to(hidden.dtype).unsqueeze(-1)
        if self.options.sentence == "cls":
            pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), summary]
        elif self.options.sentence == "max":
            pooled = hidden.masked_fill(weights == 0, float("-inf")).max(1).values
        else:
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp_min(1.0)
        return F.normalize(pooled, dim=-1)


class Retriever(nn.Module):
    """The query encoder over an index's fixed passage vectors (a buffer, not a parameter: they get no gradient
    and are not saved). `scores` gives the top k scores s(x, z) (differentiable in the query encoder) and rows."""

    def __init__(self, encoder: QueryEncoder, index: Any, where: str) -> None:
        super().__init__()
        vectors = np.asarray(index.vectors(), dtype=np.float32)
        if vectors.shape[1] != encoder.dim:
            raise ConfigError(f"{where}: the index's vectors have {vectors.shape[1]} dimensions; the query encoder "
                              f"({encoder.pretrained.directory or 'given'}) makes {encoder.dim}: use the encoder "
                              f"the index was built with, or one of its size")
        self.encoder = encoder
        self.index = index
        self.where = where
        self.passages = list(index.passages)
        self.register_buffer("passage_vectors", torch.from_numpy(vectors), persistent=False)

    def __len__(self) -> int:
        return len(self.passages)

    def scores(self, ids: Tensor, mask: Tensor, types: Tensor, summary: Tensor, k: int) -> tuple[Tensor, Tensor]:
        queries = self.encoder(ids, mask, types, summary)
        every = queries @ self.passage_vectors.to(queries.dtype).T  # [B, N]: exact inner product over the fixed vectors
        top = every.topk(k, dim=-1)
        return top.values, top.indices


# ------------------------------------------------------------------------------------------ generator input
class GeneratorInputs:
    """Builds the generator's input for (question, passage) pairs: passage tokens + `SEPARATOR` tokens +
    question tokens, framed, the passage cut to fit `max_length`. Passage tokens are computed once."""

    def __init__(self, tokenizer: Any, passages: Sequence[Any], max_length: int) -> None:
        self.tokenizer, self.max_length = tokenizer, max_length
        self.framing = tokenizer.framing
        self.overhead = len(self.framing.frame([]).ids)
        self.separator = tokenizer.encode(SEPARATOR, add_special_tokens=False).ids
        texts = [p.text for p in passages]
        self.passage_ids: list[list[int]] = []
        for start in range(0, len(texts), 2048):
            batch = tokenizer.encode_batch(texts[start:start + 2048], add_special_tokens=False)
            self.passage_ids.extend(e.ids for e in batch.encodings)

    def question_ids(self, question: str, where: str) -> list[int]:
        ids = self.tokenizer.encode(" " + question, add_special_tokens=False).ids
        if self.overhead + len(self.separator) + len(ids) > self.max_length:
            raise DataError(f"{where}: the question is {len(ids)} tokens; with the separator and specials it does not "
                            f"fit the generator's {self.max_length} (task.max_length or its positions)")
        return ids

    def pair(self, question: Sequence[int], row: int) -> list[int]:
        tail = [*self.separator, *question]
        budget = self.max_length - self.overhead - len(tail)
        return self.framing.frame([*self.passage_ids[row][:budget], *tail]).ids

    def batch(self, questions: Sequence[Sequence[int]], rows: Tensor) -> tuple[Tensor, Tensor]:
        """[B * k, L] ids and mask, right-padded: row b * k + j is question b with its j-th passage."""
        sequences = [self.pair(q, int(r)) for q, row in zip(questions, rows.tolist()) for r in row]
        width = max(len(s) for s in sequences)
        ids = torch.full((len(sequences), width), self.tokenizer.fill_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, s in enumerate(sequences):
            ids[i, :len(s)] = torch.tensor(s)
            mask[i, :len(s)] = 1
        return ids, mask


# ------------------------------------------------------------------------------------------- marginals
def doc_log_prior(scores: Tensor, temperature: float = 1.0) -> Tensor:
    """log p(z|x) [B, k] from the top-k scores s(x, z) [B, k]."""
    return torch.log_softmax(scores / temperature, dim=-1)


def decoder_inputs(targets: Tensor, target_mask: Tensor, start_id: int, pad_id: int) -> Tensor:
    """Teacher forcing: the start token, then each target but its last token (padding where the target is)."""
    shifted = targets.new_full(targets.shape, pad_id)
    shifted[:, 0] = start_id
    shifted[:, 1:] = torch.where(target_mask[:, :-1].bool(), targets[:, :-1], pad_id)
    return shifted


def token_log_probs(generator: Any, input_ids: Tensor, attention_mask: Tensor, targets: Tensor, target_mask: Tensor,
                    start_id: int) -> Tensor:
    """log p(y_i | input, y_<i) [R, T] of each target token under `generator` (0 at padding)."""
    decoder = decoder_inputs(targets, target_mask, start_id, generator.config.pad_token_id)
    out = generator(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder,
                    decoder_attention_mask=target_mask)
    logits = out.logits
    log_probs = logits.float().log_softmax(-1) if logits.dtype != torch.float64 else logits.log_softmax(-1)
    picked = log_probs.gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    return picked * target_mask.to(picked.dtype)


def marginal_log_likelihood(log_prior: Tensor, token_lp: Tensor, target_mask: Tensor,
                            marginalise: str) -> Tensor:
    """log p(y|x) [B] from log p(z|x) [B, k] and log p(y_i|x, z, y_<i) [B, k, T] (0 at padding, `target_mask`
    [B, T]): RAG-sequence logsumexp_z(log p(z|x) + sum_i), RAG-token sum_i logsumexp_z(log p(z|x) + log p_i)."""
    if marginalise == "sequence":
        return torch.logsumexp(log_prior + token_lp.sum(-1), dim=1)
    if marginalise == "token":
        per_token = torch.logsumexp(log_prior.unsqueeze(-1) + token_lp, dim=1)  # [B, T]
        return (per_token * target_mask.to(per_token.dtype)).sum(-1)
    raise ConfigError(f"task.marginalise: expected token or sequence, got {marginalise!r}")


# ------------------------------------------------------------------------------------------------ decoding
class MarginalStepper:
    """`bertology.generation`'s stepper over B questions x k passages (rows b * k + j) that answers the
    marginal next-token log-probabilities of RAG-token, log sum_z p(z|x) p(y_i | x, z, y_<i) [B, vocab], so that
    its greedy and beam search decode RAG-token. `reorder(rows)` follows the questions' rows (beams)."""

    def __init__(self, generator: Any, input_ids: Tensor, attention_mask: Tensor, log_prior: Tensor) -> None:
        from bertology.generation import Stepper

        self.inner = Stepper(generator, input_ids, attention_mask)
        self.k = log_prior.shape[1]
        self.prior = log_prior.reshape(-1).float()
        self.prefix = self.inner.prefix[::self.k]

    def _rows(self, rows: Tensor) -> Tensor:
        return (rows[:, None] * self.k + torch.arange(self.k, device=rows.device)).flatten()

    def logits(self, ids: Tensor) -> Tensor:
        inner = self.inner.logits(ids.repeat_interleave(self.k, 0)).log_softmax(-1) + self.prior[:, None]
        return inner.view(ids.shape[0], self.k, -1).logsumexp(1)

    def reorder(self, rows: Tensor) -> None:
        expanded = self._rows(rows)
        self.inner.reorder(expanded)
        self.prior = self.prior[expanded]


def answer_tokens(sequence: Sequence[int], eos: Sequence[int]) -> list[int]:
    """A generated decoder sequence without its start token, up to and including its first EOS."""
    tokens = [int(t) for t in sequence[1:]]
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[:i + 1]
    return tokens


@torch.no_grad()
def rag_generate(generator: Any, input_ids: Tensor, attention_mask: Tensor, log_prior: Tensor, marginalise: str,
                 *, max_new_tokens: int = 32, num_beams: int = 1, start_id: int | None = None,
                 eos_token_id: int | Sequence[int] | None = None) -> list[list[int]]:
    """The answer tokens (up to and including EOS) of B questions whose k passages' generator inputs are
    `input_ids` [B * k, L]: RAG-token decoded greedily (``num_beams`` 1) or by beam search over the marginal
    next-token distribution; RAG-sequence by thorough decoding (a ``num_beams`` beam search per passage, its
    ``num_beams`` hypotheses the candidates, the candidate of the largest marginal log-likelihood kept; the first
    seen on a tie). `eos_token_id`: as `bertology.generate` takes it (None: the generator's)."""
    from bertology.generation import beam_search, check_prompts, generate, greedy_or_sample, make_settings

    require(generator, GENERATES, "RAG generation")
    require(generator, ENCODER_DECODER, "RAG generation (an encoder-decoder generator)")
    settings = make_settings(generator.config, max_new_tokens=max_new_tokens, num_beams=num_beams,
                             eos_token_id=eos_token_id)
    eos = settings.eos_token_ids
    batch, k = log_prior.shape
    start = generator.config.decoder_start_token_id if start_id is None else start_id
    training = generator.training
    generator.eval()
    try:
        if marginalise == "token":
            check_prompts(generator, input_ids, attention_mask, max_new_tokens)
            step = MarginalStepper(generator, input_ids, attention_mask, log_prior)
            out = beam_search(step, settings) if num_beams > 1 else greedy_or_sample(step, settings, None)
            return [answer_tokens(row, eos) for row in out.tolist()]
        if marginalise != "sequence":
            raise ConfigError(f"marginalise: expected token or sequence, got {marginalise!r}")
        hypotheses = generate(generator, input_ids, attention_mask, max_new_tokens=max_new_tokens,
                              num_beams=num_beams, num_return_sequences=num_beams, eos_token_id=eos).tolist()
        answers = []
        for b in range(batch):
            candidates: list[list[int]] = []
            for row in hypotheses[b * k * num_beams:(b + 1) * k * num_beams]:
                tokens = answer_tokens(row, eos)
                if tokens and tokens not in candidates:
                    candidates.append(tokens)
            if not candidates:
                answers.append([])
                continue
            scores = sequence_scores(generator, input_ids[b * k:(b + 1) * k], attention_mask[b * k:(b + 1) * k],
                                     log_prior[b], candidates, start)
            answers.append(candidates[int(torch.argmax(scores))])
        return answers
    finally:
        generator.train(training)


def sequence_scores(generator: Any, input_ids: Tensor, attention_mask: Tensor, log_prior: Tensor,
                    candidates: Sequence[Sequence[int]], start_id: int) -> Tensor:
    """RAG-sequence's log p(y|x) [C] of each candidate answer y over one question's k passages (inputs [k, L],
    log p(z|x) [k])."""
    k, count_ = input_ids.shape[0], len(candidates)
    width = max(len(c) for c in candidates)
    device = input_ids.device
    targets = torch.full((count_, width), generator.config.pad_token_id, dtype=torch.long, device=device)
    mask = torch.zeros_like(targets)
    for i, c in enumerate(candidates):
        targets[i, :len(c)] = torch.tensor(list(c), device=device)
        mask[i, :len(c)] = 1
    lp = token_log_probs(generator, input_ids.repeat(count_, 1), attention_mask.repeat(count_, 1),
                         targets.repeat_interleave(k, 0), mask.repeat_interleave(k, 0), start_id)
    return marginal_log_likelihood(log_prior[None, :].expand(count_, k), lp.view(count_, k, -1), mask, "sequence")


# ------------------------------------------------------------------------------------------------- batches
@dataclass
class RagBatch:
    """Questions for the query encoder (``input_ids``, ``attention_mask``, ``token_type_ids``, ``summary``), the
    same questions' generator tokens (``question_ids`` [B, Lq], ``question_lengths`` [B]), the targets [B, T]
    with their mask (all 0 for unlabelled questions) and ``example_ids`` [B]."""

    input_ids: Tensor
    attention_mask: Tensor
    token_type_ids: Tensor
    summary: Tensor
    question_ids: Tensor
    question_lengths: Tensor
    targets: Tensor
    target_mask: Tensor
    example_ids: Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> RagBatch:
        return RagBatch(*(getattr(self, f).to(device, non_blocking=non_blocking) for f in self.__dataclass_fields__))

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def questions(self) -> list[list[int]]:
        return [row[:n] for row, n in zip(self.question_ids.tolist(), self.question_lengths.tolist())]


class RagExamples(ShuffledBatches):
    """SQuAD questions tokenised once (for the query encoder and for the generator) with their first answer as
    the target, as a ``BatchSource`` (the plan: the retriever task's ``ShuffledBatches``)."""

    def __init__(self, retriever: Retriever, inputs: GeneratorInputs, examples: Sequence[Any], *, shuffle: bool,
                 seed: int = 0) -> None:
        from bertology.tasks.text_to_text import MAX_TARGET_TOKENS

        self.examples, self.shuffle, self.seed = list(examples), shuffle, seed
        self.retriever, self.inputs = retriever, inputs
        questions = [e.question for e in self.examples]
        self.encoder_inputs = retriever.encoder.tokenize(questions) if questions else None
        self.question_ids = [inputs.question_ids(e.question, f"question {e.id!r}") for e in self.examples]
        labelled = bool(self.examples) and all(e.answers for e in self.examples)
        tokenizer = inputs.tokenizer
        self.targets = [tokenizer.encode(e.answers[0].text, max_length=MAX_TARGET_TOKENS).ids
                        for e in self.examples] if labelled else None

    def __len__(self) -> int:
        return len(self.examples)


    def collate(self, rows: np.ndarray) -> RagBatch:
        assert self.encoder_inputs is not None
        index = torch.from_numpy(np.asarray(rows, dtype=np.int64))
        ids, mask, types, summary = (t[index] for t in self.encoder_inputs)
        width = int(mask.sum(1).max())
        questions = [self.question_ids[int(r)] for r in rows]
        q_ids = torch.zeros(len(rows), max(len(q) for q in questions), dtype=torch.long)
        for i, q in enumerate(questions):
            q_ids[i, :len(q)] = torch.tensor(q)
        targets = [self.targets[int(r)] for r in rows] if self.targets is not None else [[0] for _ in rows]
        t_ids = torch.zeros(len(rows), max(len(t) for t in targets), dtype=torch.long)
        t_mask = torch.zeros_like(t_ids)
        if self.targets is not None:
            for i, t in enumerate(targets):
                t_ids[i, :len(t)] = torch.tensor(t)
                t_mask[i, :len(t)] = 1
        return RagBatch(ids[:, :width], mask[:, :width], types[:, :width], summary, q_ids,
                        torch.tensor([len(q) for q in questions]), t_ids, t_mask, index)


# ----------------------------------------------------------------------------------------------- objective
class RagLoss(nn.Module, Objective):
    """The negative marginal log-likelihood of each question's target (RAG-token or RAG-sequence), summed over the
    batch's questions (units: questions). It owns the retriever, so the query encoder trains (and checkpoints)
    with the generator; the generator is the trainer's model (``passes.model``). Stats: ``rag_units``,
    ``rag_loss_sum``, ``rag_tokens``, ``rag_prior_top`` (the sum of the best passage's p(z|x))."""

    trains = ("seq2seq",)

    def __init__(self, retriever: Retriever, inputs: GeneratorInputs, options: RagOptions, head: Any,
                 start_id: int) -> None:
        nn.Module.__init__(self)
        self.retriever, self.inputs, self.options, self.head, self.start_id = retriever, inputs, options, head, \
            start_id
        self.name, self.weight = "rag", 1.0

    def heads(self) -> Sequence[Any]:
        return (self.head,)

    def reads(self, batch: RagBatch) -> Tensor:
        return torch.zeros(0, 2, dtype=torch.long, device=batch.input_ids.device)  # runs the generator itself

    def units(self, batch: RagBatch) -> Tensor:
        return torch.tensor(len(batch), dtype=torch.int64)

    def log_likelihood(self, generator: Any, batch: RagBatch) -> tuple[Tensor, Tensor]:
        """log p(y|x) [B] of the batch's targets and log p(z|x) [B, k]."""
        k = self.options.k
        scores, rows = self.retriever.scores(batch.input_ids, batch.attention_mask, batch.token_type_ids,
                                             batch.summary, k)
        prior = doc_log_prior(scores, self.options.temperature)
        ids, mask = self.inputs.batch(batch.questions(), rows)
        device = batch.targets.device
        lp = token_log_probs(generator, ids.to(device), mask.to(device), batch.targets.repeat_interleave(k, 0),
                             batch.target_mask.repeat_interleave(k, 0), self.start_id)
        ll = marginal_log_likelihood(prior, lp.view(len(batch), k, -1), batch.target_mask, self.options.marginalise)
        return ll, prior

    def forward(self, passes: Passes, batch: RagBatch) -> ObjectiveOutput:
        ll, prior = self.log_likelihood(passes.model, batch)
        loss_sum = -ll.sum()
        device = loss_sum.device
        return ObjectiveOutput(loss_sum, {"rag_units": count(len(batch), device),
                                          "rag_loss_sum": loss_sum.detach().float(),
                                          "rag_tokens": batch.target_mask.sum().to(device),
                                          "rag_prior_top": prior.detach().exp().max(-1).values.sum().float()})

    def summarize(self, totals: Any) -> dict[str, float]:
        units = totals.get("rag_units", 0.0)
        return {"rag_loss": ratio(totals.get("rag_loss_sum", 0.0), units),
                "rag_token_loss": ratio(totals.get("rag_loss_sum", 0.0), totals.get("rag_tokens", 0.0)),
                "rag_prior_top": ratio(totals.get("rag_prior_top", 0.0), units)}


# --------------------------------------------------------------------------------------------------- loading
def open_retriever(encoder_dir: str | os.PathLike | Pretrained, index_dir: str | os.PathLike,
                   flag: str = "--retriever") -> Retriever:
    """The query encoder `encoder_dir` over the dense index `index_dir` (another kind: `IndexKindError`; vectors of
    another width than the encoder's: a ConfigError naming both)."""
    from bertology.model import load
    from bertology.retrieval.kinds import META_FILE, IndexKindError, load_index, read_meta

    kind = read_meta(index_dir).get("kind", "dense")
    if kind != "dense":
        raise IndexKindError(f"--index {Path(index_dir) / META_FILE}: a {kind} index; RAG retrieves by the inner "
                             f"product of query and passage vectors, from a dense index (bertology index build "
                             f"--kind dense)")
    index = load_index(index_dir, kind="dense")
    pretrained = encoder_dir if isinstance(encoder_dir, Pretrained) else load(encoder_dir)
    where = f"{Path(index_dir) / META_FILE}"
    encoder = QueryEncoder(pretrained, index.options, where)
    if encoder.dim != index.dim:
        raise ConfigError(f"{flag} {getattr(pretrained, 'directory', None) or encoder_dir}: the query encoder makes "
                          f"{encoder.dim}-dimensional vectors; the index ({where}) holds {index.dim}-dimensional ones")
    return Retriever(encoder, index, where)


def check_k(k: int, retriever: Retriever, flag: str = "task.k") -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"{flag}: must be a positive integer, got {k!r}")
    if k > len(retriever):
        raise ConfigError(f"{flag}: {k} passages per question, more than the {len(retriever)} the index "
                          f"({retriever.where}) holds")


def check_generator(model: Any, flag: str = "--model") -> None:
    """A RAG generator generates from an encoder it reads once (capabilities, not classes)."""
    for capability in (ENCODER_DECODER, GENERATES):
        if capability not in capabilities(model):
            raise ConfigError(f"{flag}: a RAG generator must be an encoder-decoder that generates (BART, T5; "
                              f"capabilities {ENCODER_DECODER!r} and {GENERATES!r}); this is a {model_kind(model)}, "
                              f"without {capability!r}")


def save_rag(directory: str | os.PathLike, retriever: Retriever, options: RagOptions, index_dir: str | os.PathLike,
             max_length: int) -> None:
    """Write ``rag.json`` and ``query_encoder/`` into `directory` (a generator's model directory), each atomically."""
    directory = Path(directory)
    encoder = retriever.encoder
    with atomic_directory(directory / QUERY_ENCODER_DIR) as tmp:
        Pretrained(encoder.model, encoder.pretrained.tokenizer).save(tmp)
        source = getattr(encoder.pretrained, "directory", None)
        for name in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"):
            if source and (Path(source) / name).is_file():  # the sentence-transformers settings the index follows
                shutil.copyfile(Path(source) / name, tmp / name)
        if source and (Path(source) / "1_Pooling").is_dir():
            shutil.copytree(Path(source) / "1_Pooling", tmp / "1_Pooling")
    record = {"format": RAG_FORMAT, "version": RAG_VERSION, "index": str(Path(index_dir).resolve()),
              "query_encoder": QUERY_ENCODER_DIR, "max_length": max_length, **to_mapping(options)}
    with atomic_write(directory / RAG_FILE, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(record, indent=2) + "\n")


def copy_rag(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Copy ``rag.json`` and ``query_encoder/`` of one model directory into another (the best model's into the
    final one)."""
    source, target = Path(source), Path(target)
    with atomic_directory(target / QUERY_ENCODER_DIR) as tmp:
        shutil.copytree(source / QUERY_ENCODER_DIR, tmp, dirs_exist_ok=True)
    with atomic_write(target / RAG_FILE, "wb") as handle:
        handle.write((source / RAG_FILE).read_bytes())


def is_rag(directory: str | os.PathLike) -> bool:
    return (Path(directory) / RAG_FILE).is_file()


@dataclass
class Rag:
    """A fine-tuned RAG model: the generator, its tokenizer, the retriever and the options it was trained with."""

    generator: Any
    tokenizer: Any
    retriever: Retriever
    options: RagOptions
    max_length: int

    def answer(self, questions: Sequence[str], *, k: int | None = None, marginalise: str | None = None,
               num_beams: int = 1, max_new_tokens: int = 32, batch_size: int = 16) -> list[RagAnswer]:
        """Each question's generated answer and its k passages (rows in the index and scores s(x, z), best
        first)."""
        from bertology.tasks.text_to_text import start_token

        k = self.options.k if k is None else k
        check_k(k, self.retriever, "--k")
        marginalise = marginalise or self.options.marginalise
        if marginalise not in MARGINALISATIONS:
            raise ConfigError(f"--marginalise: expected token or sequence, got {marginalise!r}")
        inputs = GeneratorInputs(self.tokenizer, self.retriever.passages, self.max_length)
        device = next(self.generator.parameters()).device
        out: list[RagAnswer] = []
        for start in range(0, len(questions), batch_size):
            chunk = list(questions[start:start + batch_size])
            q_ids = [inputs.question_ids(q, f"question {start + i + 1}") for i, q in enumerate(chunk)]
            with torch.no_grad():
                scores, rows = self.retriever.scores(*(t.to(device) for t in self.retriever.encoder.tokenize(chunk)),
                                                     k)
                ids, mask = inputs.batch(q_ids, rows)
                tokens = rag_generate(self.generator, ids.to(device), mask.to(device),
                                      doc_log_prior(scores, self.options.temperature), marginalise,
                                      max_new_tokens=max_new_tokens, num_beams=num_beams,
                                      start_id=start_token(self.generator))
            for t, row, score in zip(tokens, rows.tolist(), scores.tolist()):
                out.append(RagAnswer(self.tokenizer.decode(t, skip_special_tokens=True).strip(), row, score))
        return out


@dataclass(frozen=True)
class RagAnswer:
    """A generated answer, the index rows of the question's k passages and their scores s(x, z), best first."""

    text: str
    rows: list[int]
    scores: list[float]


def read_rag_file(directory: str | os.PathLike) -> dict[str, Any]:
    path = Path(directory) / RAG_FILE
    if not path.is_file():
        raise ConfigError(f"{directory}: not a RAG model ({RAG_FILE} is missing): fine-tune one with "
                          f"bertology finetune --task rag")
    record = json_value(path)
    if not isinstance(record, dict) or record.get("format") != RAG_FORMAT or record.get("version") != RAG_VERSION:
        raise DataError(f"{path}: not a {RAG_FORMAT} file of version {RAG_VERSION}")
    for key in ("index", "k", "marginalise", "temperature", "max_length"):
        if key not in record:
            raise DataError(f"{path}: missing key {key!r}")
    return record


def load_rag(directory: str | os.PathLike, index: str | os.PathLike | None = None) -> Rag:
    """The RAG model saved in `directory` (a fine-tuned generator with ``rag.json`` and ``query_encoder/``) over
    its recorded index, or `index` (a dense index of the same passage vectors' width)."""
    from bertology.model import load

    directory = Path(directory)
    record = read_rag_file(directory)
    try:
        options = RagOptions(k=record["k"], marginalise=record["marginalise"], temperature=record["temperature"])
    except ConfigError as error:
        raise DataError(f"{directory / RAG_FILE}: {error}") from None
    index_dir = index if index is not None else record["index"]
    if not Path(index_dir).is_dir():
        raise ConfigError(f"{directory / RAG_FILE}: its index {index_dir} does not exist any more; pass the index "
                          f"(--index DIR)")
    pretrained = load(directory)
    check_generator(pretrained.model, str(directory))
    retriever = open_retriever(directory / QUERY_ENCODER_DIR, index_dir, flag=str(directory / QUERY_ENCODER_DIR))
    check_k(options.k, retriever, f"{directory / RAG_FILE}: k")
    length = record["max_length"]
    if isinstance(length, bool) or not isinstance(length, int) or length < 4:
        raise DataError(f"{directory / RAG_FILE}: max_length must be an integer >= 4, got {length!r}")
    return Rag(pretrained.model, pretrained.tokenizer, retriever, options,
               min(length, pretrained.model.config.max_length))

