"""PretrainingDataset: collation, masking contract, exact resume, rank partition, duplicates and bucketing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertology.data import (
    InMemoryDocuments,
    InstanceConfig,
    Masker,
    MaskingConfig,
    PackedInstances,
    PretrainingBatch,
    PretrainingDataset,
    SpecialTokens,
    create_instances,
)
from bertology.errors import ConfigError

SPECIAL = SpecialTokens(cls_id=1, sep_id=2, pad_id=0, mask_id=3)
VOCAB = 500


def source(docs: int = 120, seed: int = 0) -> InMemoryDocuments:
    rng = np.random.default_rng(seed)
    ids = [[rng.integers(5, VOCAB, size=rng.integers(1, 25)) for _ in range(rng.integers(1, 10))]
           for _ in range(docs)]
    starts = [[rng.random(len(s)) < 0.7 for s in doc] for doc in ids]
    return InMemoryDocuments(ids, starts)


def dataset(kind: str = "nsp", dupe_factor: int = 2, dynamic: bool = False, whole_word: bool = True,
            docs: int = 120) -> PretrainingDataset:
    config = InstanceConfig(kind=kind, max_seq_length=48, dupe_factor=dupe_factor, seed=11)
    masker = Masker(MaskingConfig(whole_word=whole_word, dynamic=dynamic), SPECIAL, VOCAB)
    return PretrainingDataset(source(docs), SPECIAL, config, masker)


def same(a: PretrainingBatch, b: PretrainingBatch) -> bool:
    return all(
        (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
        for x, y in ((getattr(a, k), getattr(b, k)) for k in a.__dataclass_fields__)
    )


def unmasked(batch: PretrainingBatch) -> torch.Tensor:
    ids = batch.input_ids.clone()
    ids[batch.masked_positions[:, 0], batch.masked_positions[:, 1]] = batch.mlm_labels
    return ids


def test_batches_are_collated_and_masked_instances():
    ds = dataset()
    instances, _ = create_instances(ds.source, ds.config, SPECIAL, 0)
    batches = list(ds.batches(0, batch_size=16))
    assert len(batches) == ds.num_batches(0, 16) == len(instances) // 16
    for batch in batches:
        assert len(batch) == 16
        lengths = batch.attention_mask.sum(1)
        assert batch.input_ids.shape[1] == int(lengths.max()) <= 48
        assert batch.input_ids.dtype == batch.attention_mask.dtype == batch.token_type_ids.dtype == torch.long
        pad = batch.attention_mask == 0
        assert (batch.input_ids[pad] == SPECIAL.pad_id).all() and (batch.token_type_ids[pad] == 0).all()
        # Right padding: real tokens first.
        assert torch.equal(batch.attention_mask, (torch.arange(batch.input_ids.shape[1]) < lengths[:, None]).long())
        original = unmasked(batch)
        for row, index in enumerate(batch.instance_ids.tolist()):
            inst = instances[index]
            n = len(inst)
            assert torch.equal(original[row, :n], torch.from_numpy(inst.input_ids))
            assert torch.equal(batch.token_type_ids[row, :n], torch.from_numpy(inst.token_type_ids))
            assert batch.next_sentence_labels[row] == int(inst.is_random_next)
        assert batch.attention_mask[batch.masked_positions[:, 0], batch.masked_positions[:, 1]].all()
        selected = len(batch.mlm_labels)
        assert 0.1 * int(lengths.sum()) < selected < 0.2 * int(lengths.sum())


def test_every_instance_once_per_epoch_in_a_shuffled_order():
    ds = dataset()
    seen = torch.cat([b.instance_ids for b in ds.batches(0, 16, drop_last=False)])
    assert sorted(seen.tolist()) == list(range(ds.num_instances(0)))
    assert seen.tolist() != sorted(seen.tolist())
    other = torch.cat([b.instance_ids for b in ds.batches(2, 16, drop_last=False)])
    assert not torch.equal(seen, other)  # same duplicate, new order


def test_resume_from_a_batch_index_gives_the_tail_of_the_epoch():
    ds = dataset(dynamic=True)
    full = list(ds.batches(1, 8, drop_last=False))
    fresh = dataset(dynamic=True)  # a restarted process
    tail = list(fresh.batches(1, 8, start_batch=7, drop_last=False))
    assert len(tail) == len(full) - 7
    assert all(same(a, b) for a, b in zip(full[7:], tail))
    bucketed = list(ds.batches(1, 8, bucket_window=4))
    assert all(same(a, b) for a, b in zip(bucketed[5:], ds.batches(1, 8, start_batch=5, bucket_window=4)))


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_see_disjoint_parts(drop_last):
    ds = dataset()
    world, batch_size = 3, 8
    per_rank = [torch.cat([b.instance_ids for b in ds.batches(0, batch_size, rank=r, world_size=world,
                                                              drop_last=drop_last)]).tolist()
                for r in range(world)]
    everything = sum(per_rank, [])
    assert len(set(everything)) == len(everything)
    count = ds.num_instances(0)
    if drop_last:
        counts = {ds.num_batches(0, batch_size, r, world, True) for r in range(world)}
        assert len(counts) == 1 and len(everything) == count // (batch_size * world) * batch_size * world
        assert all(len(ids) % batch_size == 0 for ids in per_rank)
    else:
        assert sorted(everything) == list(range(count))
    for r in range(world):
        assert len(per_rank[r]) == len(ds.rank_indices(0, r, world, batch_size, drop_last))


def test_static_masks_repeat_per_duplicate():
    ds = dataset(dupe_factor=2)

    def by_instance(epoch: int) -> dict[int, tuple]:
        out = {}
        for batch in ds.batches(epoch, 16, drop_last=False):
            for row, index in enumerate(batch.instance_ids.tolist()):
                n = int(batch.attention_mask[row].sum())
                out[index] = tuple(batch.input_ids[row, :n].tolist())
        return out

    epoch0, epoch2 = by_instance(0), by_instance(2)
    assert epoch0 == epoch2
    epoch1 = by_instance(1)
    assert epoch1 != epoch0  # another duplicate: other instances and masks
    assert ds.stats(1).instances == len(epoch1)


def test_dynamic_masks_change_every_epoch():
    ds = dataset(dupe_factor=1, dynamic=True)

    def masks(epoch: int) -> dict[int, tuple]:
        out = {}
        for batch in ds.batches(epoch, 16, drop_last=False):
            rows = batch.masked_positions[:, 0]
            for row, index in enumerate(batch.instance_ids.tolist()):
                out[index] = tuple(batch.masked_positions[rows == row, 1].tolist())
        return out

    a, b = masks(0), masks(1)
    assert a.keys() == b.keys()
    assert sum(a[k] != b[k] for k in a) > 0.9 * len(a)
    assert masks(0) == a


def test_duplicates_are_different_instance_lists():
    ds = dataset(dupe_factor=3)
    first = [tuple(b.instance_ids.tolist()) for b in ds.batches(0, 4)]
    inst0, _ = create_instances(ds.source, ds.config, SPECIAL, 0)
    inst1, _ = create_instances(ds.source, ds.config, SPECIAL, 1)
    assert [tuple(x.input_ids) for x in inst0] != [tuple(x.input_ids) for x in inst1]
    assert ds.num_instances(1) == len(inst1) and ds.num_instances(3) == len(inst0)
    assert [tuple(b.instance_ids.tolist()) for b in ds.batches(0, 4)] == first


def test_packing_kinds_have_no_nsp_labels():
    ds = dataset(kind="full-sentences", whole_word=False)
    batch = next(iter(ds.batches(0, 8)))
    assert batch.next_sentence_labels is None
    assert (batch.token_type_ids == 0).all()


def test_bucketing_reduces_padding_and_keeps_the_epoch():
    ds = dataset(kind="nsp", docs=300)
    plain = list(ds.batches(0, 8, drop_last=False))
    bucketed = list(ds.batches(0, 8, drop_last=False, bucket_window=16))

    def padded(batches):
        return sum(b.input_ids.numel() for b in batches)

    ids = sorted(torch.cat([b.instance_ids for b in bucketed]).tolist())
    assert ids == sorted(torch.cat([b.instance_ids for b in plain]).tolist())
    assert padded(bucketed) < 0.95 * padded(plain)


def test_batch_to_device():
    batch = next(iter(dataset().batches(0, 4)))
    moved = batch.to("meta")
    assert moved.input_ids.device.type == "meta" and moved.next_sentence_labels.device.type == "meta"
    assert same(batch.to("cpu"), batch)
    full = next(iter(dataset(kind="doc-sentences").batches(0, 4)))
    assert full.to("meta").next_sentence_labels is None


def test_packed_instances_collate():
    instances, _ = create_instances(source(20), InstanceConfig(kind="doc-sentences", max_seq_length=32), SPECIAL)
    packed = PackedInstances(instances)
    indices = np.array([3, 0, 5])
    ids, attention, types, starts = packed.collate(indices, pad_id=SPECIAL.pad_id)
    width = max(len(instances[i]) for i in indices)
    assert ids.shape == attention.shape == types.shape == starts.shape == (3, width)
    for row, i in enumerate(indices):
        n = len(instances[i])
        assert (ids[row, :n] == instances[i].input_ids).all() and (ids[row, n:] == SPECIAL.pad_id).all()
        assert (starts[row, :n] == instances[i].word_starts).all() and not starts[row, n:].any()
        assert attention[row].sum() == n


def test_dataset_errors():
    ds = dataset()
    with pytest.raises(ConfigError, match="need 0 <= rank < world_size, got rank 2, world_size 2"):
        ds.batches(0, 4, rank=2, world_size=2)
    with pytest.raises(ConfigError, match="batch_size must be >= 1"):
        ds.batches(0, 0)
    with pytest.raises(ConfigError, match="start_batch must be >= 0"):
        ds.batches(0, 4, start_batch=-1)
    with pytest.raises(ConfigError, match="epoch must be >= 0"):
        ds.batches(-1, 4)
    with pytest.raises(ConfigError, match="bucket_window must be >= 0"):
        ds.batches(0, 4, bucket_window=-2)
    roberta = SpecialTokens(cls_id=1, sep_id=2, pad_id=0, mask_id=3, style="roberta")
    with pytest.raises(ConfigError, match="masker's special tokens"):
        PretrainingDataset(source(), roberta, InstanceConfig(), Masker(MaskingConfig(), SPECIAL, VOCAB))


def test_end_to_end_on_tokenized_shards(tmp_path, data_dir, minilm_path):
    """Real text: Brown files tokenised into shards by the corpus pipeline, read through the DocumentSource API."""
    from bertology.data import TokenizedCorpus, prepare_corpus
    from bertology.tokenization import load_tokenizer

    files = sorted((data_dir / "brown-nltk").glob("ca0*"))
    if not files:
        pytest.skip(f"no Brown files under {data_dir / 'brown-nltk'}")
    tokenizer = load_tokenizer(minilm_path)
    corpus = prepare_corpus(files, tokenizer, tmp_path / "shards", format="brown", show_progress=False)
    assert isinstance(corpus, TokenizedCorpus)
    special = SpecialTokens.from_tokenizer(tokenizer)
    assert special == SpecialTokens(101, 102, 0, 103, "bert")
    masker = Masker(MaskingConfig(whole_word=True, replacement="unigram"), special, corpus.vocab_size,
                    tokenizer.special_ids, corpus.unigram_counts)
    ds = PretrainingDataset(corpus, special, InstanceConfig(kind="nsp", max_seq_length=128), masker)
    stats = ds.stats(0)
    assert stats.documents == len(corpus) == len(files) and stats.instances > 100
    text = np.concatenate([np.concatenate(corpus.document(i)) for i in range(len(corpus))])
    batches = list(ds.batches(0, 16))
    for batch in batches:
        original = unmasked(batch)
        for row in range(len(batch)):
            ids = original[row, : int(batch.attention_mask[row].sum())].numpy()
            seps = np.flatnonzero(ids == special.sep_id)
            assert ids[0] == special.cls_id and len(seps) == 2 and seps[1] == len(ids) - 1
            segment = ids[1 : seps[0]]
            # Segment A is a contiguous run of the corpus text.
            starts = np.flatnonzero(text[: len(text) - len(segment) + 1] == segment[0])
            assert any(np.array_equal(text[s : s + len(segment)], segment) for s in starts)
    positions = torch.cat([b.masked_positions for b in batches])
    tokens = sum(int(b.attention_mask.sum()) - 3 * len(b) for b in batches)
    assert abs(len(positions) / tokens - 0.15) < 0.01
    replaced = torch.cat([b.input_ids[b.masked_positions[:, 0], b.masked_positions[:, 1]] for b in batches])
    replaced = replaced[replaced != special.mask_id].numpy()
    assert len(replaced) > 0.15 * len(positions) and (corpus.unigram_counts[replaced] > 0).all()
