"""The masking rate as configuration: 15 % vs 40 %, a schedule over optimizer steps (linear, cosine) that keeps
batches pure in (seed, instance, epoch, step) across epochs, duplicates, ranks and resumes, the 80/10/10 split and
the replacement distribution as settings, and bad values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bertology.data.dataset import MaskedBatches, PretrainingDataset, StepClock
from bertology.data.instances import InMemoryDocuments, InstanceConfig, SpecialTokens
from bertology.data.masking import Masker, MaskingConfig
from bertology.errors import ConfigError
from bertology.training.config import load_config

SPECIAL = SpecialTokens(cls_id=1, sep_id=2, pad_id=0, mask_id=3)
VOCAB = 200


def _documents(count: int = 40, seed: int = 0) -> InMemoryDocuments:
    rng = np.random.default_rng(seed)
    return InMemoryDocuments([[rng.integers(4, VOCAB, int(rng.integers(5, 30))).tolist()
                               for _ in range(int(rng.integers(2, 8)))] for _ in range(count)])


def _dataset(masking: MaskingConfig, clock: StepClock | None = None, dupe_factor: int = 1,
             seed: int = 0) -> PretrainingDataset:
    """Segment pairs with random target lengths (short_seq_prob 0.5), so each duplicate has its own count."""
    config = InstanceConfig(kind="segment-pair", max_seq_length=48, short_seq_prob=0.5, dupe_factor=dupe_factor,
                            seed=seed)
    return PretrainingDataset(_documents(), SPECIAL, config, Masker(masking, SPECIAL, VOCAB), clock=clock)


def _expected_counts(batch, rate: float, not_maskable: tuple[int, ...] = (0, 1, 2)) -> np.ndarray:
    """BERT's count per row; in masked ids [MASK] stands where a maskable token was, so only [CLS], [SEP] and
    padding (``not_maskable``) are left out."""
    maskable = (batch.attention_mask.bool() & ~torch.isin(batch.input_ids, torch.tensor(not_maskable))).sum(1).numpy()
    return np.maximum(1, np.round(maskable * rate)).astype(int)


def _counts(batch) -> np.ndarray:
    return np.bincount(batch.masked_positions[:, 0].numpy(), minlength=len(batch))


def test_rate_values():
    linear = MaskingConfig(schedule="linear", start_probability=0.3, mlm_probability=0.15)
    assert [linear.probability_at(t) for t in (0.0, 0.5, 1.0)] == pytest.approx([0.3, 0.225, 0.15])
    assert linear.probability_at(-1) == pytest.approx(0.3) and linear.probability_at(2) == pytest.approx(0.15)
    cosine = MaskingConfig(schedule="cosine", start_probability=0.4, mlm_probability=0.2)
    assert [cosine.probability_at(t) for t in (0.0, 0.5, 1.0)] == pytest.approx([0.4, 0.3, 0.2])
    assert cosine.probability_at(0.25) == pytest.approx(0.2 + 0.2 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert MaskingConfig(mlm_probability=0.4).probability_at(0.7) == 0.4
    assert linear.final() == MaskingConfig(mlm_probability=0.15)


def test_step_clock():
    clock = StepClock(grad_accumulation=2, total_steps=5)
    assert [clock.step(p) for p in range(10)] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert [clock.progress(p) for p in (0, 1, 2, 8, 9, 20)] == [0.0, 0.0, 0.25, 1.0, 1.0, 1.0]
    assert StepClock(1, 1).progress(0) == 0.0
    with pytest.raises(ConfigError, match="must be >= 1"):
        StepClock(0, 5)


@pytest.mark.parametrize("rate", [0.15, 0.4])
def test_fifteen_and_forty_percent(rate):
    data = _dataset(MaskingConfig(mlm_probability=rate))
    for batch in data.batches(0, 8):
        np.testing.assert_array_equal(_counts(batch), _expected_counts(batch, rate))


def test_a_scheduled_rate_follows_the_optimizer_step_across_epochs_and_duplicates():
    """Micro-batches are counted from the start of training over epochs whose duplicates have different sizes;
    each batch is masked at the rate of its optimizer step."""
    masking = MaskingConfig(schedule="linear", start_probability=0.4, mlm_probability=0.1, dynamic=True)
    clock = StepClock(grad_accumulation=3, total_steps=20)
    data = _dataset(masking, clock, dupe_factor=2)
    sizes = [data.num_batches(e, 4) for e in range(3)]
    assert sizes[0] != sizes[1]  # two duplicates, cut differently
    position = 0
    for epoch in range(3):
        for batch in data.batches(epoch, 4):
            rate = masking.probability_at(clock.progress(position))
            np.testing.assert_array_equal(_counts(batch), _expected_counts(batch, rate))
            position += 1
    assert data.position(2, 1, 4) == sizes[0] + sizes[1] + 1


def test_a_resumed_stream_repeats_the_uninterrupted_one():
    masking = MaskingConfig(schedule="cosine", start_probability=0.4, mlm_probability=0.15, dynamic=True)
    clock = StepClock(grad_accumulation=2, total_steps=12)
    whole = [b.input_ids for e in range(2) for b in _dataset(masking, clock, dupe_factor=2).batches(e, 4)]
    fresh = _dataset(masking, clock, dupe_factor=2)  # a new process: nothing cached
    start = fresh.num_batches(0, 4) - 2
    resumed = [b.input_ids for b in fresh.batches(1, 4, start_batch=3)]
    assert all(torch.equal(a, b) for a, b in zip(resumed, whole[start + 2 + 3:]))
    assert len(resumed) == len(whole) - (start + 2 + 3)


def test_ranks_count_their_own_batches():
    masking = MaskingConfig(schedule="linear", start_probability=0.4, mlm_probability=0.15)
    clock = StepClock(1, 10)
    data = _dataset(masking, clock)
    for rank in (0, 1):
        per_epoch = data.num_batches(0, 3, rank, 2)
        assert data.position(1, 2, 3, rank, 2) == per_epoch + 2
        first = next(iter(data.batches(1, 3, rank=rank, world_size=2)))
        rate = masking.probability_at(clock.progress(per_epoch))
        np.testing.assert_array_equal(_counts(first), _expected_counts(first, rate))


def test_the_split_and_the_replacement_are_configuration():
    """100 % random tokens from the unigram distribution of a two-token corpus: every selected token becomes one
    of the two, in proportion 3 : 1 (binomial bound)."""
    counts = np.zeros(VOCAB)
    counts[[10, 11]] = [3.0, 1.0]
    masking = MaskingConfig(mlm_probability=0.4, mask_token_prob=0.0, random_token_prob=1.0, replacement="unigram")
    masker = Masker(masking, SPECIAL, VOCAB, unigram_counts=counts)
    config = InstanceConfig(kind="doc-sentences", max_seq_length=48)
    data = PretrainingDataset(_documents(), SPECIAL, config, masker)
    replaced = torch.cat([b.input_ids[b.masked_positions[:, 0], b.masked_positions[:, 1]]
                          for b in data.batches(0, 8)])
    assert set(replaced.tolist()) <= {10, 11}
    share = float((replaced == 10).double().mean())
    assert abs(share - 0.75) < 4 * math.sqrt(0.75 * 0.25 / len(replaced))


def test_a_schedule_needs_a_clock():
    with pytest.raises(ConfigError, match="a masking-rate schedule needs a StepClock"):
        MaskedBatches(Masker(MaskingConfig(schedule="linear", start_probability=0.3), SPECIAL, VOCAB), 0, 1)


@pytest.mark.parametrize("settings, message", [
    (["data.masking.mlm_probability=0"], r"data.masking.mlm_probability: must be in \(0, 1\)"),
    (["data.masking.mlm_probability=1.0"], r"data.masking.mlm_probability: must be in \(0, 1\)"),
    (["data.masking.schedule=linear"], "data.masking.start_probability: schedule 'linear' needs"),
    (["data.masking.schedule=cosine", "data.masking.start_probability=1.2"],
     r"data.masking.start_probability: must be in \(0, 1\)"),
    (["data.masking.start_probability=0.3"], "data.masking.start_probability: only used with a schedule"),
    (["data.masking.schedule=step"], "data.masking.schedule: expected one of 'constant', 'linear', 'cosine'"),
    (["data.masking.mask_token_prob=0.95"], r"data.masking: mask_token_prob \+ random_token_prob must be <= 1"),
    (["data.masking.replacement=zipf"], "data.masking.replacement: expected one of 'uniform', 'unigram'"),
])
def test_bad_masking_settings_name_the_key(settings, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        load_config(None, settings)


def test_held_out_masking_uses_the_final_rate(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
    from pretrain_helpers import build, make_assets, tiny_config

    from bertology.recipes.pretrain import build_datasets
    from bertology.data.shards import TokenizedCorpus
    from bertology.tokenization import load_tokenizer

    assets = make_assets(tmp_path)
    config = build(tiny_config(assets, tmp_path / "run", data={"instances": {"kind": "doc-sentences"}, "masking": {
        "schedule": "linear", "start_probability": 0.5, "mlm_probability": 0.2}}))
    tokenizer = load_tokenizer(assets["tokenizer"])
    train, heldout = build_datasets(config, tokenizer, TokenizedCorpus(assets["shards"], tokenizer),
                                    TokenizedCorpus(assets["shards"] / "heldout", tokenizer))
    assert heldout is not None
    frame = (tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id)
    batch = next(iter(heldout.batches(0, 2, drop_last=False)))
    np.testing.assert_array_equal(_counts(batch), _expected_counts(batch, 0.2, frame))
    first = next(iter(train.batches(0, 4)))
    np.testing.assert_array_equal(_counts(first), _expected_counts(first, 0.5, frame))
