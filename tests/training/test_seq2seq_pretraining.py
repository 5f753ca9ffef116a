"""T5 pretraining from a run config: span corruption on the shared pipeline, the denoise objective, the model
saved as transformers' T5ForConditionalGeneration, held-out perplexity, an interrupted run resumed bitwise, the
training step's loss and gradients equal to transformers', and bad configurations named by their key."""

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


@pytest.fixture(scope="module")
def t5_assets(tmp_path_factory) -> dict[str, Path]:
    """T5-style Unigram tokenizers (100 sentinels, and a second one with 3) and their shards."""
    root = tmp_path_factory.mktemp("t5-assets")
    corpus = write_corpus(root / "corpus.txt")
    for name, count in (("tokenizer", 100), ("few-sentinels", 3)):
        train_tokenizer([str(corpus)], "unigram", 120, style="t5", sentinels=count, show_progress=False).save(
            root / name)
    tokenizer = load_tokenizer(root / "tokenizer")
    assert tokenizer.style == "t5" and len(tokenizer.framing.sentinels) == 100
    assert tokenizer.token_to_id("<extra_id_0>") == tokenizer.vocab_size - 1  # numbered down from the end, as T5's
    prepare_corpus(str(corpus), tokenizer, root / "shards", heldout_documents=3, show_progress=False)
    prepare_corpus(str(corpus), load_tokenizer(root / "few-sentinels"), root / "few-shards",
                   heldout_documents=3, show_progress=False)
    return {"tokenizer": root / "tokenizer", "shards": root / "shards", "few": root / "few-sentinels",
            "few-shards": root / "few-shards"}


def raw_config(assets, output_dir, **extra):
    objectives = extra.pop("objectives", {"denoise": {}})
    sections = dict(model={"architecture": "seq2seq", "family": "t5", **extra.pop("model", {})},
                    data={"instances": {"kind": "doc-sentences"}, "span_corruption": {}, **extra.pop("data", {})},
                    **extra)
    raw = tiny_config(assets, output_dir, **sections)
    raw["tokenizer"] = {"path": str(assets["tokenizer"])}
    raw["objectives"] = objectives
    return raw


def test_t5_pretrains_saves_loads_and_reports_perplexity(t5_assets, tmp_path):
    import transformers

    import bertology
    from bertology.recipes.pretrain import pretrain

    result = pretrain(build(raw_config(t5_assets, tmp_path / "run")))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    final = [r for r in rows if r["kind"] == "eval"][-1]
    assert final["denoise_loss"] > 0 and final["perplexity"] == pytest.approx(np.exp(final["denoise_loss"]))
    config = json.loads((result.model_dir / "config.json").read_text())
    assert config["architectures"] == ["T5ForConditionalGeneration"] and config["d_model"] == 32
    tokenizer = load_tokenizer(t5_assets["tokenizer"])
    assert config["decoder_start_token_id"] == tokenizer.pad_id and config["eos_token_id"] == tokenizer.sep_id
    loaded = bertology.load(result.model_dir)
    assert type(loaded.model).__name__ == "Seq2SeqModel"
    source = torch.tensor([tokenizer.encode("the cat <extra_id_0> near the house .").ids])
    labels = torch.tensor([tokenizer.encode("<extra_id_0> sat").ids])
    hf = transformers.T5ForConditionalGeneration.from_pretrained(result.model_dir).eval()
    with torch.no_grad():
        ours = loaded.model.eval()(source, labels=labels)
        theirs = hf(input_ids=source, labels=labels)
    torch.testing.assert_close(ours.logits, theirs.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("objective", ["iid-spans", "bert", "mass", "drop", "deshuffle", "prefix-lm"])
def test_each_t5_objective_pretrains_and_saves_a_t5_model(t5_assets, tmp_path, objective):
    """A few steps of each of T5's objectives (data.span_corruption.objective): a finite loss that is not the same
    every step, and a model that transformers loads as T5ForConditionalGeneration with our logits."""
    import transformers

    import bertology
    from bertology.recipes.pretrain import pretrain

    raw = raw_config(t5_assets, tmp_path / "run", data={"span_corruption": {"objective": objective}},
                     optim={"total_steps": 3}, run={"eval_every": 3, "checkpoint_every": 0})
    result = pretrain(build(raw))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r["loss"] for r in rows if r["kind"] == "train"]
    final = [r for r in rows if r["kind"] == "eval"][-1]
    assert len(train) == 3 and all(np.isfinite(train)) and len(set(train)) > 1
    assert np.isfinite(final["denoise_loss"]) and final["denoise_loss"] > 0
    assert json.loads((result.model_dir / "config.json").read_text())["architectures"] == [
        "T5ForConditionalGeneration"]
    tokenizer = load_tokenizer(t5_assets["tokenizer"])
    source = torch.tensor([tokenizer.encode("the cat <extra_id_0> near the house .").ids])
    labels = torch.tensor([tokenizer.encode("the cat sat near the house .").ids])
    hf = transformers.T5ForConditionalGeneration.from_pretrained(result.model_dir).eval()
    with torch.no_grad():
        ours = bertology.load(result.model_dir).model.eval()(source, labels=labels)
        theirs = hf(input_ids=source, labels=labels)
    torch.testing.assert_close(ours.logits, theirs.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=1e-5)


