"""ELECTRA: the generator's shape and shared embeddings, the two losses against a hand computation, the labels
(a sample equal to the original is original), the replaced share against the generator's distribution, the
transformers round trips of the discriminator and the generator, bad options, and a run of configs/electra-tiny.yaml."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bertology
from bertology.data.dataset import PretrainingBatch
from bertology.errors import ConfigError
from bertology.model import TransformerConfig, EncoderModel
from bertology.objectives import TrainingLoss, build_objectives
from bertology.objectives.base import Passes
from bertology.objectives.electra import Electra, generator_config, sample_from_logits, sampling_keys

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "training"))
from pretrain_helpers import make_assets  # noqa: E402


def _discriminator(electra: Electra, embedding_size: int | None = 16) -> EncoderModel:
    config = TransformerConfig(family="electra", vocab_size=40, hidden_size=32, num_layers=2, num_heads=2,
                           intermediate_size=64, max_position_embeddings=32, pooler=False,
                           embedding_size=embedding_size, hidden_dropout=0.0, attention_dropout=0.0)
    electra.activation = "gelu"
    model = EncoderModel(config, electra.heads())
    model.init_weights(torch.Generator().manual_seed(0))
    electra.attach(model, torch.Generator().manual_seed(1))
    return model


def _batch(seed: int = 0, rows: int = 4, width: int = 10, vocab: int = 40) -> PretrainingBatch:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(6, width + 1, (rows,), generator=g)
    lengths[0] = width
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    original = torch.randint(5, vocab, (rows, width), generator=g) * mask
    selected = (torch.rand(rows, width, generator=g) < 0.3) & mask.bool()
    selected[:, 1] = True
    positions = selected.nonzero()
    ids = original.clone()
    ids[selected] = 4  # [MASK]
    return PretrainingBatch(ids, mask, torch.zeros_like(ids), positions, original[selected],
                            None, torch.arange(rows))


def test_generator_shape_and_shared_embeddings():
    electra = Electra(generator_size=0.25)
    model = _discriminator(electra)
    gen = electra.generator
    assert gen is not None
    assert (gen.config.hidden_size, gen.config.num_heads, gen.config.intermediate_size) == (8, 1, 16)
    assert gen.config.embedding_size == 16 and gen.encoder.embeddings.project is not None  # 16 -> 8
    for part in ("word", "position", "token_type", "norm"):
        assert getattr(gen.encoder.embeddings, part) is getattr(model.encoder.embeddings, part)
    # One set of embedding parameters in the training module: optimised once, through both losses.
    loss_module = TrainingLoss(model, [electra])
    params = list(loss_module.parameters())
    assert len(params) == len({id(p) for p in params})
    assert generator_config(model.config, 1.0).embedding_size == 16  # as wide as the discriminator: still 16 -> 32
    same_width = generator_config(TransformerConfig(hidden_size=64, num_heads=1, intermediate_size=128), 0.5)
    assert same_width.hidden_size == 32 and same_width.embedding_size == 64


def test_losses_and_metrics_match_a_hand_computation():
    electra = Electra(generator_size=0.5, rtd_weight=50.0)
    model = _discriminator(electra).eval()
    loss_module = TrainingLoss(model, [electra]).eval()
    batch = _batch()
    units = {k: v.float() for k, v in loss_module.units(batch).items()}
    assert set(units) == {"generator", "rtd"}
    assert units["rtd"] == batch.attention_mask.sum() and units["generator"] == len(batch.mlm_labels)
    loss, stats = loss_module(batch, units)

    gen = electra.generator
    with torch.no_grad():
        logits = gen(batch.input_ids, batch.attention_mask, batch.token_type_ids,
                     masked_positions=batch.masked_positions).head_logits["mlm"]
        keys = sampling_keys(electra.seed, batch.input_ids, batch.attention_mask, batch.instance_ids)
        from bertology.data.masking import _keyed_uniforms

        u = _keyed_uniforms(keys, batch.input_ids.shape[1], 0)
        rows, cols = batch.masked_positions[:, 0], batch.masked_positions[:, 1]
        samples = sample_from_logits(logits, u[rows, cols])
        corrupted = batch.input_ids.clone()
        corrupted[rows, cols] = samples
        labels = torch.zeros(batch.input_ids.shape)
        labels[rows, cols] = (samples != batch.mlm_labels).float()
        disc = model(corrupted, batch.attention_mask, batch.token_type_ids).head_logits["rtd"]
        real = batch.attention_mask.bool()
        gen_loss = F.cross_entropy(logits, batch.mlm_labels)
        rtd_loss = F.binary_cross_entropy_with_logits(disc[real], labels[real])
    torch.testing.assert_close(loss.detach(), gen_loss + 50.0 * rtd_loss, rtol=1e-5, atol=1e-5)
    summary = loss_module.summarize({k: float(v) for k, v in stats.items()})
    predicted, replaced = (disc > 0) & real, labels.bool()
    assert summary["rtd_accuracy"] == pytest.approx(float(((predicted == replaced) & real).sum() / real.sum()))
    assert summary["rtd_replaced_share"] == pytest.approx(float(replaced.sum()) / len(batch.mlm_labels))
    tp = float((predicted & replaced).sum())
    assert summary["rtd_recall"] == pytest.approx(tp / float(replaced.sum()))
    assert summary["generator_accuracy"] == pytest.approx(
        float((logits.argmax(-1) == batch.mlm_labels).float().mean()))
    assert summary["loss"] == pytest.approx(summary["generator_loss"] + 50 * summary["rtd_loss"], rel=1e-6)
    # No gradient flows through the sampling: the discriminator's loss gives the generator's own layers none.
    loss_module.zero_grad()
    out = loss_module.objectives[1](Passes(model, batch, None), batch)
    out.loss_sum.backward()
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in gen.encoder.layers.parameters())
    assert model.heads["rtd"].out.weight.grad.abs().sum() > 0


def test_a_sample_equal_to_the_original_counts_as_original():
    electra = Electra(generator_size=0.5)
    model = _discriminator(electra)
    batch = _batch(1)
    batch.mlm_labels[:] = 7
    with torch.no_grad():
        electra.generator.heads["mlm"].bias[7] = 1e4  # the generator always proposes token 7: the original
    done = electra.replace(Passes(model, batch, None), batch)
    assert torch.equal(done.samples, batch.mlm_labels) and done.labels.sum() == 0
    rows, cols = batch.masked_positions[:, 0], batch.masked_positions[:, 1]
    assert torch.equal(done.corrupted[rows, cols], batch.mlm_labels)
    with torch.no_grad():
        electra.generator.heads["mlm"].bias[7] = -1e4
        electra.generator.heads["mlm"].bias[9] = 1e4
    done = electra.replace(Passes(model, batch, None), batch)
    assert done.labels[rows, cols].eq(1).all() and done.labels.sum() == len(rows)


def test_sampling_is_keyed_and_follows_the_distribution():
    """Chi-square of 20,000 keyed draws against a fixed distribution; the same keys give the same draws."""
    probs = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05], dtype=torch.float64)
    n = 20_000
    ids = torch.arange(n)[:, None].expand(n, 3).contiguous()
    keys = sampling_keys(0, ids, torch.ones_like(ids), None)
    from bertology.data.masking import _keyed_uniforms

    u = _keyed_uniforms(keys, 3, 0)[:, 1]
    draws = sample_from_logits(probs.log()[None].expand(n, 5), u)
    counts = torch.bincount(draws, minlength=5).double()
    chi2 = float(((counts - n * probs) ** 2 / (n * probs)).sum())
    assert chi2 < 18.47, chi2  # the 0.999 quantile of chi-square with 4 degrees of freedom
    assert torch.equal(draws, sample_from_logits(probs.log()[None].expand(n, 5), u))
    assert not torch.equal(keys, sampling_keys(1, ids, torch.ones_like(ids), None))


def test_replaced_share_matches_the_generators_distribution():
    """Over many batches the number of replaced tokens is sum_i (1 - p_i(original_i)) within 4 standard deviations
    (a sum of independent Bernoullis), with the generator's own p."""
    electra = Electra(generator_size=0.5)
    model = _discriminator(electra).eval()
    electra.eval()
    with torch.no_grad():  # a peaked generator: replacement probabilities spread over (0, 1)
        electra.generator.heads["mlm"].bias[5:12] = torch.linspace(1.0, 4.0, 7)
    expected = variance = observed = 0.0
    for seed in range(12):
        batch = _batch(seed, rows=24, vocab=12)
        with torch.no_grad():
            done = electra.replace(Passes(model, batch, None), batch)
            p = torch.softmax(done.generator_logits.double(), -1).gather(1, batch.mlm_labels[:, None]).squeeze(1)
        expected += float((1 - p).sum())
        variance += float((p * (1 - p)).sum())
        observed += float(done.labels.sum())
    assert variance > 50
    assert abs(observed - expected) < 4 * math.sqrt(variance), (observed, expected, variance)


