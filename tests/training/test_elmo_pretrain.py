"""ELMo pretraining: word streams (consecutive windows both ways), the biLM objective carrying the LSTMs' state from
batch to batch, held-out perplexity per direction, bitwise resume on CPU, the saved model loadable by bertology.load,
and the run config's ELMo rules."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import bertology
from bertology.data.word_streams import WordStreams
from bertology.errors import ConfigError
from bertology.model.elmo import ElmoModel, ElmoState, tiny_config
from bertology.objectives.base import Passes
from bertology.objectives.bilm import BidirectionalLM
from bertology.recipes.pretrain import pretrain
from bertology.tokenization.words import WordVocabulary
from bertology.training.checkpoint import checkpoints_dir
from bertology.training.config import PretrainConfig

from pretrain_helpers import run_shipped_config_briefly, write_corpus

ROOT = Path(__file__).resolve().parents[2]
BROWN = ROOT.parent / "shared" / "data" / "brown-nltk"
DOCUMENTS = [["a b c d e f g", "h i j"], ["k l m n", "o p q r s t"], ["u v w x y z"]]


def vocabulary() -> WordVocabulary:
    return WordVocabulary.build([s for d in DOCUMENTS for s in d], vocab_size=40)


def test_word_streams_read_each_document_in_windows_both_ways():
    vocab = vocabulary()
    streams = WordStreams(DOCUMENTS, vocab, window=3, seed=0, max_characters=8)
    texts = [[w for s in d for w in ("<S>", *vocab.split(s), "</S>")] for d in DOCUMENTS]
    assert [len(t) for t in texts] == [14, 14, 8] and streams.windows == [5, 5, 3]  # ceil((n - 1) / 3)
    batches = list(streams.batches(0, 2))
    documents, windows = streams.plan(0, 2)
    assert len(batches) == streams.num_batches(0, 2) == documents.shape[1] == 8  # 5 + 3 on one row, 5 on the other
    for row in range(2):
        for d in set(documents[row].tolist()) - {-1}:
            at = [b for b in range(len(batches)) if documents[row, b] == d]
            assert [int(windows[row, b]) for b in at] == list(range(len(at)))  # consecutive batches, in order
            assert [bool(batches[b].reset[row]) for b in at] == [True] + [False] * (len(at) - 1)
            forward = torch.cat([batches[b].forward_targets[row] for b in at])
            backward = torch.cat([batches[b].backward_targets[row] for b in reversed(at)])
            ids = vocab.encode(texts[d])
            assert forward[forward != -100].tolist() == ids[1:]  # each word predicting the next, from the start
            assert backward[backward != -100].tolist() == ids[:-1]  # each predicting the previous, from the end
            for b in at:
                mask = batches[b].attention_mask[row]
                assert torch.equal(mask.bool(), batches[b].forward_targets[row] != -100)
                assert torch.equal(batches[b].backward_attention_mask[row], mask)  # as many words both ways
                assert mask.tolist() == sorted(mask.tolist(), reverse=True)  # padding after the words
    # A row past its documents is padding; the characters are each word's own; a batch depends only on its index.
    idle = [b for b in range(len(batches)) if (documents[:, b] == -1).any()]
    assert idle and all(batches[b].attention_mask[(documents[:, b] == -1)].eq(0).all() for b in idle)
    assert torch.equal(list(streams.batches(0, 2, start_batch=1))[0].input_ids, batches[1].input_ids)
    assert batches[0].input_ids.shape == (2, 3, 8)


def test_the_objective_carries_state_and_resets_at_a_streams_start():
    torch.manual_seed(0)
    vocab = vocabulary()
    objective = BidirectionalLM()
    model = ElmoModel(tiny_config(vocab_size=vocab.vocab_size, dropout=0.0, projection_dim=8, cell_size=16),
                      objective.heads())
    model.init_weights(torch.Generator().manual_seed(0))
    with torch.no_grad():  # weights large enough for the state to matter
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(parameter.numel()))
    batches = list(WordStreams(DOCUMENTS, vocab, window=3, seed=0).batches(0, 2))
    first = objective(Passes(model, batches[0], None), batches[0])
    assert objective.h.shape == (4, 2, 8) and objective.c.shape == (4, 2, 16)
    carried = ElmoState(objective.h.clone(), objective.c.clone())
    second = objective(Passes(model, batches[1], None), batches[1])
    assert not torch.equal(objective.h, carried.h)

    def loss(batch, state):
        out = model(batch.input_ids, backward_input_ids=batch.backward_input_ids, state=state)
        return sum(torch.nn.functional.cross_entropy(model.lm_logits(top).flatten(0, 1), targets.flatten(),
                                                     reduction="sum")
                   for top, targets in ((out.forward_top, batch.forward_targets),
                                        (out.backward_top, batch.backward_targets)))

    torch.testing.assert_close(second.loss_sum, loss(batches[1], carried))  # it started from the carried state
    assert not torch.allclose(loss(batches[1], None), second.loss_sum)  # which matters
    again = objective(Passes(model, batches[0], None), batches[0])  # a document's first window starts from zeros
    assert torch.equal(again.loss_sum, first.loss_sum)
    assert first.stats["bilm_forward_units"] == 6 and objective.units(batches[1]) == 12
    metrics = objective.summarize({k: float(v) for k, v in second.stats.items()})
    assert set(metrics) >= {"bilm_forward_perplexity", "bilm_backward_perplexity", "bilm_loss"}


def run_config(corpus: Path, output_dir: Path, steps: int = 6, sampled: int = 0) -> PretrainConfig:
    return PretrainConfig.from_dict({
        "objectives": {"bilm": {"sampled": sampled} if sampled else {}},
        "model": {"architecture": "elmo", "preset": "tiny", "projection_dim": 16, "cell_size": 32,
                  "filters": [[1, 8], [2, 8]], "char_embedding_dim": 4, "max_characters_per_token": 12},
        "tokenizer": {"kind": "word", "vocab_size": 30, "min_frequency": 1},
        "data": {"corpus": [str(corpus)], "format": "bert", "heldout_documents": 4,
                 "instances": {"kind": "word-stream", "max_seq_length": 6}},
        "optim": {"batch_size": 3, "total_steps": steps, "lr": 3e-3, "warmup_steps": 1},
        "run": {"seed": 0, "output_dir": str(output_dir), "log_every": 1, "eval_every": 3, "eval_batches": 2,
                "checkpoint_every": 3, "keep_last": 3, "progress": False},
        "speed": {"threads": 1, "prefetch": 0},
    })


@pytest.mark.parametrize("sampled", [0, 8])
def test_pretraining_resumes_bitwise_and_saves_a_loadable_model(tmp_path, sampled):
    corpus = write_corpus(tmp_path / "corpus.txt", documents=20)
    full = pretrain(run_config(corpus, tmp_path / "full", sampled=sampled))
    rows = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    evals = [row for row in rows if row["kind"] == "eval"]
    assert evals and all(row["bilm_forward_perplexity"] > 1 and row["bilm_backward_perplexity"] > 1 for row in evals)
    halfway = checkpoints_dir(tmp_path / "full") / "step-0000003"
    saved = load_file(halfway / "trainer_state.safetensors")
    assert saved["objective_modules/bilm.h"].shape == (4, 3, 16) and saved["objective_modules/bilm.h"].abs().sum() > 0
    shutil.copytree(halfway, checkpoints_dir(tmp_path / "resumed") / halfway.name)
    shutil.copytree(tmp_path / "full" / "tokenizer", tmp_path / "resumed" / "tokenizer")
    pretrain(run_config(corpus, tmp_path / "resumed", sampled=sampled), resume=True)
    a = bertology.load(full.model_dir)
    b = bertology.load(tmp_path / "resumed" / "model")
    assert isinstance(a.model, ElmoModel) and isinstance(a.tokenizer, WordVocabulary) and a.tokenizer.vocab_size == 30
    for (name, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(x, y), name
    resumed_rows = [json.loads(line) for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    drop = ("tokens_per_s",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in resumed_rows] == \
        [{k: v for k, v in r.items() if k not in drop} for r in rows if r["step"] > 3]


def test_run_config_rules_for_elmo(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt", documents=4)
    good = run_config(corpus, tmp_path / "run").to_dict()
    assert good["objectives"] == {"bilm": {}}
    with pytest.raises(ConfigError, match="missing tokenizer.kind 'word'"):
        PretrainConfig.from_dict({**good, "tokenizer": {"kind": "wordpiece"}})
    with pytest.raises(ConfigError, match=r"model.hidden_size: unknown key for the elmo architecture \(a field of "
                                          "encoder"):
        PretrainConfig.from_dict({**good, "model": {"architecture": "elmo", "hidden_size": 64}})
    with pytest.raises(ConfigError, match="model.cells: unknown key; did you mean cell_size?"):
        PretrainConfig.from_dict({**good, "model": {"architecture": "elmo", "cells": 64}})
    with pytest.raises(ConfigError, match="model.preset: ELMo has the preset 'tiny' or none"):
        PretrainConfig.from_dict({**good, "model": {"architecture": "elmo", "preset": "mini"}})
    with pytest.raises(ConfigError, match=r"model.elmo: the model section is model: \{architecture: NAME"):
        PretrainConfig.from_dict({**good, "model": {"preset": "tiny", "elmo": {"cell_size": 64}}})
    with pytest.raises(ConfigError, match="objectives.mlm: trains encoder models, but model.architecture is elmo"):
        PretrainConfig.from_dict({**good, "objectives": {"bilm": {}, "mlm": {}}})


def test_meta_construction_gives_the_same_model_and_leaves_the_default_generator(tmp_path):
    from bertology.recipes.pretrain import build_elmo_run

    corpus = write_corpus(tmp_path / "corpus.txt", documents=6)
    models = []
    for meta in (False, True):
        config = run_config(corpus, tmp_path / f"run{meta}")
        config.speed.meta_init = meta
        torch.manual_seed(5)
        models.append(build_elmo_run(config, config.build_objectives())[3])
        drawn_after = torch.rand(3)
        torch.manual_seed(5)
        assert torch.equal(drawn_after, torch.rand(3))  # building drew nothing from the default generator
    for (name, a), b in zip(models[0].state_dict().items(), models[1].state_dict().values()):
        assert torch.equal(a, b), name


def test_the_shipped_config_runs_on_brown(tmp_path):
    if not BROWN.is_dir():
        pytest.skip(f"the Brown corpus is not at {BROWN} (see ../shared/data/README.md)")
    corpus = [BROWN / f"ca0{i}" for i in range(1, 5)]
    assert run_shipped_config_briefly(ROOT / "configs" / "elmo-tiny.yaml", tmp_path / "run", corpus, heldout=1) == 0
    pretrained = bertology.load(tmp_path / "run" / "model")
    assert isinstance(pretrained.model, ElmoModel) and pretrained.model.config.cell_size == 512
    vocabulary = pretrained.tokenizer  # at most 1,000 words: those seen twice in four Brown files
    assert vocabulary.vocab_size <= 1000 and pretrained.model.config.vocab_size == vocabulary.vocab_size
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["kind"] == "eval" and rows[-1]["bilm_backward_perplexity"] > 1


def _ddp_worker(rank: int, world: int, port: int, raw: dict) -> None:
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    pretrain(PretrainConfig.from_dict(raw))


def test_two_processes_match_one_process_with_double_batch(tmp_path):
    import socket

    import torch.multiprocessing as mp

    corpus = write_corpus(tmp_path / "corpus.txt", documents=20)

    def raw(out: Path, batch: int) -> dict:
        config = run_config(corpus, out, steps=4).to_dict()
        config["model"]["dropout"] = 0.0
        config["optim"]["batch_size"] = batch
        config["run"].update(eval_every=0, checkpoint_every=0)
        return config

    pretrain(PretrainConfig.from_dict(raw(tmp_path / "single", 4)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_ddp_worker, args=(2, port, raw(tmp_path / "double", 2)), nprocs=2, join=True)
    ours = load_file(tmp_path / "double" / "model" / "model.safetensors")
    reference = load_file(tmp_path / "single" / "model" / "model.safetensors")
    for key in reference:
        torch.testing.assert_close(ours[key], reference[key], rtol=1e-4, atol=1e-5, msg=key)


def test_sampled_softmax_tends_to_the_full_one_and_evaluation_stays_full():
    from bertology.objectives.bilm import log_uniform_sample, sampled_logits

    torch.manual_seed(0)
    ids = log_uniform_sample(200_000, 40, torch.device("cpu"))
    share = torch.bincount(ids, minlength=40).double() / len(ids)
    zipf = torch.log1p(1.0 / (torch.arange(40).double() + 1)) / torch.log(torch.tensor(41.0, dtype=torch.float64))
    torch.testing.assert_close(share, zipf, atol=3e-3, rtol=0)  # the log-uniform sampler
    states, weight, bias = torch.randn(6, 8), torch.randn(40, 8), torch.randn(40)
    labels = torch.tensor([0, 3, 7, 12, 25, 39])
    full = torch.nn.functional.cross_entropy(states @ weight.T + bias, labels)
    sampled = torch.nn.functional.cross_entropy(sampled_logits(states, labels, ids, weight, bias),
                                                torch.zeros_like(labels))
    torch.testing.assert_close(sampled, full, rtol=0.02, atol=0)  # many negatives: the full softmax's loss

    vocab = vocabulary()
    model = ElmoModel(tiny_config(vocab_size=vocab.vocab_size, dropout=0.0, projection_dim=8, cell_size=16),
                      BidirectionalLM().heads())
    model.init_weights(torch.Generator().manual_seed(0))
    batch = next(iter(WordStreams(DOCUMENTS, vocab, window=3).batches(0, 2)))
    full_objective, sampled_objective = BidirectionalLM(), BidirectionalLM(sampled=16)
    for objective in (full_objective, sampled_objective):
        objective.eval()
    with torch.no_grad():
        assert torch.equal(full_objective(Passes(model, batch, None), batch).loss_sum,
                           sampled_objective(Passes(model, batch, None), batch).loss_sum)
    sampled_objective.train()
    trained = sampled_objective(Passes(model, batch, None), batch)
    trained.loss_sum.backward()  # a loss over 17 candidates a word, which trains the softmax rows it drew
    assert model.word_embeddings.weight.grad.abs().sum() > 0
    with pytest.raises(ConfigError, match="objectives.bilm.sampled: must be >= 0"):
        BidirectionalLM(sampled=-1)


def test_a_sampled_softmax_larger_than_the_vocabulary_is_refused_before_the_first_step(tmp_path, one_thread,
                                                                                        monkeypatch):
    corpus = write_corpus(tmp_path / "corpus.txt", documents=8)
    steps = []
    monkeypatch.setattr(BidirectionalLM, "forward", lambda self, *a, **k: steps.append(1))
    with pytest.raises(ConfigError, match=r"objectives\.bilm\.sampled: 1000000000 negatives for a vocabulary of "
                                          r"\d+ words; a sampled softmax draws fewer than the vocabulary"):
        pretrain(run_config(corpus, tmp_path / "run", sampled=10**9))
    assert steps == []  # refused when the vocabulary is known, before any batch
    objective = BidirectionalLM(sampled=30)  # the Python objective on its own, at its first training step
    objective.train()
    model = ElmoModel(tiny_config(vocab_size=30, projection_dim=8, cell_size=16, filters=[[1, 4]]))
    with pytest.raises(ConfigError, match=r"sampled: 30 negatives for a vocabulary of 30 words"):
        objective.check_vocabulary(model.config.vocab_size)
