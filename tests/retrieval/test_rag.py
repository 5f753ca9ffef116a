"""Retrieval-augmented generation (bertology.retrieval.rag): the RAG-sequence and RAG-token marginal likelihoods and
their decoding against direct computations on a tiny random BART over a tiny encoder's dense index, gradients, the
fine-tuning run end to end and its bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from bertology.errors import ConfigError
from bertology.model import load
from bertology.retrieval import Index, SparseIndex, recall_at_k, squad_passages
from bertology.retrieval.kinds import IndexKindError
from bertology.retrieval.rag import (SEPARATOR, GeneratorInputs, MarginalStepper, RagExamples, RagLoss, RagOptions,
                                     load_rag, open_retriever, rag_generate)
from bertology.tasks.lookup import get_task
from bertology.tasks.metrics import evaluate_files
from bertology.tasks.qa import write_squad_json
from bertology.tasks.text_to_text import lm_head, start_token

pytestmark = pytest.mark.usefixtures("one_thread")
pytest.importorskip("faiss")
pytest.importorskip("transformers")

# Four questions over four paragraphs, answers of one to three words (targets of several lengths).
SQUAD = {"version": "1.1", "data": [
    {"title": "Paris", "paragraphs": [
        {"context": "paris is the capital of france . rain fell over london all day .",
         "qas": [{"id": "q1", "question": "the capital of france",
                  "answers": [{"text": "paris", "answer_start": 0}]},
                 {"id": "q2", "question": "rain over london",
                  "answers": [{"text": "rain fell over london", "answer_start": 33}]}]},
        {"context": "the cat sat on the mat .", "qas": []}]},
    {"title": "Bread", "paragraphs": [
        {"context": "bread is baked from flour and water .",
         "qas": [{"id": "q3", "question": "flour and water",
                  "answers": [{"text": "bread is baked", "answer_start": 0}]}]},
        {"context": "dogs chase cats in the park . python is a programming language .",
         "qas": [{"id": "q4", "question": "programming language python",
                  "answers": [{"text": "python", "answer_start": 30}]}]}]}]}
QUESTIONS = [q["question"] for article in SQUAD["data"] for p in article["paragraphs"] for q in p["qas"]]


def hand_inputs(tokenizer, passage, question, max_length):
    """The generator's input for one (question, passage), built directly: the passage's tokens (cut to fit), the
    separator's, the question's, between the framing's specials."""
    tail = tokenizer.encode(SEPARATOR, add_special_tokens=False).ids + \
        tokenizer.encode(" " + question, add_special_tokens=False).ids
    framed_empty = len(tokenizer.framing.frame([]).ids)
    body = tokenizer.encode(passage, add_special_tokens=False).ids[:max_length - framed_empty - len(tail)]
    return tokenizer.framing.frame(body + tail).ids


def hand_token_log_probs(model, source, target, start):
    """log p(y_i | x, z, y_<i) of each target token, one unpadded sequence, in the model's dtype (float64 here)."""
    out = model(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([[start, *target[:-1]]]))
    log_probs = out.logits[0].double().log_softmax(-1)
    return [float(log_probs[i, t].detach()) for i, t in enumerate(target)]


