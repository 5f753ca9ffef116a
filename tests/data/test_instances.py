"""Instance creation: BERT NSP / segment pairs (create_pretraining_data logic) and RoBERTa packing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bertology.data import InMemoryDocuments, InstanceConfig, SpecialTokens, create_instances
from bertology.data.instances import truncation_amounts
from bertology.errors import ConfigError, DataError

BERT = SpecialTokens(cls_id=1, sep_id=2, pad_id=0, mask_id=3, style="bert")
ROBERTA = SpecialTokens(cls_id=1, sep_id=2, pad_id=0, mask_id=3, style="roberta")


def token(doc: int, sent: int, pos: int) -> int:
    """Token ids that say where they come from (ids < 10 are left to the specials)."""
    return 10 + doc * 1_000_000 + sent * 1_000 + pos


def where(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rest = ids - 10
    return rest // 1_000_000, rest // 1_000 % 1_000, rest % 1_000


def corpus(lengths: list[list[int]]) -> InMemoryDocuments:
    return InMemoryDocuments([[[token(d, s, p) for p in range(n)] for s, n in enumerate(doc)]
                              for d, doc in enumerate(lengths)])


def random_lengths(rng: np.random.Generator, docs: int, max_sentences: int, max_length: int) -> list[list[int]]:
    return [list(rng.integers(1, max_length + 1, size=rng.integers(1, max_sentences + 1))) for _ in range(docs)]


def binomial_bounds(n: int, p: float, sigmas: float = 5.0) -> tuple[float, float]:
    half = sigmas * math.sqrt(n * p * (1 - p))
    return n * p - half, n * p + half


def split_pair(inst, special: SpecialTokens) -> tuple[np.ndarray, np.ndarray | None]:
    ids = inst.input_ids
    seps = np.flatnonzero(ids == special.sep_id)
    if len(seps) == 1:
        return ids[1:-1], None
    a_end = seps[0]
    b_start = a_end + (1 if special.style == "bert" else 2)
    return ids[1:a_end], ids[b_start:-1]


def test_nsp_layout_lengths_and_segment_ids():
    lengths = random_lengths(np.random.default_rng(0), 150, 12, 30)
    instances, stats = create_instances(corpus(lengths), InstanceConfig(kind="nsp", max_seq_length=48), BERT)
    assert stats.instances == len(instances) > 300
    for inst in instances:
        ids, types, starts = inst.input_ids, inst.token_type_ids, inst.word_starts
        assert len(ids) <= 48 and len(types) == len(ids) == len(starts)
        assert ids[0] == BERT.cls_id and ids[-1] == BERT.sep_id
        seps = np.flatnonzero(ids == BERT.sep_id)
        assert len(seps) == 2 and (ids == BERT.cls_id).sum() == 1
        assert seps[0] >= 2 and seps[1] - seps[0] >= 2  # both segments non-empty
        assert (types[: seps[0] + 1] == 0).all() and (types[seps[0] + 1:] == 1).all()
        special = (ids == BERT.cls_id) | (ids == BERT.sep_id)
        assert not starts[special].any() and starts[~special].all()
        assert isinstance(inst.is_random_next, bool)


def test_nsp_segments_come_from_the_right_documents():
    lengths = random_lengths(np.random.default_rng(1), 120, 10, 20)
    instances, _ = create_instances(corpus(lengths), InstanceConfig(kind="nsp", max_seq_length=40), BERT)
    randoms = 0
    for inst in instances:
        a, b = split_pair(inst, BERT)
        doc_a, _, _ = where(a)
        doc_b, _, _ = where(b)
        assert (doc_a == doc_a[0]).all() and (doc_b == doc_b[0]).all()
        # Tokens of each segment are contiguous text of their document.
        flat_a = np.concatenate([[0], np.cumsum(lengths[doc_a[0]])])
        flat_b = np.concatenate([[0], np.cumsum(lengths[doc_b[0]])])
        pos_a = flat_a[where(a)[1]] + where(a)[2]
        pos_b = flat_b[where(b)[1]] + where(b)[2]
        assert (np.diff(pos_a) == 1).all() and (np.diff(pos_b) == 1).all()
        if inst.is_random_next:
            randoms += 1
            assert doc_b[0] != doc_a[0]
        else:
            assert doc_b[0] == doc_a[0] and pos_b[0] > pos_a[-1]
    assert 0 < randoms < len(instances)


def test_nsp_random_next_rate_is_one_half():
    lengths = random_lengths(np.random.default_rng(2), 2400, 14, 10)
    instances, stats = create_instances(corpus(lengths), InstanceConfig(kind="nsp", max_seq_length=24), BERT)
    # Chunks of one sentence always take a random B (as in BERT); the others toss a fair coin.
    forced = stats.single_sentence_chunks
    tossed = len(instances) - forced
    assert tossed > 5000
    low, high = binomial_bounds(tossed, 0.5)
    assert low <= stats.random_next - forced <= high
    assert stats.random_next == sum(inst.is_random_next for inst in instances)


def test_short_target_rate():
    # Documents of exactly max_num_tokens one-token sentences: a full target gives one instance of full length,
    # a short target t (uniform in [2, max]) gives instances of t tokens.
    max_seq_length, docs = 16, 4000
    max_num_tokens = max_seq_length - 3
    source = corpus([[1] * max_num_tokens for _ in range(docs)])
    config = InstanceConfig(kind="segment-pair", max_seq_length=max_seq_length, short_seq_prob=0.1)
    instances, stats = create_instances(source, config, BERT)
    low, high = binomial_bounds(docs, 0.1)
    assert low <= stats.short_targets <= high
    full = sum(len(inst) == max_seq_length for inst in instances)
    low, high = binomial_bounds(docs, 0.9 + 0.1 / (max_num_tokens - 1))
    assert low <= full <= high
    assert full >= docs - stats.short_targets
    assert all(inst.is_random_next is None for inst in instances)


def test_no_short_targets_when_disabled():
    source = corpus([[1] * 20 for _ in range(50)])
    config = InstanceConfig(kind="segment-pair", max_seq_length=16, short_seq_prob=0.0)
    instances, stats = create_instances(source, config, BERT)
    assert stats.short_targets == 0
    # Every chunk but a document's last reaches the full target.
    assert sum(len(inst) == 16 for inst in instances) == 50


def test_pair_truncation_cuts_the_longer_side_from_both_ends():
    # Sentences of 5 and 40 tokens: A is the first (5), B the second (40) cut down to 29 - 5 = 24 tokens.
    source = corpus([[5, 40] for _ in range(400)])
    instances, stats = create_instances(source, InstanceConfig(kind="segment-pair", max_seq_length=32,
                                                               short_seq_prob=0.0), BERT)
    assert len(instances) == 400 and stats.truncated_tokens == 400 * 16
    fronts = []
    for inst in instances:
        a, b = split_pair(inst, BERT)
        assert len(a) == 5 and (where(a)[2] == np.arange(5)).all()
        assert len(b) == 24 and (np.diff(where(b)[2]) == 1).all()
        fronts.append(where(b)[2][0])
    # Each of the 16 cuts is at the front with probability 1/2.
    mean = float(np.mean(fronts))
    assert abs(mean - 8.0) < 5 * math.sqrt(16 * 0.25 / 400)
    assert min(fronts) < 8 < max(fronts)


def test_truncation_amounts_match_berts_one_token_loop():
    for len_a in range(0, 25):
        for len_b in range(0, 25):
            for max_tokens in (2, 5, 13, 30):
                a, b = len_a, len_b
                while a + b > max_tokens:
                    if a > b:
                        a -= 1
                    else:
                        b -= 1
                assert truncation_amounts(len_a, len_b, max_tokens) == (len_a - a, len_b - b)


def test_single_segments_without_nsp_are_truncated_at_random_ends():
    source = corpus([[100] for _ in range(300)])
    instances, stats = create_instances(source, InstanceConfig(kind="segment-pair", max_seq_length=32,
                                                               short_seq_prob=0.0), BERT)
    assert len(instances) == 300 and stats.single_sentence_chunks == 300
    fronts = []
    for inst in instances:
        assert len(inst) == 32 and (inst.input_ids == BERT.sep_id).sum() == 1
        pos = where(inst.input_ids[1:-1])[2]
        assert (np.diff(pos) == 1).all()
        fronts.append(pos[0])
    assert abs(np.mean(fronts) - 35.0) < 5 * math.sqrt(70 * 0.25 / 300)


def test_roberta_pair_layout():
    lengths = random_lengths(np.random.default_rng(3), 60, 8, 15)
    instances, _ = create_instances(corpus(lengths), InstanceConfig(kind="nsp", max_seq_length=40), ROBERTA)
    for inst in instances:
        ids = inst.input_ids
        assert len(ids) <= 40 and ids[0] == ROBERTA.cls_id and ids[-1] == ROBERTA.sep_id
        seps = np.flatnonzero(ids == ROBERTA.sep_id)
        assert len(seps) == 3 and seps[1] == seps[0] + 1
        assert (inst.token_type_ids == 0).all()


def test_determinism_by_seed_and_duplicate():
    source = corpus(random_lengths(np.random.default_rng(4), 80, 10, 20))

    def run(seed: int, duplicate: int) -> list[tuple]:
        config = InstanceConfig(kind="nsp", max_seq_length=32, seed=seed)
        instances, _ = create_instances(source, config, BERT, duplicate)
        return [(tuple(x.input_ids), tuple(x.token_type_ids), x.is_random_next) for x in instances]

    assert run(7, 0) == run(7, 0)
    assert run(7, 0) != run(7, 1)
    assert run(7, 0) != run(8, 0)


def test_document_order_is_shuffled():
    source = corpus([[3, 3] for _ in range(50)])
    instances, _ = create_instances(source, InstanceConfig(kind="doc-sentences", max_seq_length=16), BERT)
    docs = [int(where(x.input_ids[1:2])[0][0]) for x in instances]
    assert sorted(docs) == list(range(50)) and docs != list(range(50))


def packed_contents(instances, special: SpecialTokens) -> list[np.ndarray]:
    for inst in instances:
        assert inst.input_ids[0] == special.cls_id and inst.input_ids[-1] == special.sep_id
        assert (inst.token_type_ids == 0).all() and not inst.word_starts[[0, -1]].any()
    return [inst.input_ids[1:-1] for inst in instances]


def test_full_sentences_packing():
    lengths = random_lengths(np.random.default_rng(5), 100, 8, 25)
    max_seq_length = 64
    budget = max_seq_length - 2
    instances, stats = create_instances(corpus(lengths), InstanceConfig(kind="full-sentences",
                                                                        max_seq_length=max_seq_length), ROBERTA)
    contents = packed_contents(instances, ROBERTA)
    assert all(len(c) <= budget for c in contents)
    crossing = 0
    for content in contents:
        text = content != ROBERTA.sep_id
        assert text[0] and text[-1]  # a separator never opens or closes a sequence
        seps = np.flatnonzero(~text)
        docs = where(content[text])[0]
        # A separator sits exactly where the document changes.
        assert len(seps) == (np.diff(docs) != 0).sum()
        assert (np.diff(np.flatnonzero(~text)) > 1).all()
        crossing += len(seps)
    assert crossing > 10
    # Concatenated in order, the sequences are the whole corpus, each document's sentences in order, once.
    stream = np.concatenate(contents)
    stream = stream[stream != ROBERTA.sep_id]
    doc, sent, pos = where(stream)
    assert len(stream) == sum(map(sum, lengths)) and len(np.unique(stream)) == len(stream)
    key = sent * 1000 + pos
    for d in range(100):
        assert (np.diff(key[doc == d]) > 0).all()
    # Sequences hold whole sentences, and greedily: the next sentence (plus a separator) would not have fit.
    for content, nxt in zip(contents, contents[1:]):
        text = content[content != ROBERTA.sep_id]
        assert where(text[:1])[2][0] == 0
        d_last, s_last, p_last = (v[0] for v in where(text[-1:]))
        assert p_last == lengths[d_last][s_last] - 1
        d_next, s_next, _ = (v[0] for v in where(nxt[:1]))
        extra = 1 if d_next != d_last else 0
        assert len(content) + extra + lengths[d_next][s_next] > budget
    assert stats.split_sentences == 0


def test_doc_sentences_never_cross_documents():
    lengths = random_lengths(np.random.default_rng(6), 100, 8, 25)
    instances, _ = create_instances(corpus(lengths), InstanceConfig(kind="doc-sentences", max_seq_length=64), BERT)
    contents = packed_contents(instances, BERT)
    seen = []
    for content, nxt in zip(contents, contents[1:] + [None]):
        assert (content != BERT.sep_id).all() and len(content) <= 62
        docs = where(content)[0]
        assert (docs == docs[0]).all()
        if nxt is not None and where(nxt[:1])[0][0] == docs[0]:
            s_next = where(nxt[:1])[1][0]
            assert len(content) + lengths[docs[0]][s_next] > 62
        seen.append(content)
    assert len(np.concatenate(seen)) == sum(map(sum, lengths))


def test_long_sentences_are_split():
    source = corpus([[3, 150, 4], [200]])
    instances, stats = create_instances(source, InstanceConfig(kind="doc-sentences", max_seq_length=66), BERT)
    assert stats.split_sentences == 2
    lengths = sorted(len(x) - 2 for x in instances)
    # 150 -> 64 + 64 + 22, 200 -> 64 + 64 + 64 + 8; the 3- and 4-token sentences pack with the pieces.
    assert max(lengths) == 64 and sum(lengths) == 357
    assert all(len(x) <= 66 for x in instances)


def test_word_starts_follow_the_source():
    rng = np.random.default_rng(8)
    lengths = random_lengths(rng, 40, 6, 20)
    ids = [[[token(d, s, p) for p in range(n)] for s, n in enumerate(doc)] for d, doc in enumerate(lengths)]
    starts = [[(rng.random(n) < 0.6).tolist() for n in doc] for doc in lengths]
    lookup = {t: w for d in range(40) for s in range(len(ids[d])) for t, w in zip(ids[d][s], starts[d][s])}
    for kind in ("nsp", "full-sentences"):
        instances, _ = create_instances(InMemoryDocuments(ids, starts), InstanceConfig(kind=kind, max_seq_length=32),
                                        BERT)
        for inst in instances:
            for t, w in zip(inst.input_ids, inst.word_starts):
                assert w == (lookup[t] if t >= 10 else False)


def test_one_sentence_documents_are_counted_and_get_a_random_next():
    lengths = [[5]] * 30 + [[5, 6, 7]] * 30
    instances, stats = create_instances(corpus(lengths), InstanceConfig(kind="nsp", max_seq_length=64), BERT)
    assert stats.single_sentence_documents == 30
    assert stats.single_sentence_chunks >= 30
    for inst in instances:
        a, _ = split_pair(inst, BERT)
        if where(a[:1])[0][0] < 30:
            assert inst.is_random_next


def test_every_document_with_one_sentence_is_an_error_for_nsp():
    source = corpus([[5]] * 20)
    with pytest.raises(DataError, match="every document has one sentence; NSP needs two"):
        create_instances(source, InstanceConfig(kind="nsp"), BERT)
    # Without NSP they are plain single segments.
    instances, stats = create_instances(source, InstanceConfig(kind="segment-pair"), BERT)
    assert len(instances) == 20 and stats.single_sentence_chunks == 20


def test_nsp_needs_two_documents():
    with pytest.raises(DataError, match="at least two non-empty documents"):
        create_instances(corpus([[5, 6, 7]]), InstanceConfig(kind="nsp"), BERT)


def test_empty_corpus_errors_and_empty_parts_are_counted():
    with pytest.raises(DataError, match="no tokens: 0 document"):
        create_instances(InMemoryDocuments([]), InstanceConfig(kind="full-sentences"), BERT)
    with pytest.raises(DataError, match="no tokens: 2 document.*2 empty, 1 empty sentence"):
        create_instances(InMemoryDocuments([[], [[]]]), InstanceConfig(kind="doc-sentences"), BERT)
    source = InMemoryDocuments([[[11, 12], [], [13]], [], [[14, 15, 16]]])
    instances, stats = create_instances(source, InstanceConfig(kind="doc-sentences", max_seq_length=16), BERT)
    assert stats.empty_sentences == 1 and stats.empty_documents == 1 and stats.documents == 3
    assert sorted(tuple(x.input_ids[1:-1]) for x in instances) == [(11, 12, 13), (14, 15, 16)]


def test_random_next_never_comes_from_the_same_document_with_two_documents():
    # With two documents BERT's 10 retries all fail with probability 2**-10; the fallback must still differ.
    source = corpus([[4] * 30, [4] * 30])
    for seed in range(40):
        instances, _ = create_instances(source, InstanceConfig(kind="nsp", max_seq_length=16, seed=seed), BERT)
        for inst in instances:
            a, b = split_pair(inst, BERT)
            assert (where(b)[0][0] != where(a)[0][0]) == inst.is_random_next


class BadSource:
    def __init__(self, ids, starts, path=None):
        self.ids, self.starts, self.path = ids, starts, path

    def __len__(self):
        return len(self.ids)

    def document(self, i):
        return self.ids[i]

    def word_starts(self, i):
        return self.starts[i]


@pytest.mark.parametrize(
    "ids, starts, message",
    [
        ([[np.array([11, 12])], [np.array([13, 14, 15])]], [[np.ones(2, bool)], [np.ones(2, bool)]],
         r"corpus\.shard: document 1 sentence 0: 3 token ids but 2 word starts"),
        ([[np.array([11, 12]), np.array([13])]], [[np.ones(2, bool)]],
         r"corpus\.shard: document 0: 2 sentences but 1 word-start arrays"),
        ([[np.array([1.5, 2.0])]], [[np.ones(2, bool)]], r"document 0 sentence 0: token ids must be a 1-D integer"),
        ([[np.array([11, -4])]], [[np.ones(2, bool)]], r"document 0 sentence 0: negative token id -4"),
    ],
)
def test_bad_sources_name_the_document_and_sentence(ids, starts, message):
    with pytest.raises(DataError, match=message):
        create_instances(BadSource(ids, starts, "corpus.shard"), InstanceConfig(kind="doc-sentences"), BERT)


def test_in_memory_documents_checks_word_start_count():
    with pytest.raises(DataError, match="word_starts: 1 documents for 2"):
        InMemoryDocuments([[[11]], [[12]]], [[[True]]])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"kind": "mlm"}, "InstanceConfig.kind"),
        ({"kind": "full-sentences", "nsp": True}, "InstanceConfig.nsp: next-sentence prediction needs segment pairs"),
        ({"kind": "nsp", "nsp": False}, "kind 'nsp' needs nsp=True"),
        ({"max_seq_length": 5}, "max_seq_length: must be >= 6"),
        ({"max_seq_length": 12.0}, "max_seq_length: expected int"),
        ({"short_seq_prob": 1.5}, "short_seq_prob: must be in"),
        ({"dupe_factor": 0}, "dupe_factor: must be >= 1"),
        ({"seed": -1}, r"seed: must be in \[0, 2\*\*63\)"),
        ({"short_seq_prob": float("nan")}, "short_seq_prob: must be a finite number"),
        ({"kind": "pairs"}, "InstanceConfig.kind: expected one of 'nsp', 'segment-pair'"),
        ({"dupe_factor": True}, "dupe_factor: expected int, got bool"),
        ({"nsp": "yes"}, "nsp: expected bool"),
    ],
)
def test_instance_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        InstanceConfig(**kwargs)


def test_instance_config_from_dict():
    config = InstanceConfig.from_dict({"kind": "segment-pair", "max_seq_length": 64})
    assert config.max_seq_length == 64 and config.nsp is False and config.seed == 0
    assert InstanceConfig.from_dict({"kind": "nsp"}).nsp is True
    with pytest.raises(ConfigError, match="instances.max_len: unknown key"):
        InstanceConfig.from_dict({"max_len": 64})
    # nsp follows kind and the seed is the run's: neither is a key of a config file.
    with pytest.raises(ConfigError, match="instances.nsp: not set in a config file; it follows kind"):
        InstanceConfig.from_dict({"kind": "segment-pair", "nsp": True})
    with pytest.raises(ConfigError, match="instances.seed: not set in a config file; the seed is run.seed"):
        InstanceConfig.from_dict({"seed": 3})


def test_instance_config_python_construction_sets_derived_fields():
    config = InstanceConfig(kind="segment-pair", nsp=True, seed=7)
    assert config.nsp is True and config.seed == 7


def test_special_tokens_errors():
    with pytest.raises(ConfigError, match="SpecialTokens.style"):
        SpecialTokens(1, 2, 0, 3, style="xlnet")
    with pytest.raises(ConfigError, match="SpecialTokens.mask_id: must be >= 0"):
        SpecialTokens(1, 2, 0, -3)
    with pytest.raises(ConfigError, match="the tokenizer has no mask_id, style"):
        SpecialTokens.from_tokenizer(type("T", (), {"cls_id": 1, "sep_id": 2, "pad_id": 0})())
    assert BERT.ids == {0, 1, 2, 3} and BERT.pair_overhead == 3 and ROBERTA.pair_overhead == 4
