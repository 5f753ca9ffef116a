"""Distillation: the student keeps layers 0, 2, 4 of its teacher, the three loss terms against a hand computation,
the teacher frozen and outside the optimizer and the checkpoint, a teacher with another vocabulary refused, and a
run of configs/distil-tiny.yaml."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bertology.data.dataset import PretrainingBatch
from bertology.errors import ConfigError, TokenizerError
from bertology.model import TransformerConfig, EncoderModel
from bertology.model.checkpoint import Pretrained
from bertology.model.encoder import HeadSpec
from bertology.objectives import Distillation, TrainingLoss, build_objectives
from bertology.objectives.distill import init_student, soft_cross_entropy_kl, student_layers
from bertology.tokenization import load_tokenizer
from bertology.training.config import load_config

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "training"))
from pretrain_helpers import make_assets  # noqa: E402


def _teacher(layers: int = 5, vocab: int = 40) -> EncoderModel:
    config = TransformerConfig(vocab_size=vocab, hidden_size=32, num_layers=layers, num_heads=2, intermediate_size=64,
                           max_position_embeddings=32, hidden_dropout=0.0, attention_dropout=0.0)
    teacher = EncoderModel(config, (HeadSpec("mlm", "masked_lm"),))
    teacher.init_weights(torch.Generator().manual_seed(3))
    return teacher.eval()


def _batch() -> PretrainingBatch:
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1] * 9, [1] * 6 + [0] * 3])
    ids = torch.randint(5, 40, (2, 9), generator=g) * mask
    positions = torch.tensor([[0, 2], [0, 5], [1, 1], [1, 4]])
    labels = ids[positions[:, 0], positions[:, 1]].clone()
    ids[positions[:, 0], positions[:, 1]] = 4
    return PretrainingBatch(ids, mask, torch.zeros_like(ids), positions, labels)


def test_the_student_copies_every_other_layer():
    assert student_layers(6) == [0, 2, 4] and student_layers(5) == [0, 2, 4] and student_layers(1) == [0]
    teacher = _teacher(5)
    student = init_student(teacher, (HeadSpec("mlm", "masked_lm"),), torch.Generator().manual_seed(0))
    assert student.config.num_layers == 3 and student.config.hidden_size == 32
    for mine, theirs in enumerate([0, 2, 4]):
        for (name, a), (_, b) in zip(student.encoder.layers[mine].state_dict().items(),
                                     teacher.encoder.layers[theirs].state_dict().items()):
            assert torch.equal(a, b), (mine, name)
    assert not torch.equal(student.encoder.layers[1].query.weight, teacher.encoder.layers[1].query.weight)
    for part in ("embeddings", "pooler"):
        for a, b in zip(getattr(student.encoder, part).state_dict().values(),
                        getattr(teacher.encoder, part).state_dict().values()):
            assert torch.equal(a, b)
    for a, b in zip(student.heads["mlm"].state_dict().values(), teacher.heads["mlm"].state_dict().values()):
        assert torch.equal(a, b)
    # Copies, not shared tensors: training the student leaves the teacher as it was.
    assert student.encoder.layers[0].query.weight.data_ptr() != teacher.encoder.layers[0].query.weight.data_ptr()


def test_loss_terms_match_a_hand_computation():
    teacher = _teacher(4)
    objective = Distillation(temperature=2.0, alpha_ce=5.0, alpha_mlm=2.0, alpha_cos=1.0, activation="gelu")
    objective.use_teacher(teacher)
    student = objective.initial_model(objective.heads(), torch.Generator().manual_seed(0))
    with torch.no_grad():  # a student that differs from its teacher in every term
        for p in student.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    loss_module = TrainingLoss(student, [objective])
    assert [t.name for t in loss_module.objectives] == ["distill_ce", "mlm", "distill_cos"]
    batch = _batch()
    units = {k: v.float() for k, v in loss_module.units(batch).items()}
    assert units == {"distill_ce": 4.0, "mlm": 4.0, "distill_cos": 15.0}
    loss, stats = loss_module(batch, units)

    s_out = student(batch.input_ids, batch.attention_mask, masked_positions=batch.masked_positions)
    with torch.no_grad():
        t_out = teacher(batch.input_ids, batch.attention_mask, masked_positions=batch.masked_positions)
    zs, zt, T = s_out.head_logits["mlm"], t_out.head_logits["mlm"], 2.0
    kl = sum((F.softmax(zt[i] / T, -1) * (F.log_softmax(zt[i] / T, -1) - F.log_softmax(zs[i] / T, -1))).sum()
             for i in range(4)) / 4 * T * T
    mlm = F.cross_entropy(zs, batch.mlm_labels)
    real = batch.attention_mask.bool()
    cos = F.cosine_embedding_loss(s_out.last_hidden_state[real], t_out.last_hidden_state[real],
                                  torch.ones(int(real.sum())))
    torch.testing.assert_close(loss, 5.0 * kl + 2.0 * mlm + 1.0 * cos, rtol=1e-5, atol=1e-6)
    summary = loss_module.summarize({k: float(v) for k, v in stats.items()})
    kl, mlm, cos = kl.detach(), mlm.detach(), cos.detach()
    assert summary["distill_ce_loss"] == pytest.approx(float(kl), rel=1e-5)
    assert summary["distill_cos_loss"] == pytest.approx(float(cos), rel=1e-4)
    assert summary["mlm_loss"] == pytest.approx(float(mlm), rel=1e-5)
    # KL of a distribution with itself is 0; T^2 scales the soft loss.
    assert soft_cross_entropy_kl(zt, zt, 3.0).abs() < 1e-5
    one = soft_cross_entropy_kl(zs[:1], zt[:1], 1.0)
    torch.testing.assert_close(one, F.kl_div(F.log_softmax(zs[:1], -1), F.softmax(zt[:1], -1), reduction="sum"))


def test_the_teacher_gets_no_gradient_and_is_not_trained_or_saved(tmp_path):
    teacher = _teacher(4)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    objective = Distillation(activation="gelu")
    objective.use_teacher(teacher)
    student = objective.initial_model(objective.heads())
    loss_module = TrainingLoss(student, [objective])
    loss_module.train()
    batch = _batch()
    loss, _ = loss_module(batch, {k: v.float() for k, v in loss_module.units(batch).items()})
    loss.backward()
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    assert not teacher.training  # the trainer's train() does not reach it
    teacher_ids = {id(p) for p in teacher.parameters()}
    assert not teacher_ids & {id(p) for p in loss_module.parameters()}
    assert not any(k.startswith("objective_modules") for k in loss_module.state_dict())
    torch.optim.AdamW(loss_module.parameters(), lr=0.1).step()
    assert all(torch.equal(v, before[k]) for k, v in teacher.state_dict().items())
    Pretrained(student, None).save(tmp_path / "student")
    saved = json.loads((tmp_path / "student" / "config.json").read_text())
    assert saved["num_hidden_layers"] == 2 and saved["architectures"] == ["BertForMaskedLM"]


def test_bad_options_and_a_missing_teacher():
    with pytest.raises(ConfigError, match=r"objectives\.distill\.temperature"):
        build_objectives({"distill": {"temperature": 0}})
    with pytest.raises(ConfigError, match=r"objectives\.distill\.alpha_cos"):
        build_objectives({"distill": {"alpha_cos": -1}})
    with pytest.raises(ConfigError, match=r"objectives\.distill\.teacher: not set"):
        Distillation().load_teacher()


def _save_teacher(directory: Path, tokenizer_dir: Path, layers: int = 4) -> Path:
    tokenizer = load_tokenizer(tokenizer_dir)
    config = TransformerConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_layers=layers, num_heads=2,
                           intermediate_size=64, max_position_embeddings=64, pad_token_id=tokenizer.pad_id)
    teacher = EncoderModel(config, (HeadSpec("mlm", "masked_lm"),))
    teacher.init_weights(torch.Generator().manual_seed(5))
    Pretrained(teacher, tokenizer).save(directory)
    return directory


def _distil_config(assets, teacher: Path, out: Path, tokenizer: Path):
    return load_config(ROOT / "configs/distil-tiny.yaml", [
        f"objectives.distill.teacher={teacher}", f"tokenizer.path={tokenizer}", f"data.shards={assets['shards']}",
        "data.corpus=[]", "data.instances.max_seq_length=48", "optim.batch_size=4", "optim.total_steps=3",
        f"run.output_dir={out}", "run.eval_every=0", "run.eval_batches=2", "run.checkpoint_every=2",
        "run.log_every=1", "run.progress=false", "speed.threads=1", "speed.prefetch=0"])


def test_a_teacher_with_another_vocabulary_is_refused(tmp_path):
    from bertology.recipes.pretrain import build_model
    from bertology.tokenization import train_tokenizer

    assets = make_assets(tmp_path)
    teacher = _save_teacher(tmp_path / "teacher", assets["tokenizer"])
    other = train_tokenizer([str(assets["corpus"])], "wordpiece", 90, show_progress=False, min_frequency=1)
    other.save(tmp_path / "other")
    config = _distil_config(assets, teacher, tmp_path / "run", tmp_path / "other")
    with pytest.raises(TokenizerError, match=r"objectives\.distill\.teacher: the teacher .* vocabulary of 120 "
                                             r"tokens, the student's tokenizer 90"):
        build_model(config, load_tokenizer(tmp_path / "other"), config.build_objectives())


def test_distil_tiny_config_runs_end_to_end(tmp_path):
    from bertology.recipes.pretrain import pretrain
    import bertology

    assets = make_assets(tmp_path)
    teacher = _save_teacher(tmp_path / "teacher", assets["tokenizer"])
    result = pretrain(_distil_config(assets, teacher, tmp_path / "run", teacher))
    assert result.steps == 3
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {"distill_ce_loss", "mlm_loss", "distill_cos_loss", "distill_agreement"} <= set(rows[-1])
    student = bertology.load(tmp_path / "run" / "model").model
    assert student.config.num_layers == 2 and "mlm" in student.heads
    # The checkpoint holds the student and no teacher weights.
    checkpoint = sorted((tmp_path / "run" / "checkpoints").iterdir())[-1]
    from safetensors.torch import load_file

    assert not [k for k in load_file(checkpoint / "trainer_state.safetensors") if "teacher" in k]


def test_a_teacher_tokenizer_with_the_same_size_but_other_tokens_is_refused(tmp_path):
    from bertology.recipes.pretrain import build_model

    assets = make_assets(tmp_path)
    teacher = _save_teacher(tmp_path / "teacher", assets["tokenizer"])
    definition = json.loads((teacher / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = definition["model"]["vocab"]
    first, second = [token for token in vocab if not token.startswith("[")][:2]
    vocab[first], vocab[second] = vocab[second], vocab[first]  # same size, two tokens trade ids
    (teacher / "tokenizer.json").write_text(json.dumps(definition), encoding="utf-8")
    (teacher / "vocab.txt").unlink(missing_ok=True)
    config = _distil_config(assets, teacher, tmp_path / "run", assets["tokenizer"])
    with pytest.raises(TokenizerError, match=r"objectives\.distill\.teacher: the tokenizer in .*teacher has another "
                                             r"vocabulary than the run's"):
        build_model(config, load_tokenizer(assets["tokenizer"]), config.build_objectives())