def test_a_resumed_t5_run_is_bitwise_identical(t5_assets, tmp_path):
    extra = dict(optim={"total_steps": 6, "grad_accumulation": 2}, run={"checkpoint_every": 2, "eval_every": 0})
    assert_resume_is_bitwise(lambda output_dir: raw_config(t5_assets, output_dir, **extra), tmp_path, crash_at=5)


def test_more_noise_spans_than_sentinels_is_refused_naming_the_option(t5_assets, tmp_path):
    from bertology.recipes.pretrain import pretrain

    raw = raw_config(t5_assets, tmp_path / "run", data={"span_corruption": {"mean_noise_span_length": 1.0}})
    raw["tokenizer"] = {"path": str(t5_assets["few"])}
    raw["data"]["shards"] = str(t5_assets["few-shards"])
    with pytest.raises(ConfigError, match=r"data\.span_corruption\.mean_noise_span_length: a text of 47 tokens gets "
                                          r"7 noise tokens in 7 spans .*the tokenizer's 3 sentinels"):
        pretrain(build(raw))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize("change,message", [
    ({"data": {"span_corruption": None}}, "objectives.denoise: needs sources and targets: set data.span_corruption"),
    ({"objectives": {"clm": {}}}, "objectives.clm: trains decoder models, but model.architecture is seq2seq"),
    ({"model": {"architecture": "decoder", "family": "gpt2"}},
     "objectives.denoise: trains seq2seq models, but model.architecture is decoder"),
    ({"data": {"instances": {"kind": "nsp"}}}, "objectives.denoise: corrupts running text"),
])
def test_bad_seq2seq_configs_name_the_key(t5_assets, tmp_path, change, message):
    raw = raw_config(t5_assets, tmp_path / "run")
    if "objectives" in change:
        raw["objectives"] = change["objectives"]
    for key, value in change.get("data", {}).items():
        raw["data"][key] = value
    raw["model"].update(change.get("model", {}))
    with pytest.raises(ConfigError, match=message):
        build(raw)
    raw = raw_config(t5_assets, tmp_path / "run", objectives={"clm": {}},
                     model={"architecture": "decoder", "family": "gpt2"})
    with pytest.raises(ConfigError, match="data.span_corruption: makes sources and targets for objectives.denoise"):
        build(raw)


def test_shipped_t5_config_runs_on_brown(tmp_path):
    if not BROWN.is_dir():
        pytest.skip(f"the Brown corpus is not at {BROWN} (see ../shared/data/README.md)")
    corpus = [BROWN / f"ca0{i}" for i in range(1, 5)]
    assert run_shipped_config_briefly(ROOT / "configs" / "t5-tiny.yaml", tmp_path / "run", corpus) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["kind"] == "eval" and rows[-1]["denoise_loss"] > 0
    recorded = json.loads((tmp_path / "run" / "run_config.json").read_text())
    assert recorded["data"]["span_corruption"]["random_roll"] is True  # the recipe the config's table measured
    assert recorded["optim"]["embedding_lr_scale"] == pytest.approx(11.3)
    tokenizer = load_tokenizer(tmp_path / "run" / "model")  # config.json says t5: the sentinels are found
    assert tokenizer.style == "t5" and len(tokenizer.framing.sentinels) == 100


def test_shipped_t5_objectives_config_runs_on_brown(tmp_path):
    if not BROWN.is_dir():
        pytest.skip(f"the Brown corpus is not at {BROWN} (see ../shared/data/README.md)")
    corpus = [BROWN / f"ca0{i}" for i in range(1, 5)]
    path = ROOT / "configs" / "t5-objectives-tiny.yaml"
    assert run_shipped_config_briefly(path, tmp_path / "run", corpus) == 0
    recorded = json.loads((tmp_path / "run" / "run_config.json").read_text())["data"]["span_corruption"]
    assert recorded["objective"] == "iid-spans"
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["kind"] == "eval" and np.isfinite(rows[-1]["denoise_loss"]) and rows[-1]["denoise_loss"] > 0