def test_discriminator_and_generator_load_in_transformers_with_the_same_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    electra = Electra(generator_size=0.5)
    model = _discriminator(electra, embedding_size=None).eval()
    bertology.model.checkpoint.Pretrained(model, None).save(tmp_path / "model")
    electra.save_with_model(tmp_path, None)
    ids = torch.randint(5, 40, (3, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    with torch.no_grad():
        disc = transformers.ElectraForPreTraining.from_pretrained(tmp_path / "model").eval()
        gen = transformers.ElectraForMaskedLM.from_pretrained(tmp_path / "generator").eval()
        ours_disc = bertology.load(tmp_path / "model").model(ids, mask).head_logits["rtd"]
        ours_gen = bertology.load(tmp_path / "generator").model(ids, mask).head_logits["mlm"]
        real = mask.bool()
        torch.testing.assert_close(disc(ids, attention_mask=mask).logits[real], ours_disc[real], atol=1e-5, rtol=0)
        torch.testing.assert_close(gen(ids, attention_mask=mask).logits[real], ours_gen[real], atol=1e-5, rtol=0)
        torch.testing.assert_close(ours_gen[real], electra.generator(ids, mask).head_logits["mlm"][real])
    assert disc.config.model_type == "electra" and gen.config.hidden_size == 16
    assert torch.equal(gen.electra.embeddings.word_embeddings.weight, disc.electra.embeddings.word_embeddings.weight)


@pytest.mark.parametrize("options, key", [({"generator_size": 1.5}, "generator_size"),
                                          ({"generator_size": 0.0}, "generator_size"),
                                          ({"generator_layers": 0}, "generator_layers"),
                                          ({"rtd_weight": -1.0}, "rtd_weight")])
def test_bad_options_name_the_key(options, key):
    with pytest.raises(ConfigError, match=rf"objectives\.electra\.{key}"):
        build_objectives({"electra": options})


def test_a_generator_deeper_than_the_discriminator_is_refused():
    with pytest.raises(ConfigError, match=r"objectives\.electra\.generator_layers: 5 is deeper"):
        _discriminator(Electra(generator_layers=5))


@pytest.mark.slow
def test_electra_tiny_config_runs_end_to_end(tmp_path):
    """configs/electra-tiny.yaml through the CLI on a small corpus: both models written, metrics logged."""
    assets = make_assets(tmp_path)
    out = tmp_path / "run"
    settings = {"tokenizer.path": assets["tokenizer"], "data.shards": assets["shards"], "data.corpus": "[]",
                "model.preset": "null", "model.hidden_size": 32, "model.num_layers": 2, "model.num_heads": 2,
                "model.intermediate_size": 64, "model.max_position_embeddings": 64,
                "data.instances.max_seq_length": 48, "optim.batch_size": 4, "optim.total_steps": 3,
                "run.output_dir": out, "run.eval_every": 0, "run.eval_batches": 2, "run.checkpoint_every": 0,
                "run.log_every": 1, "run.progress": "false", "speed.threads": 1, "speed.prefetch": 0}
    command = [sys.executable, "-m", "bertology.cli.main", "pretrain", "--config", str(ROOT / "configs/electra-tiny.yaml")]
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    import json

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {"generator_accuracy", "rtd_precision", "rtd_recall"} <= set(rows[-1])
    assert json.loads((out / "model" / "config.json").read_text())["architectures"] == ["ElectraForPreTraining"]
    assert json.loads((out / "generator" / "config.json").read_text())["architectures"] == ["ElectraForMaskedLM"]


def test_resume_is_bitwise_with_sampling_keyed_by_the_batch(tmp_path):
    """A run resumed from its step-2 checkpoint ends with the same discriminator and generator, bit for bit."""
    import shutil

    from safetensors.torch import load_file

    from bertology.recipes.pretrain import pretrain
    from bertology.training.config import PretrainConfig

    sys.path.insert(0, str(ROOT / "tests" / "training"))
    from pretrain_helpers import tiny_config

    assets = make_assets(tmp_path)

    def config(out: Path) -> PretrainConfig:
        return PretrainConfig.from_dict(tiny_config(
            assets, out, model={"family": "electra"}, data={"instances": {"kind": "full-sentences"}},
            objectives={"electra": {"generator_size": 0.5}},
            optim={"total_steps": 4}, run={"checkpoint_every": 2, "eval_every": 0, "keep_last": 3}))

    pretrain(config(tmp_path / "a"))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    for name in ("model", "generator", "checkpoints/step-0000004"):
        shutil.rmtree(tmp_path / "b" / name)
    assert (tmp_path / "b" / "checkpoints" / "step-0000002").is_dir()
    pretrain(config(tmp_path / "b"), resume=True)
    for part in ("model", "generator"):
        a = load_file(tmp_path / "a" / part / "model.safetensors")
        b = load_file(tmp_path / "b" / part / "model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), part


def test_a_bert_family_generator_with_a_projection_is_saved_natively(tmp_path):
    """transformers' BERT has no embedding projection: such a generator goes to bertology's native format."""
    import bertology

    electra = Electra(generator_size=0.5, activation="gelu")
    config = TransformerConfig(vocab_size=40, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                           max_position_embeddings=32)
    model = EncoderModel(config, electra.heads())
    model.init_weights(torch.Generator().manual_seed(0))
    electra.attach(model, torch.Generator().manual_seed(1))
    path = electra.save_with_model(tmp_path, None)
    assert (path / "bertology.json").is_file()
    ids = torch.randint(5, 40, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(bertology.load(path).model(ids).logits, electra.generator.eval()(ids).logits)


def test_continuing_from_an_electra_run_reads_its_generator(tmp_path):
    """model.init_from an ELECTRA run's model/: the generator starts from the one saved beside it (its own layers
    and head; the shared embeddings are the model's)."""
    from bertology.recipes.pretrain import build_model, pretrain
    from bertology.tokenization import load_tokenizer
    from bertology.training.config import PretrainConfig

    sys.path.insert(0, str(ROOT / "tests" / "training"))
    from pretrain_helpers import tiny_config

    assets = make_assets(tmp_path)
    settings = dict(model={"family": "electra"}, data={"instances": {"kind": "full-sentences"}},
                    objectives={"electra": {"generator_size": 0.5}},
                    optim={"total_steps": 2}, run={"checkpoint_every": 0, "eval_every": 0})
    pretrain(PretrainConfig.from_dict(tiny_config(assets, tmp_path / "first", **settings)))
    again = PretrainConfig.from_dict(tiny_config(assets, tmp_path / "second", **settings))
    again.model.init_from = str(tmp_path / "first" / "model")
    objectives = again.build_objectives()
    build_model(again, load_tokenizer(assets["tokenizer"]), objectives)
    saved = bertology.load(tmp_path / "first" / "generator").model.state_dict()
    ours = objectives[0].generator.state_dict()
    assert ours.keys() == saved.keys()
    for key, value in ours.items():
        assert torch.equal(value, saved[key]), key


def _numpy_sampling_keys(seed, input_ids, attention_mask, instance_ids):
    """The keys computed on the host with numpy's uint64 arithmetic (the reference for the tensor version)."""
    from bertology.data.masking import _GOLDEN, _mix64
    from bertology.objectives.electra import _SAMPLE_TAG

    ids = input_ids.numpy().astype(np.int64).view(np.uint64)
    real = attention_mask.numpy().astype(bool)
    columns = (np.arange(ids.shape[1], dtype=np.uint64) + np.uint64(1)) * _GOLDEN
    with np.errstate(over="ignore"):
        content = np.where(real, _mix64(ids + columns[None, :]), np.uint64(0)).sum(axis=1, dtype=np.uint64)
        rows = (instance_ids.numpy() if instance_ids is not None else np.arange(ids.shape[0])).astype(
            np.int64).view(np.uint64)
        base = _mix64(np.array([int(seed) % 2**64], dtype=np.uint64) ^ _SAMPLE_TAG)
        keys = _mix64(_mix64(base + (rows + np.uint64(1)) * _GOLDEN) ^ content)
    return torch.from_numpy(keys.view(np.int64).copy())


@pytest.mark.parametrize("seed", [0, 7, 2**63 + 5])
def test_keys_and_uniforms_on_tensors_equal_the_uint64_reference(seed):
    """Keys and uniforms come from tensor operations on the batch's device (no host sync); their bits are those of
    numpy's uint64 arithmetic, including wrap-around and values with the top bit set."""
    from bertology.data.masking import _keyed_uniforms
    from bertology.objectives.electra import keyed_uniforms_at

    g = torch.Generator().manual_seed(seed % 1000)
    ids = torch.randint(0, 30522, (64, 40), generator=g)
    mask = (torch.arange(40)[None, :] < torch.randint(1, 41, (64, 1), generator=g)).long()
    for instances in (None, torch.randint(0, 2**62, (64,), generator=g)):
        keys = sampling_keys(seed, ids, mask, instances)
        assert torch.equal(keys, _numpy_sampling_keys(seed, ids, mask, instances))
        assert (keys < 0).any()  # top bits set: the unsigned arithmetic is exercised
        positions = torch.stack(torch.meshgrid(torch.arange(64), torch.arange(40), indexing="ij"), -1).reshape(-1, 2)
        for stream in (0, 2):
            expected = _keyed_uniforms(keys, 40, stream)[positions[:, 0], positions[:, 1]]
            assert torch.equal(keyed_uniforms_at(keys, positions, stream), expected)
