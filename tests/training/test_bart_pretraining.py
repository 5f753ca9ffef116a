"""BART pretraining from a run config: BART's noise (text infilling and sentence permutation) on the shared
pipeline, the denoise objective, the model saved as transformers' BartForConditionalGeneration, an interrupted run
resumed bitwise, and bad configurations named by their key."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bertology.data.shards import prepare_corpus
from bertology.errors import ConfigError
from bertology.tokenization import load_tokenizer, train_tokenizer
from pretrain_helpers import assert_resume_is_bitwise, build, run_shipped_config_briefly, tiny_config, write_corpus

ROOT = Path(__file__).resolve().parents[2]
BROWN = ROOT.parent / "shared" / "data" / "brown-nltk"
NOISE = {"text_infilling": {"rate": 0.3, "poisson_lambda": 3.0}, "sentence_permutation": {"rate": 1.0}}


@pytest.fixture(scope="module")
def bart_assets(tmp_path_factory) -> dict[str, Path]:
    """A byte-level BPE tokenizer (<s> ... </s>, <mask>) and shards of the test corpus."""
    root = tmp_path_factory.mktemp("bart-assets")
    corpus = write_corpus(root / "corpus.txt")
    train_tokenizer([str(corpus)], "bpe", 300, show_progress=False, min_frequency=1).save(root / "tokenizer")
    prepare_corpus(str(corpus), load_tokenizer(root / "tokenizer"), root / "shards", heldout_documents=3,
                   show_progress=False)
    return {"tokenizer": root / "tokenizer", "shards": root / "shards"}


def raw_config(assets, output_dir, **extra):
    objectives = extra.pop("objectives", {"denoise": {}})
    sections = dict(model={"architecture": "seq2seq", "family": "bart", **extra.pop("model", {})},
                    data={"instances": {"kind": "doc-sentences"}, "noise": NOISE, **extra.pop("data", {})}, **extra)
    raw = tiny_config(assets, output_dir, **sections)
    raw["objectives"] = objectives
    return raw


def test_bart_pretrains_saves_loads_and_reports_perplexity(bart_assets, tmp_path):
    import transformers

    import bertology
    from bertology.recipes.pretrain import pretrain

    result = pretrain(build(raw_config(bart_assets, tmp_path / "run")))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    final = [r for r in rows if r["kind"] == "eval"][-1]
    assert len(train) == 6 and final["denoise_loss"] > 0
    assert final["perplexity"] == pytest.approx(np.exp(final["denoise_loss"]))
    config = json.loads((result.model_dir / "config.json").read_text())
    assert config["architectures"] == ["BartForConditionalGeneration"] and config["d_model"] == 32
    tokenizer = load_tokenizer(bart_assets["tokenizer"])
    assert config["decoder_start_token_id"] == tokenizer.sep_id  # BART's decoder starts from </s>
    loaded = bertology.load(result.model_dir)
    assert type(loaded.model).__name__ == "Seq2SeqModel"
    source = torch.tensor([tokenizer.encode("the cat <mask> near the house .").ids])
    labels = torch.tensor([tokenizer.encode("the cat sat near the house .").ids])
    hf = transformers.BartForConditionalGeneration.from_pretrained(result.model_dir).eval()
    with torch.no_grad():
        ours = loaded.model.eval()(source, labels=labels)
        theirs = hf(input_ids=source, labels=labels)
    torch.testing.assert_close(ours.logits, theirs.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=1e-5)


def test_the_batches_are_noised_documents_and_their_originals(bart_assets, tmp_path):
    from bertology.recipes.pretrain import build_datasets
    from bertology.data.shards import TokenizedCorpus

    config = build(raw_config(bart_assets, tmp_path / "run"))
    tokenizer = load_tokenizer(bart_assets["tokenizer"])
    train, _ = build_datasets(config, tokenizer, TokenizedCorpus(bart_assets["shards"], tokenizer), None)
    batch = next(iter(train.batches(0, 4)))
    mask = tokenizer.framing.mask_id
    for r in range(len(batch)):
        source = batch.input_ids[r, :int(batch.attention_mask[r].sum())]
        target = batch.labels[r][batch.labels[r] != -100]
        assert source[0] == target[0] == tokenizer.cls_id and source[-1] == target[-1] == tokenizer.sep_id
        kept = int(((source != mask) & (source != tokenizer.cls_id) & (source != tokenizer.sep_id)).sum())
        assert kept == len(target) - 2 - round(0.3 * (len(target) - 2))  # 30 % of the text infilled
        assert int((source == mask).sum()) >= 1
    assert torch.equal(batch.lm_labels, batch.labels[batch.labels != -100])


def test_a_resumed_bart_run_is_bitwise_identical(bart_assets, tmp_path):
    extra = dict(optim={"total_steps": 6, "grad_accumulation": 2}, run={"checkpoint_every": 2, "eval_every": 0})
    assert_resume_is_bitwise(lambda output_dir: raw_config(bart_assets, output_dir, **extra), tmp_path, crash_at=5)


@pytest.mark.parametrize("change,message", [
    ({"data": {"noise": None}}, "objectives.denoise: needs sources and targets: set data.span_corruption .* or "
                                "data.noise"),
    ({"data": {"span_corruption": {}}}, "data.noise: give T5's span corruption .* not both"),
    ({"data": {"instances": {"kind": "full-sentences"}}}, "data.noise: BART's noise takes one document a row"),
    ({"data": {"noise": {"text_infilling": {"rate": 1.5}}}}, r"data.noise.text_infilling.rate: must be in \(0, 1\)"),
    ({"data": {"noise": {"text_infiling": {}}}}, "data.noise.text_infiling: unknown key; did you mean "
                                                  "text_infilling?"),
    ({"data": {"noise": {}}}, "data.noise: no noise function chosen"),
])
def test_bad_bart_configs_name_the_key(bart_assets, tmp_path, change, message):
    raw = raw_config(bart_assets, tmp_path / "run")
    for key, value in change.get("data", {}).items():
        if key == "instances":
            raw["data"]["instances"].update(value)
        else:
            raw["data"][key] = value
    with pytest.raises(ConfigError, match=message):
        build(raw)
    raw = raw_config(bart_assets, tmp_path / "run", objectives={"clm": {}},
                     model={"architecture": "decoder", "family": "gpt2"})
    with pytest.raises(ConfigError, match="data.noise: makes sources and targets for objectives.denoise"):
        build(raw)


def test_shipped_bart_config_runs_on_brown(tmp_path):
    if not BROWN.is_dir():
        pytest.skip(f"the Brown corpus is not at {BROWN} (see ../shared/data/README.md)")
    corpus = [BROWN / f"ca0{i}" for i in range(1, 5)]
    assert run_shipped_config_briefly(ROOT / "configs" / "bart-tiny.yaml", tmp_path / "run", corpus) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["kind"] == "eval" and rows[-1]["denoise_loss"] > 0
    assert json.loads((tmp_path / "run" / "model" / "config.json").read_text())["model_type"] == "bart"


@pytest.mark.slow  # two spawned processes: about 35 s on a shared 2-core machine
def test_two_processes_match_one_process_with_double_batch(bart_assets, tmp_path):
    """DDP (two CPU processes, gloo) x batch 4 trains BART to the weights of one process x batch 8: each rank's rows
    get the noise of their own keys."""
    import torch.multiprocessing as mp

    from bertology.recipes.pretrain import pretrain
    from test_distributed import _free_port, _worker

    extra = dict(model={"hidden_dropout": 0.0, "attention_dropout": 0.0},
                 run={"eval_every": 0, "checkpoint_every": 0, "log_every": 2})
    pretrain(build(raw_config(bart_assets, tmp_path / "single", optim={"batch_size": 8, "total_steps": 3}, **extra)))
    double = raw_config(bart_assets, tmp_path / "double", optim={"batch_size": 4, "total_steps": 3}, **extra)
    (tmp_path / "seen").mkdir()
    mp.spawn(_worker, args=(2, _free_port(), double, str(tmp_path / "seen")), nprocs=2, join=True)
    ours = load_file(tmp_path / "double" / "model" / "model.safetensors")
    reference = load_file(tmp_path / "single" / "model" / "model.safetensors")
    for key in reference:
        torch.testing.assert_close(ours[key], reference[key], rtol=1e-4, atol=1e-5, msg=key)
