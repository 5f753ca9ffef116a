"""End to end, the pretraining pieces learn from context: on a corpus where every token is determined by its
neighbours (cyclic runs through a small alphabet), masked-token accuracy must go far above the unigram rate.
A misaligned label, position or head would leave the model at the unigram baseline."""

from __future__ import annotations

import numpy as np
import torch

from bertology.data import InMemoryDocuments, InstanceConfig, Masker, MaskingConfig, PretrainingDataset, SpecialTokens
from bertology.model import TransformerConfig, EncoderModel
from bertology.objectives import MaskedLM, NextSentence
from bertology.objectives.compose import TrainingLoss

SPECIAL = SpecialTokens(cls_id=1, sep_id=2, pad_id=0, mask_id=3)
FIRST, ALPHABET = 5, 12  # content ids 5..16; a sentence is a cyclic run through them from a random start


def corpus(documents: int, seed: int) -> InMemoryDocuments:
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(documents):
        sentences = []
        for _ in range(4):
            start, length = rng.integers(ALPHABET), rng.integers(6, 14)
            sentences.append(FIRST + (start + np.arange(length)) % ALPHABET)
        docs.append(sentences)
    return InMemoryDocuments(docs)


def test_masked_tokens_are_predicted_from_their_context():
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=FIRST + ALPHABET, hidden_size=64, num_layers=2, num_heads=4,
                           intermediate_size=128, max_position_embeddings=64, hidden_dropout=0.0,
                           attention_dropout=0.0)
    objectives = [MaskedLM(), NextSentence()]
    model = EncoderModel(config, [h for o in objectives for h in o.heads()])
    model.init_weights(torch.Generator().manual_seed(0))
    loss_module = TrainingLoss(model, objectives)
    masker = Masker(MaskingConfig(dynamic=True), SPECIAL, config.vocab_size)
    instances = InstanceConfig(kind="nsp", max_seq_length=48, seed=1)
    train = PretrainingDataset(corpus(200, 0), SPECIAL, instances, masker)
    heldout = PretrainingDataset(corpus(20, 1), SPECIAL, instances, masker)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    step, epoch = 0, 0
    while step < 400:  # about 36 epochs of 11 batches
        for batch in train.batches(epoch, 32):
            units = {name: count.float() for name, count in loss_module.units(batch).items()}
            loss, _ = loss_module(batch, units)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
        epoch += 1
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in heldout.batches(0, 16, drop_last=False):
            logits = model(batch.input_ids, batch.attention_mask, batch.token_type_ids,
                           masked_positions=batch.masked_positions,
                           last_layer_at=batch.masked_positions).head_logits["mlm"]
            correct += int((logits.argmax(-1) == batch.mlm_labels).sum())
            total += len(batch.mlm_labels)
    # The unigram rate of this corpus is 1/12; context determines every masked token.
    assert total > 100 and correct / total > 0.8