@pytest.fixture(scope="module")
def squad_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("squad") / "mini.json"
    path.write_text(json.dumps(SQUAD), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def index_dir(tiny_dir, squad_file, tmp_path_factory):
    directory = tmp_path_factory.mktemp("index") / "dense"
    Index.build(tiny_dir, squad_passages(squad_file)).save(directory)
    return directory


@pytest.fixture(scope="module")
def bart_dir(squad_file, tmp_path_factory):
    from finetune_helpers import save_family_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    texts = [p.text for p in squad_passages(squad_file)] + [f"{SEPARATOR} {q}" for q in QUESTIONS]
    directory = save_family_model(tmp_path_factory.mktemp("bart"), "bart", texts * 3, positions=96)
    torch.set_num_threads(threads)
    return directory


@pytest.fixture(scope="module")
def questions(squad_file):
    return get_task("squad").read(squad_file)


def rag_parts(tiny_dir, index_dir, bart_dir, questions, k, marginalise, dtype=torch.float64):
    torch.manual_seed(0)
    retriever = open_retriever(tiny_dir, index_dir)
    retriever.index.attach(tiny_dir)  # the index's own query embedding, for the direct computations
    generator = load(bart_dir)
    model = generator.model.to(dtype)
    retriever.to(dtype)
    retriever.passage_vectors = retriever.passage_vectors.to(dtype)
    inputs = GeneratorInputs(generator.tokenizer, retriever.passages, 64)
    loss = RagLoss(retriever, inputs, RagOptions(k=k, marginalise=marginalise), lm_head(model.config),
                   start_token(model))
    examples = RagExamples(retriever, inputs, questions, shuffle=False)
    return retriever, model, generator.tokenizer, inputs, loss, examples


def hand_prior(retriever, question, k):
    """log p(z|x) of the top k by a direct computation: the index's own query vector, float64 dot products."""
    query = retriever.index.encode([question])[0].astype(np.float64)
    scores = retriever.index.vectors().astype(np.float64) @ query
    top = np.argsort(-scores, kind="stable")[:k]
    s = scores[top]
    return top, s - np.log(np.exp(s - s.max()).sum()) - s.max()


def test_query_vectors_are_the_index_ones(tiny_dir, index_dir):
    retriever = open_retriever(tiny_dir, index_dir)
    retriever.index.attach(tiny_dir)
    with torch.no_grad():
        ours = retriever.encoder(*retriever.encoder.tokenize(QUESTIONS)).numpy()
    np.testing.assert_allclose(ours, retriever.index.encode(QUESTIONS), atol=1e-5)
    assert not retriever.passage_vectors.requires_grad
    assert "passage_vectors" not in retriever.state_dict()  # fixed: never trained, never saved


@pytest.mark.parametrize("marginalise", ["sequence", "token"])
def test_marginal_log_likelihood_equals_a_hand_loop(tiny_dir, index_dir, bart_dir, questions, marginalise):
    k = 3
    retriever, model, tokenizer, inputs, loss, examples = rag_parts(tiny_dir, index_dir, bart_dir, questions, k,
                                                                    marginalise)
    batch = next(examples.batches(0, 4, drop_last=False))
    assert len(set(batch.target_mask.sum(1).tolist())) > 1  # targets of several lengths: padding is handled
    ll, prior = loss.log_likelihood(model, batch)
    assert ll.dtype == torch.float64
    for b, example in enumerate(questions):
        rows, log_prior = hand_prior(retriever, example.question, k)
        np.testing.assert_allclose(prior[b].detach().numpy(), log_prior, atol=1e-6)  # float32 index vectors
        target = tokenizer.encode(example.answers[0].text).ids
        per_passage = [hand_token_log_probs(model, hand_inputs(tokenizer, retriever.passages[r].text,
                                                               example.question, 64), target, start_token(model))
                       for r in rows]
        if marginalise == "sequence":
            terms = [log_prior[z] + sum(per_passage[z]) for z in range(k)]
            expected = math.log(sum(math.exp(t) for t in terms))
        else:
            expected = sum(math.log(sum(math.exp(log_prior[z] + per_passage[z][i]) for z in range(k)))
                           for i in range(len(target)))
        # the model's prior against the hand prior differs by float32 index rounding only
        assert float(ll[b].detach()) == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("marginalise", ["sequence", "token"])
def test_k_of_one_is_the_generator_alone(tiny_dir, index_dir, bart_dir, questions, marginalise):
    retriever, model, tokenizer, inputs, loss, examples = rag_parts(tiny_dir, index_dir, bart_dir, questions, 1,
                                                                    marginalise)
    batch = next(examples.batches(0, 4, drop_last=False))
    ll, prior = loss.log_likelihood(model, batch)
    assert torch.equal(prior, torch.zeros_like(prior))
    for b, example in enumerate(questions):
        row = hand_prior(retriever, example.question, 1)[0][0]
        target = tokenizer.encode(example.answers[0].text).ids
        source = hand_inputs(tokenizer, retriever.passages[row].text, example.question, 64)
        assert float(ll[b].detach()) == pytest.approx(sum(hand_token_log_probs(model, source, target, start_token(model))),
                                             abs=1e-9)


@pytest.mark.parametrize("marginalise", ["sequence", "token"])
def test_gradients_reach_the_query_encoder_not_the_passage_vectors(tiny_dir, index_dir, bart_dir, questions,
                                                                   marginalise):
    retriever, model, tokenizer, inputs, loss, examples = rag_parts(tiny_dir, index_dir, bart_dir, questions, 3,
                                                                    marginalise, torch.float32)
    batch = next(examples.batches(0, 4, drop_last=False))
    ll, _ = loss.log_likelihood(model, batch)
    (-ll.sum()).backward()
    grads = {name: p.grad for name, p in retriever.encoder.named_parameters() if ".pooler." not in name}
    assert all(g is not None for g in grads.values())  # every layer the query vector is made of (not the pooler)
    assert float(grads["backbone.encoder.encoder.embeddings.word.weight"].abs().sum()) > 0
    assert retriever.passage_vectors.grad is None and not retriever.passage_vectors.requires_grad
    assert model.embeddings.weight.grad is not None and float(model.embeddings.weight.grad.abs().sum()) > 0


def test_k_of_one_gives_the_query_encoder_no_gradient(tiny_dir, index_dir, bart_dir, questions):
    retriever, model, _, _, loss, examples = rag_parts(tiny_dir, index_dir, bart_dir, questions, 1, "token",
                                                       torch.float32)
    ll, _ = loss.log_likelihood(model, next(examples.batches(0, 4, drop_last=False)))
    (-ll.sum()).backward()  # p(z|x) = 1: nothing flows to the query encoder
    assert all(p.grad is None or float(p.grad.abs().sum()) == 0 for p in retriever.encoder.parameters())


# ------------------------------------------------------------------------------------------------- decoding
def direct_token_marginal(model, sources, log_prior, prefix):
    """log sum_z p(z|x) p(y | x, z, prefix) [V] by full forward passes (no cache), float64."""
    rows = []
    for z, source in enumerate(sources):
        out = model(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([prefix]))
        rows.append(out.logits[0, -1].double().log_softmax(-1) + float(log_prior[z]))
    return torch.logsumexp(torch.stack(rows), 0)


class DirectStepper:
    """A stepper computing the RAG-token marginal from scratch at every step (no cache), for beam search."""

    def __init__(self, model, sources, log_prior, start, rows):
        self.model, self.sources, self.log_prior = model, sources, log_prior
        self.prefix = torch.full((rows, 1), start, dtype=torch.long)
        self.history = [[start] for _ in range(rows)]
        self.question = list(range(rows))

    def logits(self, ids):
        if ids.shape[1] == 1 and len(self.history[0]) > 1 or ids.shape[0] != len(self.history):
            pass
        if len(self.history) != ids.shape[0]:
            raise AssertionError("rows out of step")
        if ids.shape[1] == 1 and self.started:
            self.history = [h + [int(t)] for h, t in zip(self.history, ids[:, 0])]
        self.started = True
        return torch.stack([direct_token_marginal(self.model, self.sources[q], self.log_prior[q], h).float()
                            for q, h in zip(self.question, self.history)])

    started = False

    def reorder(self, rows):
        self.history = [list(self.history[r]) for r in rows.tolist()]
        self.question = [self.question[r] for r in rows.tolist()]


@torch.no_grad()
def rag_case(tiny_dir, index_dir, bart_dir, questions, k):
    retriever, model, tokenizer, inputs, loss, examples = rag_parts(tiny_dir, index_dir, bart_dir, questions, k,
                                                                    "token")
    model.eval()
    noise = torch.Generator().manual_seed(1)
    for name, p in model.named_parameters():  # BART's 0.02 initialisation gives one answer whatever the input:
        if "cross_" in name and "norm" not in name:  # strong cross-attention makes the answers depend on it
            p.add_(torch.randn(p.shape, generator=noise, dtype=p.dtype) * 3.0)
    batch = next(examples.batches(0, 4, drop_last=False))
    with torch.no_grad():
        scores, rows = retriever.scores(batch.input_ids, batch.attention_mask, batch.token_type_ids, batch.summary,
                                        k)
    ids, mask = inputs.batch(batch.questions(), rows)
    log_prior = torch.log_softmax(scores, -1)
    sources = [[hand_inputs(tokenizer, retriever.passages[int(r)].text, questions[b].question, 64) for r in row]
               for b, row in enumerate(rows)]
    return model, ids, mask, log_prior, sources


@torch.no_grad()
def test_rag_token_greedy_equals_the_direct_marginal_argmax(tiny_dir, index_dir, bart_dir, questions):
    model, ids, mask, log_prior, sources = rag_case(tiny_dir, index_dir, bart_dir, questions, 3)
    start = start_token(model)
    # the random generator says EOS first: decode without one, 6 tokens each (one with EOS: below)
    got = rag_generate(model, ids, mask, log_prior, "token", max_new_tokens=6, eos_token_id=[])
    for b in range(len(questions)):
        prefix = [start]
        for _ in range(6):
            prefix.append(int(direct_token_marginal(model, sources[b], log_prior[b], prefix).argmax()))
        assert got[b] == prefix[1:]
    assert len({tuple(g) for g in got}) > 1
    eos = model.config.eos_token_id  # with it, each answer is the same decoding up to its first EOS
    assert rag_generate(model, ids, mask, log_prior, "token", max_new_tokens=6) == [
        g[:g.index(eos) + 1] if eos in g else g for g in got]


@torch.no_grad()
def test_rag_token_beam_search_equals_beam_search_over_the_direct_marginal(tiny_dir, index_dir, bart_dir,
                                                                           questions):
    from bertology.generation import beam_search, make_settings

    model, ids, mask, log_prior, sources = rag_case(tiny_dir, index_dir, bart_dir, questions, 3)
    settings = make_settings(model.config, max_new_tokens=5, num_beams=3, eos_token_id=[])
    cached = beam_search(MarginalStepper(model, ids, mask, log_prior), settings)
    direct = beam_search(DirectStepper(model, sources, log_prior, start_token(model), len(questions)), settings)
    assert cached.tolist() == direct.tolist()
    assert len({tuple(row) for row in cached.tolist()}) > 1
    got = rag_generate(model, ids, mask, log_prior, "token", max_new_tokens=5, num_beams=3, eos_token_id=[])
    assert got == [row[1:] for row in cached.tolist()]


@torch.no_grad()
@pytest.mark.parametrize("beams", [1, 2])
def test_rag_sequence_thorough_decoding_equals_a_direct_computation(tiny_dir, index_dir, bart_dir, questions, beams):
    from bertology.generation import generate

    model, ids, mask, log_prior, sources = rag_case(tiny_dir, index_dir, bart_dir, questions, 3)
    start = start_token(model)
    got = rag_generate(model, ids, mask, log_prior, "sequence", max_new_tokens=4, num_beams=beams, eos_token_id=[])
    several = 0
    for b in range(len(questions)):
        candidates = []
        for source in sources[b]:  # a beam search per passage, each alone
            for row in generate(model, torch.tensor([source]), max_new_tokens=4, num_beams=beams,
                                num_return_sequences=beams, eos_token_id=[]).tolist():
                tokens = row[1:]
                if tokens not in candidates:
                    candidates.append(tokens)
        scores = [math.log(sum(math.exp(float(log_prior[b, z]) + sum(hand_token_log_probs(model, source, c, start)))
                               for z, source in enumerate(sources[b]))) for c in candidates]
        assert got[b] == candidates[int(np.argmax(scores))]
        several += len(candidates) > 1
    assert several  # the passages' own best answers differ: the marginal chooses


# --------------------------------------------------------------------------------------------- fine-tuning
@pytest.fixture(scope="module")
def squad_folder(questions, tmp_path_factory):
    folder = tmp_path_factory.mktemp("squad-folder")
    write_squad_json(folder / "train-v1.1.json", questions)
    write_squad_json(folder / "dev-v1.1.json", questions)
    return folder


def finetune_args(bart_dir, tiny_dir, index_dir, squad_folder, out, *extra):
    return ["finetune", "--task", "rag", "--model", str(bart_dir), "--retriever", str(tiny_dir), "--index",
            str(index_dir), "--data", str(squad_folder), "--out", str(out), "--set", "optim.batch_size=2",
            "--set", "optim.lr=1e-3", "--set", "task.epochs=1", "--set", "task.max_length=64", "--set",
            "speed.threads=1", "--set", "run.progress=false", "--set", "speed.prefetch=0", *extra]


@pytest.mark.parametrize("marginalise", ["token", "sequence"])
def test_finetune_rag_end_to_end(tiny_dir, index_dir, bart_dir, squad_folder, questions, tmp_path, marginalise,
                                 capsys):
    from bertology.cli.main import main

    out = tmp_path / "run"
    assert main(finetune_args(bart_dir, tiny_dir, index_dir, squad_folder, out, "--set", "task.k=2", "--set",
                              f"task.marginalise={marginalise}")) == 0
    model_dir = out / "model"
    record = json.loads((model_dir / "rag.json").read_text())
    assert record["k"] == 2 and record["marginalise"] == marginalise and record["max_length"] == 64
    # the query encoder trained: its weights moved from the retriever's
    before, after = load(tiny_dir).model.state_dict(), load(model_dir / "query_encoder").model.state_dict()
    assert any(not torch.equal(before[name], after[name]) for name in before)
    assert not (out / "best").exists()
    answers = json.loads((out / "dev_predictions.json").read_text())
    assert list(answers) == [q.id for q in questions]
    # the saved model generates the dev answers again
    rag = load_rag(model_dir)
    again = rag.answer([q.question for q in questions])
    assert [a.text for a in again] == list(answers.values())
    metrics = json.loads((out / "dev_metrics.json").read_text())
    assert set(metrics) == {"f1", "exact_match"}
    capsys.readouterr()
    assert main(["generate", "--model", str(model_dir), *[q.question for q in questions]]) == 0
    assert capsys.readouterr().out.splitlines() == [a.text for a in again]
    one = rag.answer([q.question for q in questions], k=1, marginalise="sequence", num_beams=2,
                     max_new_tokens=20)
    assert main(["generate", "--model", str(model_dir), "--k", "1", "--marginalise", "sequence", "--num-beams",
                 "2", *[q.question for q in questions]]) == 0
    assert capsys.readouterr().out.splitlines() == [a.text for a in one]
    assert all(len(a.rows) == 2 for a in again) and all(len(a.rows) == 1 for a in one)
    # evaluate --task open-qa --generator: the official scores of these answers and the recall of their passages
    scored = tmp_path / "scored"
    assert main(["evaluate", "--task", "open-qa", "--generator", str(model_dir), "--squad", str(squad_folder /
                 "dev-v1.1.json"), "--out", str(scored)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert json.loads((scored / "predictions.json").read_text()) == answers
    expected = evaluate_files("squad", scored / "predictions.json", gold=squad_folder / "dev-v1.1.json")
    assert (result["exact_match"], result["f1"]) == (round(expected["exact_match"], 2), round(expected["f1"], 2))
    hits = recall_at_k(questions, rag.retriever.passages, [a.rows for a in again], ks=(2,)).recall[2]
    assert result["recall@2"] == round(hits, 2) and result["k"] == 2 and result["marginalise"] == marginalise
    assert sorted(p.name for p in scored.iterdir()) == ["metrics.json", "predictions.json"]
    assert main(["evaluate", "--task", "open-qa", "--generator", str(model_dir), "--reader", str(model_dir),
                 "--squad", str(squad_folder / "dev-v1.1.json")]) == 2
    assert "--reader, --generator: give one" in capsys.readouterr().err
    assert main(["generate", "--model", str(model_dir), "--do-sample", "a question"]) == 2
    assert "--do-sample: a RAG model" in capsys.readouterr().err
    assert main(["generate", "--model", str(bart_dir), "--k", "2", "a question"]) == 2
    assert "--k: for a RAG model" in capsys.readouterr().err


def refused(args, capsys):
    """The command's exit status 2 and its one-line error."""
    from bertology.cli.main import main

    capsys.readouterr()
    assert main(args) == 2
    return capsys.readouterr().err


def test_an_index_of_another_kind_is_refused(tiny_dir, bart_dir, squad_folder, squad_file, tmp_path, capsys):
    bm25 = tmp_path / "bm25"
    SparseIndex.build(squad_passages(squad_file)).save(bm25)
    with pytest.raises(IndexKindError, match=r"--index .*bm25/index\.json: a bm25 index; RAG retrieves .* from a "
                                             r"dense index"):
        open_retriever(tiny_dir, bm25)
    assert "a bm25 index; RAG retrieves" in refused(finetune_args(bart_dir, tiny_dir, bm25, squad_folder,
                                                                  tmp_path / "out"), capsys)
    assert not (tmp_path / "out").exists()


def test_k_larger_than_the_index_is_refused(tiny_dir, index_dir, bart_dir, squad_folder, tmp_path, capsys):
    error = refused(finetune_args(bart_dir, tiny_dir, index_dir, squad_folder, tmp_path / "out", "--set",
                                  "task.k=5"), capsys)
    assert "task.k: 5 passages per question, more than the 4 the index" in error and "index.json" in error
    assert not (tmp_path / "out").exists()


def test_a_generator_that_is_no_encoder_decoder_is_refused(tiny_dir, index_dir, squad_folder, tmp_path, capsys):
    error = refused(finetune_args(tiny_dir, tiny_dir, index_dir, squad_folder, tmp_path / "out", "--set",
                                  "task.k=2"), capsys)
    assert "--model: a RAG generator must be an encoder-decoder that generates" in error
    assert "without 'encoder-decoder'" in error


def test_a_query_encoder_of_another_width_is_refused(index_dir, bart_dir, squad_folder, tmp_path, capsys):
    from bertology.model import EncoderModel, Pretrained, preset
    from bertology.tokenization import train_tokenizer

    tokenizer = train_tokenizer(iter([" ".join(QUESTIONS)] * 4), "wordpiece", 60, show_progress=False,
                                min_frequency=1)
    model = EncoderModel(preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=1, hidden_size=16,
                                num_heads=2, intermediate_size=32, max_position_embeddings=64))
    model.init_weights(torch.Generator().manual_seed(0))
    wide = tmp_path / "enc16"
    Pretrained(model, tokenizer).save(wide)
    with pytest.raises(ConfigError, match=r"--retriever .*enc16: the query encoder makes 16-dimensional vectors; "
                                          r"the index \(.*index\.json\) holds 32-dimensional ones"):
        open_retriever(wide, index_dir)
    assert "16-dimensional vectors" in refused(finetune_args(bart_dir, wide, index_dir, squad_folder,
                                                             tmp_path / "out", "--set", "task.k=2"), capsys)


def test_rag_needs_the_retriever_and_the_index(bart_dir, squad_folder, tmp_path, capsys):
    assert "task.retriever: --task rag needs --retriever DIR" in refused(
        ["finetune", "--task", "rag", "--model", str(bart_dir), "--data", str(squad_folder), "--out",
         str(tmp_path / "out")], capsys)


def test_a_question_longer_than_the_generator_reads_is_refused(tiny_dir, index_dir, bart_dir, questions):
    from bertology.errors import DataError

    retriever = open_retriever(tiny_dir, index_dir)
    inputs = GeneratorInputs(load(bart_dir).tokenizer, retriever.passages, 8)
    with pytest.raises(DataError, match=r"question 'q4': the question is \d+ tokens; with the separator and "
                                        r"specials it does not fit the generator's 8"):
        RagExamples(retriever, inputs, questions[3:], shuffle=False)
    # a long passage is cut at its end: the question is whole in every input
    inputs = GeneratorInputs(load(bart_dir).tokenizer, retriever.passages, 16)
    question = inputs.question_ids(questions[0].question, "q1")
    ids, mask = inputs.batch([question], torch.tensor([[0, 3]]))
    assert ids.shape == (2, 16) and mask.all()
    assert ids[0, -1 - len(question):-1].tolist() == question


def test_predict_with_an_unconfigured_rag_task_names_the_commands(bart_dir, squad_file, tmp_path, capsys):
    error = refused(["predict", "--model", str(bart_dir), "--task", "rag", "--input", str(squad_file), "--output",
                     str(tmp_path / "answers.json")], capsys)
    assert "task rag: needs its retriever and index" in error and "evaluate --task open-qa --generator" in error
