"""Causal-LM pretraining of a GPT-2 from a run config: documents packed into fixed-length rows, attention and
next-token targets confined to each document, the model saved in transformers' layout, held-out perplexity, and an
interrupted run resumed bitwise."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bertology.data.causal import CausalBatches
from bertology.data.dataset import PretrainingDataset
from bertology.data.instances import InMemoryDocuments, InstanceConfig, create_instances
from bertology.errors import ConfigError, TokenizerError
from bertology.tokenization.framing import Framing
from pretrain_helpers import assert_resume_is_bitwise, build, make_assets, run_shipped_config_briefly, tiny_config

ROOT = Path(__file__).resolve().parents[2]
BROWN = ROOT.parent / "shared" / "data" / "brown-nltk"
# A framing of one text as <s> A </s> (ids 1 and 2), padding 0.
FRAMING = Framing(cls_id=1, sep_id=2, pad_id=0, mask_id=None, style="roberta")


def documents(count: int = 9, seed: int = 0) -> InMemoryDocuments:
    rng = np.random.default_rng(seed)
    return InMemoryDocuments([[rng.integers(10, 60, int(rng.integers(1, 9))) for _ in range(int(rng.integers(1, 4)))]
                              for _ in range(count)])


@pytest.fixture(scope="module")
def gpt2_assets(tmp_path_factory):
    """A GPT-2-style byte-level BPE (<|endoftext|>, nothing added around a text) and its shards."""
    return make_assets(tmp_path_factory.mktemp("gpt2-assets"), kind="bpe", style="gpt2")


def settings(**extra):
    return dict(model={"architecture": "decoder", "family": "gpt2", **extra.pop("model", {})},
                data={"instances": {"kind": "packed-documents"}}, objectives={"clm": {}}, **extra)


def raw_config(assets, output_dir, **extra):
    sections = settings(**extra)
    objectives = sections.pop("objectives")
    raw = tiny_config(assets, output_dir, **sections)
    raw["objectives"] = objectives
    return raw


def test_documents_fill_rows_end_to_end_each_token_with_its_document():
    source = documents()
    config = InstanceConfig(kind="packed-documents", max_seq_length=16, seed=3)
    instances, stats = create_instances(source, config, FRAMING)
    assert all(len(x) == 16 for x in instances[:-1]) and 0 < len(instances[-1]) <= 16
    stream = np.concatenate([x.input_ids for x in instances])
    owners = np.concatenate([x.document_ids for x in instances])
    # The stream is every document framed <s> ... </s>, in the shuffled order, each token with its document's index.
    order = list(dict.fromkeys(owners.tolist()))
    assert sorted(order) == list(range(len(source)))
    texts = {}
    for index in order:
        part = stream[owners == index]
        assert part[0] == 1 and part[-1] == 2 and not np.isin(part[1:-1], (0, 1, 2)).any()
        texts[index] = part[1:-1].tolist()
    assert sorted(map(tuple, texts.values())) == sorted(
        tuple(np.concatenate(source.document(i)).tolist()) for i in range(len(source)))
    assert stats.instances == len(instances)


def test_no_target_crosses_a_document_boundary():
    config = InstanceConfig(kind="packed-documents", max_seq_length=16, seed=3)
    dataset = PretrainingDataset(documents(), FRAMING, config, CausalBatches())
    targets = 0
    for batch in dataset.batches(0, 2, drop_last=False):
        rows, cols = batch.masked_positions.unbind(1)
        assert torch.equal(batch.documents[rows, cols], batch.documents[rows, cols + 1])
        assert torch.equal(batch.lm_labels, batch.input_ids[rows, cols + 1])
        # Every pair of neighbours inside one document predicts; none else.
        same = (batch.documents[:, 1:] == batch.documents[:, :-1]) & batch.attention_mask[:, 1:].bool()
        assert len(rows) == int(same.sum())
        # No first token of a document (its <s>) is ever a target.
        assert not (batch.lm_labels == 1).any()
        targets += len(rows)
    # Each row's first token and each document's first token predict nothing before them; a row that starts inside
    # a document (its continuation) counts once.
    instances = create_instances(documents(), config, FRAMING)[0]
    continued = sum(int(a.document_ids[-1] == b.document_ids[0]) for a, b in zip(instances, instances[1:]))
    assert continued > 0
    assert targets == sum(len(x) for x in instances) - len(documents()) - continued


def test_gpt2_pretrains_saves_loads_and_reports_perplexity(gpt2_assets, tmp_path):
    import transformers

    import bertology
    from bertology.recipes.pretrain import pretrain

    result = pretrain(build(raw_config(gpt2_assets, tmp_path / "run")))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    final = [r for r in rows if r["kind"] == "eval"][-1]
    assert final["lm_loss"] > 0 and final["perplexity"] == pytest.approx(np.exp(final["lm_loss"]))
    config = json.loads((result.model_dir / "config.json").read_text())
    assert config["architectures"] == ["GPT2LMHeadModel"] and config["n_embd"] == 32
    loaded = bertology.load(result.model_dir)
    assert type(loaded.model).__name__ == "DecoderModel" and loaded.tokenizer is not None
    ids = torch.tensor([loaded.tokenizer.encode("the cat sat near the old house .").ids])
    hf = transformers.GPT2LMHeadModel.from_pretrained(result.model_dir).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded.model.eval()(ids).logits, hf(ids).logits, atol=1e-5, rtol=1e-5)


def test_a_resumed_gpt2_run_is_bitwise_identical(gpt2_assets, tmp_path):
    extra = dict(optim={"total_steps": 6, "grad_accumulation": 2}, run={"checkpoint_every": 2, "eval_every": 0})
    assert_resume_is_bitwise(lambda output_dir: raw_config(gpt2_assets, output_dir, **extra), tmp_path, crash_at=5)


@pytest.mark.parametrize("change,message", [
    ({"data": {"instances": {"kind": "nsp"}}}, "objectives.clm: next-token prediction reads running text"),
    ({"objectives": {"mlm": {}}}, "objectives.mlm: trains encoder models, but model.architecture is decoder"),
    ({"model": {"architecture": "encoder", "family": "bert"}},
     "objectives.clm: trains decoder models, but model.architecture is encoder"),
    ({"model": {"mem_len": 2}}, r"model.mem_len: unknown key for the decoder architecture \(a field of xlnet"),
    ({"model": {"architecture": "encoder", "family": "bert"}, "objectives": {"mlm": {}}},
     "data.instances.kind: packed-documents rows hold several documents whose boundaries only causal and prefix "
     "LM keep"),
    ({"tokenizer": "wordpiece"}, "model: gpt2 models read texts framed as gpt2 does .* but the tokenizer is "
                                 "bert-style .*: set tokenizer.style: gpt2"),
])
def test_bad_causal_configs_name_the_key(gpt2_assets, assets, tmp_path, change, message):
    raw = raw_config(gpt2_assets, tmp_path / "run")
    raw["objectives"] = change.get("objectives", raw["objectives"])
    raw["data"]["instances"].update(change.get("data", {}).get("instances", {}))
    raw["model"].update(change.get("model", {}))
    if "tokenizer" in change:  # refused when the model is built, before any step
        from bertology.recipes.pretrain import pretrain

        raw["tokenizer"]["path"] = str(assets["tokenizer"])
        raw["data"]["shards"] = str(assets["shards"])
        with pytest.raises(TokenizerError, match=message):
            pretrain(build(raw))
        return
    with pytest.raises(ConfigError, match=message):
        build(raw)


def test_shipped_gpt2_config_runs_on_brown(tmp_path):
    if not BROWN.is_dir():
        pytest.skip(f"the Brown corpus is not at {BROWN} (see ../shared/data/README.md)")
    corpus = [BROWN / f"ca0{i}" for i in range(1, 5)]
    assert run_shipped_config_briefly(ROOT / "configs" / "gpt2-tiny.yaml", tmp_path / "run", corpus) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["kind"] == "eval" and rows[-1]["lm_loss"] > 0
    assert json.loads((tmp_path / "run" / "model" / "config.json").read_text())["model_type"] == "gpt2"


@pytest.mark.slow  # two spawned processes: about 20 s on a shared 2-core machine
def test_two_processes_match_one_process_with_double_batch(gpt2_assets, tmp_path):
    """DDP (two CPU processes, gloo) x batch 4 trains the decoder to the weights of one process x batch 8."""
    import torch.multiprocessing as mp

    from bertology.recipes.pretrain import pretrain
    from test_distributed import _free_port, _worker

    extra = dict(model={"hidden_dropout": 0.0, "attention_dropout": 0.0, "embedding_dropout": 0.0},
                 run={"eval_every": 0, "checkpoint_every": 0, "log_every": 2})
    pretrain(build(raw_config(gpt2_assets, tmp_path / "single", optim={"batch_size": 8, "total_steps": 3}, **extra)))
    double = raw_config(gpt2_assets, tmp_path / "double", optim={"batch_size": 4, "total_steps": 3}, **extra)
    (tmp_path / "seen").mkdir()
    mp.spawn(_worker, args=(2, _free_port(), double, str(tmp_path / "seen")), nprocs=2, join=True)
    ours = load_file(tmp_path / "double" / "model" / "model.safetensors")
    reference = load_file(tmp_path / "single" / "model" / "model.safetensors")
    for key in reference:
        torch.testing.assert_close(ours[key], reference[key], rtol=1e-4, atol=1e-5, msg=key)