@pytest.mark.slow  # two spawned processes: about 20 s on a shared 2-core machine
def test_two_processes_match_one_process_with_double_batch(t5_assets, tmp_path):
    """DDP (two CPU processes, gloo) x batch 4 trains the encoder-decoder to the weights of one process x batch 8."""
    import torch.multiprocessing as mp

    from bertology.recipes.pretrain import pretrain
    from test_distributed import _free_port, _worker

    extra = dict(model={"hidden_dropout": 0.0, "attention_dropout": 0.0},
                 run={"eval_every": 0, "checkpoint_every": 0, "log_every": 2})
    pretrain(build(raw_config(t5_assets, tmp_path / "single", optim={"batch_size": 8, "total_steps": 3}, **extra)))
    double = raw_config(t5_assets, tmp_path / "double", optim={"batch_size": 4, "total_steps": 3}, **extra)
    (tmp_path / "seen").mkdir()
    mp.spawn(_worker, args=(2, _free_port(), double, str(tmp_path / "seen")), nprocs=2, join=True)
    ours = load_file(tmp_path / "double" / "model" / "model.safetensors")
    reference = load_file(tmp_path / "single" / "model" / "model.safetensors")
    for key in reference:
        torch.testing.assert_close(ours[key], reference[key], rtol=1e-4, atol=1e-5, msg=key)


def test_an_older_run_config_without_the_new_keys_still_compares_equal():
    """A checkpoint written before decoders existed records no tokenizer.sentinels, data.span_corruption or
    decoder-only model keys: resuming it must not see them as changed settings."""
    from bertology.training.config import PretrainConfig
    from bertology.training.trainer import check_same_run

    current = PretrainConfig().to_dict()
    older = json.loads(json.dumps(current))
    del older["tokenizer"]["sentinels"], older["data"]["span_corruption"]
    # An encoder's model section as older versions recorded it (every field of both schemas, unset ones null, no
    # architecture) compares equal to the same section now.
    del older["model"]["architecture"]
    older["model"].update({key: None for key in ("family", "hidden_size", "num_decoder_layers", "gated_ffn",
                                                 "positions", "relative_attention_num_buckets")})
    check_same_run("checkpoint", older, current)
    with pytest.raises(ConfigError, match="tokenizer.sentinels: sentinels are T5's, for a t5-style tokenizer"):
        PretrainConfig.from_dict({"tokenizer": {"sentinels": 10}})
    assert PretrainConfig.from_dict({"tokenizer": {"style": "t5", "kind": "unigram", "sentinels": 10}})


def test_model_configs_follow_the_preset_the_family_and_the_tokenizer(t5_assets, assets):
    from bertology.model.checkpoint import config_to_hf
    from bertology.model.heads import HeadSpec
    from bertology.recipes.pretrain import build_model_config

    tokenizer = load_tokenizer(t5_assets["tokenizer"])
    raw = raw_config(t5_assets, Path("unused"))
    raw["model"] = {"architecture": "seq2seq", "family": "t5", "preset": "mini", "gated_ffn": True,
                    "hidden_act": "gelu_new"}
    v11 = build(raw)
    config = build_model_config(v11, tokenizer)
    assert (config.num_layers, config.num_decoder_layers, config.hidden_size, config.num_heads) == (4, 4, 256, 4)
    assert config.head_dim == 64 and config.intermediate_size == 1024 and config.logit_scale == 256 ** -0.5
    assert (config.pad_token_id, config.eos_token_id, config.decoder_start_token_id) == (
        tokenizer.pad_id, tokenizer.sep_id, tokenizer.pad_id)
    hf = config_to_hf(config, (HeadSpec("lm", "tied_lm"),))
    assert hf["feed_forward_proj"] == "gated-gelu" and hf["d_kv"] == 64 and hf["vocab_size"] == tokenizer.vocab_size
    raw = raw_config(t5_assets, Path("unused"), data={"span_corruption": None}, objectives={"clm": {}})
    raw["model"] = {"architecture": "decoder", "family": "gpt2", "preset": "tiny"}
    raw["data"]["instances"]["kind"] = "packed-documents"
    gpt2 = build(raw)
    wordpiece = load_tokenizer(assets["tokenizer"])
    config = build_model_config(gpt2, wordpiece)
    assert (config.num_layers, config.hidden_size, config.num_heads, config.intermediate_size) == (2, 128, 2, 512)
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (
        wordpiece.cls_id, wordpiece.sep_id, wordpiece.pad_id)


