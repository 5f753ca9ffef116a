"""Pretraining instances on framings other than BERT's: GPT-2 (no specials at all) and XLNet (``<sep> <cls>`` last,
the cls token in segment 2), built from the same code as BERT's, with hand-made expected layouts."""

from __future__ import annotations

import torch

from bertology.data import InMemoryDocuments, InstanceConfig, Masker, MaskingConfig, PretrainingDataset, create_instances
from bertology.tokenization.framing import Framing

GPT2 = Framing(None, None, None, None, style="gpt2")
SEP, CLS, PAD, MASK = 4, 3, 5, 6
XLNET = Framing(cls_id=CLS, sep_id=SEP, pad_id=PAD, mask_id=MASK, style="xlnet")

# Two documents; word starts mark 10 and 13 as continuations.
DOCUMENTS = [[[10, 11], [12]], [[13, 14, 15]]]
STARTS = [[[True, False], [True]], [[True, False, True]]]


def rows(instances) -> list[tuple[list[int], list[int], list[bool]]]:
    return sorted((inst.input_ids.tolist(), inst.token_type_ids.tolist(), inst.word_starts.tolist())
                  for inst in instances)


def test_documents_packed_without_specials() -> None:
    config = InstanceConfig(kind="doc-sentences", max_seq_length=8, dupe_factor=1)
    instances, _ = create_instances(InMemoryDocuments(DOCUMENTS, STARTS), config, GPT2)
    assert rows(instances) == [([10, 11, 12], [0, 0, 0], [True, False, True]),
                               ([13, 14, 15], [0, 0, 0], [True, False, True])]
    # Across documents: nothing marks the boundary (the framing has no separator); the whole budget is text.
    config = InstanceConfig(kind="full-sentences", max_seq_length=6)
    instances, _ = create_instances(InMemoryDocuments(DOCUMENTS, STARTS), config, GPT2)
    assert [inst.input_ids.tolist() for inst in instances] in ([[10, 11, 12, 13, 14, 15]], [[13, 14, 15, 10, 11, 12]])
    assert not instances[0].token_type_ids.any()


def test_segment_pairs_without_specials() -> None:
    config = InstanceConfig(kind="segment-pair", max_seq_length=8, short_seq_prob=0.0)
    instances, _ = create_instances(InMemoryDocuments(DOCUMENTS, STARTS), config, GPT2)
    assert rows(instances) == [([10, 11, 12], [0, 0, 1], [True, False, True]),  # A B: B in segment 1
                               ([13, 14, 15], [0, 0, 0], [True, False, True])]  # one sentence: one segment
    # The budget is the whole sequence: 7 tokens of text truncated to 6, none left for specials.
    long = InstanceConfig(kind="segment-pair", max_seq_length=6, short_seq_prob=0.0)
    instances, stats = create_instances(InMemoryDocuments([[[20, 21, 22, 23], [24, 25, 26]]]), long, GPT2)
    assert len(instances) == 1 and len(instances[0]) == 6 and stats.truncated_tokens == 1


def test_xlnet_framing_puts_sep_and_cls_last() -> None:
    config = InstanceConfig(kind="segment-pair", max_seq_length=8, short_seq_prob=0.0)
    instances, _ = create_instances(InMemoryDocuments(DOCUMENTS, STARTS), config, XLNET)
    assert rows(instances) == [
        ([10, 11, SEP, 12, SEP, CLS], [0, 0, 0, 1, 1, 2], [True, False, False, True, False, False]),
        ([13, 14, 15, SEP, CLS], [0, 0, 0, 0, 2], [True, False, True, False, False]),
    ]
    config = InstanceConfig(kind="full-sentences", max_seq_length=9)
    instances, _ = create_instances(InMemoryDocuments(DOCUMENTS, STARTS), config, XLNET)
    assert [inst.input_ids.tolist() for inst in instances] in ([[10, 11, 12, SEP, 13, 14, 15, SEP, CLS]],
                                                              [[13, 14, 15, SEP, 10, 11, 12, SEP, CLS]])
    assert instances[0].token_type_ids.tolist() == [0] * 8 + [2]


def test_xlnet_nsp_pairs_and_masking() -> None:
    documents = [[[10 + 3 * d + s] * 2 for s in range(3)] for d in range(4)]
    config = InstanceConfig(kind="nsp", max_seq_length=12, short_seq_prob=0.0)
    instances, stats = create_instances(InMemoryDocuments(documents), config, XLNET)
    assert stats.instances == len(instances) > 0
    for inst in instances:
        ids = inst.input_ids.tolist()
        assert ids[-2:] == [SEP, CLS] and ids.count(SEP) == 2 and ids.count(CLS) == 1
        first = ids.index(SEP)
        assert inst.token_type_ids.tolist() == [0] * (first + 1) + [1] * (len(ids) - first - 2) + [2]
    masker = Masker(MaskingConfig(mlm_probability=0.5), XLNET, 30)
    data = PretrainingDataset(InMemoryDocuments(documents), XLNET, config, masker)
    batch = next(iter(data.batches(0, 2)))
    real = batch.attention_mask.bool()
    # Specials are never masked (the labels are the original ids of the masked positions), and the rows are padded
    # with the pad token.
    assert len(batch.mlm_labels) > 0
    assert not torch.isin(batch.mlm_labels, torch.tensor([SEP, CLS, PAD])).any()
    assert (batch.input_ids[~real] == PAD).all()
    assert batch.token_type_ids.max(dim=1).values.tolist() == [2, 2]
