"""Sentence(-pair) tasks: encoding, the batch source's determinism, the objectives and prediction order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertology.errors import ConfigError, DataError
from bertology.model import EncoderModel, preset
from bertology.objectives import TrainingLoss
from bertology.tasks.sequence import (
    EncodedExamples,
    SequenceClassification,
    SequenceRegression,
    classifier_head,
    predict_logits,
)
from bertology.tokenization import train_tokenizer

WORDS = "good bad fine awful great poor nice dull the a film plot actors was is very quite".split()


@pytest.fixture(scope="module")
def tokenizer():
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(WORDS, 6)) for _ in range(200)]
    return train_tokenizer(iter(lines), "wordpiece", 60, show_progress=False, min_frequency=1)


def _sentences(n: int, seed: int) -> tuple[list[str], torch.Tensor]:
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for _ in range(n):
        label = int(rng.integers(2))
        cue = rng.choice(["good", "great", "nice"] if label else ["bad", "awful", "dull"])
        words = list(rng.choice(["the", "film", "plot", "was", "very", "quite"], int(rng.integers(2, 9))))
        words.insert(int(rng.integers(len(words) + 1)), cue)
        texts.append(" ".join(words))
        labels.append(label)
    return texts, torch.tensor(labels)


def test_pairs_are_framed_and_truncated(tokenizer):
    data = EncodedExamples.from_texts(tokenizer, ["the film was good"] * 2, ["a very dull plot", "nice"],
                                      max_length=6, shuffle=False)
    batch = next(data.batches(0, 2, drop_last=False))
    assert batch.input_ids.shape[1] <= 6
    assert set(batch.token_type_ids[batch.attention_mask.bool()].tolist()) == {0, 1}
    assert (batch.input_ids[:, 0] == tokenizer.cls_id).all()


def test_training_order_is_deterministic_resumable_and_split_over_ranks(tokenizer):
    texts, labels = _sentences(103, 1)
    data = EncodedExamples.from_texts(tokenizer, texts, labels=labels, max_length=32, seed=3, bucket_window=4)
    first = list(data.batches(2, 8))
    again = list(data.batches(2, 8, start_batch=5))
    assert all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(first[5:], again))
    assert len(first) == data.num_batches(2, 8) == 103 // 8
    seen = torch.cat([b.example_ids for b in first])
    assert len(set(seen.tolist())) == len(seen)  # each example at most once an epoch
    other = torch.cat([b.example_ids for b in data.batches(3, 8)])
    assert not torch.equal(seen, other)  # another epoch, another order
    ranks = [torch.cat([b.example_ids for b in data.batches(2, 4, rank=r, world_size=2)]) for r in (0, 1)]
    assert not set(ranks[0].tolist()) & set(ranks[1].tolist())
    # Batches group similar lengths: less padding than the same examples in random order.
    padded = sum(b.input_ids.numel() for b in first)
    real = sum(int(b.attention_mask.sum()) for b in first)
    assert padded / real < 1.3


def test_classification_learns_and_predictions_come_back_in_order(tokenizer):
    torch.manual_seed(0)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=2, hidden_size=32, num_heads=2,
                    intermediate_size=64, max_position_embeddings=64)
    head = classifier_head(config, 2)
    objective = SequenceClassification(head)
    model = EncoderModel(config, objective.heads())
    model.init_weights(torch.Generator().manual_seed(0))
    texts, labels = _sentences(256, 2)
    train = EncodedExamples.from_texts(tokenizer, texts, labels=labels, max_length=32)
    loss_module = TrainingLoss(model, [objective])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for epoch in range(6):
        for batch in train.batches(epoch, 16):
            units = {k: v.float() for k, v in loss_module.units(batch).items()}
            loss, _ = loss_module(batch, units)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    dev_texts, dev_labels = _sentences(64, 3)
    dev = EncodedExamples.from_texts(tokenizer, dev_texts, max_length=32, shuffle=False)
    logits = predict_logits(model, dev, batch_size=7)
    assert logits.shape == (64, 2)
    assert (logits.argmax(1) == dev_labels.numpy()).mean() > 0.9
    # In input order: the same as one text at a time, whatever the length batching did.
    model.eval()
    for i in (0, 17, 63):
        single = EncodedExamples.from_texts(tokenizer, [dev_texts[i]], max_length=32, shuffle=False)
        np.testing.assert_allclose(predict_logits(model, single)[0], logits[i], atol=1e-5)


def test_regression_objective(tokenizer):
    config = preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=1, hidden_size=32, num_heads=2,
                    intermediate_size=64, max_position_embeddings=64)
    with pytest.raises(ConfigError, match="regression needs a head with one output"):
        SequenceRegression(classifier_head(config, 2))
    objective = SequenceRegression(classifier_head(config, 1))
    model = EncoderModel(config, objective.heads())
    model.init_weights(torch.Generator().manual_seed(0))
    data = EncodedExamples.from_texts(tokenizer, ["good film", "bad plot"], labels=torch.tensor([4.5, 0.5]),
                                      max_length=16, shuffle=False)
    batch = next(data.batches(0, 2, drop_last=False))
    loss_module = TrainingLoss(model, [objective])
    loss, stats = loss_module(batch, {"classifier": torch.tensor(2.0)})
    model.eval()
    predicted = model(batch.input_ids, batch.attention_mask, batch.token_type_ids).logits.squeeze(-1)
    expected = ((predicted - batch.labels) ** 2).mean()
    model.train()
    assert stats["classifier_units"].item() == 2 and loss.item() == pytest.approx(expected.item(), rel=0.3)
    with pytest.raises(DataError, match="no examples"):
        EncodedExamples([], [], None, 0)