def _float64_t5_norm(self, hidden):
    """transformers' T5LayerNorm with its variance in the input's dtype (theirs is float32 whatever the input's)."""
    return self.weight * (hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("layouts", [False, True], ids=["cpu-batch", "device-layouts"])
def test_denoise_training_step_has_transformers_t5_gradients(t5_assets, tmp_path, monkeypatch, dtype, layouts):
    """One batch of the pretraining pipeline (span corruption, the decoder inputs behind the start token) through
    the training loss as the trainer calls it (the packed forward, the denoise objective's summed loss over the
    units) has transformers' T5ForConditionalGeneration loss and gradients on the same weights (T5's init, saved and
    loaded): every encoder and cross-attention parameter gets its gradient. float64: equal to rounding (1e-10 of
    each gradient's largest entry; transformers' norm made float64 too); float32, the training dtype (the in-place
    summed cross-entropy): 1e-5. `layouts`: the packings the trainer builds for a batch on a GPU."""
    import transformers
    from transformers.models.t5 import modeling_t5

    from bertology.model.checkpoint import save_model
    from bertology.model.packing import Layout
    from bertology.objectives.compose import TrainingLoss
    from bertology.recipes import pretrain as recipe
    from transformer_helpers import t5_state_dict

    if dtype == torch.float64:
        monkeypatch.setattr(modeling_t5.T5LayerNorm, "forward", _float64_t5_norm)
    config = build(raw_config(t5_assets, tmp_path / "run"))
    torch.manual_seed(0)
    objectives = config.build_objectives()
    tokenizer = recipe.build_tokenizer(config)
    train, heldout = recipe.build_corpus(config, tokenizer)
    model = recipe.build_model(config, tokenizer, objectives)
    data, _ = recipe.build_datasets(config, tokenizer, train, heldout, objectives, model.config)
    batch = next(iter(data.batches(0, 4, 0, 0, 1)))
    # The decoder reads the targets behind T5's start token (the padding id); the labels are the targets, whose
    # sentinels are the ones in the same row's source, in the same order.
    assert model.config.decoder_start_token_id == tokenizer.pad_id == 0
    assert (batch.decoder_input_ids[:, 0] == 0).all()
    targets = batch.labels.masked_fill(batch.labels == -100, tokenizer.pad_id)
    assert torch.equal(batch.decoder_input_ids[:, 1:], targets[:, :-1])
    sentinels = set(tokenizer.framing.sentinels)
    for source, mask, labels in zip(batch.input_ids, batch.attention_mask, batch.labels):
        in_source = [i for i in source[mask.bool()].tolist() if i in sentinels]
        in_target = [i for i in labels.tolist() if i in sentinels]
        assert in_source == in_target and in_source
    if layouts:
        batch.layout, batch.decoder_layout = Layout(batch.attention_mask), Layout(batch.decoder_attention_mask)
    model = model.to(dtype).eval()
    save_model(model, tmp_path / "model")
    hf = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "model", dtype=dtype).eval()

    loss_module = TrainingLoss(model, objectives)
    # The unit counts as the trainer divides by them (float32 there; in the weights' dtype here, so that 1 / units
    # is not rounded to float32 in the float64 check)
    units = {name: unit.to(dtype) for name, unit in loss_module.units(batch).items()}
    ours, _ = loss_module(batch, units)
    ours.backward()
    theirs = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                decoder_input_ids=batch.decoder_input_ids, decoder_attention_mask=batch.decoder_attention_mask,
                labels=batch.labels).loss
    theirs.backward()
    tolerance = 1e-10 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(ours, theirs, rtol=tolerance, atol=0)

    class Gradients:  # transformers' gradients under the model's names
        config = hf.config

        def state_dict(self):
            return {name: p.grad for name, p in hf.named_parameters()}

    expected = t5_state_dict(Gradients())
    gradients = {name: p.grad for name, p in model.named_parameters()}
    assert set(gradients) == set(expected)
    assert any(name.startswith("encoder.") for name in gradients) and any("cross_" in name for name in gradients)
    for name, grad in gradients.items():
        scale = expected[name].abs().max().item()
        assert grad is not None and scale > 0, name
        torch.testing.assert_close(grad, expected[name], rtol=0, atol=tolerance * scale, msg=name)
