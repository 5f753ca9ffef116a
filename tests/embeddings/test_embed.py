"""Contextual embeddings against direct forwards of the encoder: layers, pooling, sentence vectors, windows."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from bertology.embeddings import (
    EmbeddingError,
    Framed,
    embed,
    max_context_window,
    parse_layers,
    plan_windows,
    select_layers,
    word_vector,
)
from bertology.errors import ConfigError, TokenizerError
from bertology.model import TransformerConfig, EncoderModel, Pretrained, load

TEXTS = [
    "The bank raised its rates.",
    "An unaffable clerk stamped the form twice, then left.",
    "Hi",
    "She sat on the river bank and watched the water rush past the old mill.",
]


@pytest.fixture(scope="module")
def minilm(minilm_path) -> Pretrained:
    return load(minilm_path)


@pytest.fixture(scope="module")
def small(minilm) -> Pretrained:
    """A randomly initialised 4-layer encoder with MiniLM's tokenizer: cheap enough for very long texts."""
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=minilm.config.vocab_size, hidden_size=32, num_layers=4, num_heads=2,
                           intermediate_size=64, max_position_embeddings=64)
    model = EncoderModel(config)
    model.init_weights(torch.Generator().manual_seed(0))
    return Pretrained(model=model.eval(), tokenizer=minilm.tokenizer)


def direct(pretrained: Pretrained, texts: list[str]):
    """Hidden states of a plain padded forward, and the batch."""
    batch = pretrained.tokenizer.encode_batch(texts)
    with torch.no_grad():
        out = pretrained.model(batch.input_ids, batch.attention_mask, batch.token_type_ids,
                               output_hidden_states=True)
    return [h.numpy() for h in out.hidden_states], batch


def test_tokens_and_sentences_equal_the_direct_forward(minilm):
    result = embed(minilm, TEXTS, normalize=False)  # MiniLM's directory normalises by default (test_sentence_config)
    hidden, batch = direct(minilm, TEXTS)
    last = hidden[-1]
    assert result.sentences.dtype == np.float32 and result.sentences.shape == (len(TEXTS), 384)
    for i, encoding in enumerate(batch.encodings):
        n = len(encoding.ids)
        rows = result.tokens.rows(i)
        np.testing.assert_allclose(result.tokens.vectors[rows], last[i, 1: n - 1], atol=1e-5)
        assert result.tokens.strings[rows] == encoding.tokens[1:-1]
        assert result.tokens.ids[rows].tolist() == encoding.ids[1:-1]
        assert list(zip(result.tokens.start[rows], result.tokens.end[rows])) == encoding.offsets[1:-1]
        np.testing.assert_allclose(result.sentences[i], last[i, :n].mean(0), atol=1e-5)
    cls = embed(minilm, TEXTS, sentence="cls", levels=("sentence",), normalize=False)
    np.testing.assert_allclose(cls.sentences, last[:, 0], atol=1e-5)
    assert cls.tokens is None and cls.words is None


def test_sentence_mean_matches_sentence_transformers_reference(minilm, reference_dir):
    import json

    texts = json.loads((reference_dir / "inputs.json").read_text(encoding="utf-8"))
    expected = np.load(reference_dir / "reference_outputs.npz")["sentence_embedding"]
    got = embed(minilm, texts, levels=("sentence",)).sentences
    got = got / np.linalg.norm(got, axis=1, keepdims=True)
    np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize(
    ("layers", "combine", "build"),
    [
        ("last", None, lambda h: h[6]),
        ("sum-last-four", None, lambda h: h[3] + h[4] + h[5] + h[6]),
        ("mean", None, lambda h: sum(h) / 7),
        ("concat", None, lambda h: np.concatenate([h[3], h[4], h[5], h[6]], -1)),
        (0, None, lambda h: h[0]),
        ([0, -1], "sum", lambda h: h[0] + h[6]),
        ([2, 5], None, lambda h: (h[2] + h[5]) / 2),
        ([5, 1], "concat", lambda h: np.concatenate([h[5], h[1]], -1)),
    ],
)
def test_layer_choices(minilm, layers, combine, build):
    texts = TEXTS[:2]
    hidden, batch = direct(minilm, texts)
    expected = build(hidden)
    result = embed(minilm, texts, layers=layers, combine=combine)
    assert result.dim == expected.shape[-1]
    for i, encoding in enumerate(batch.encodings):
        n = len(encoding.ids)
        np.testing.assert_allclose(result.tokens.vectors[result.tokens.rows(i)], expected[i, 1: n - 1], atol=1e-4)


def test_select_layers_resolution():
    assert select_layers("sum-last-four", None, 12).indices == (9, 10, 11, 12)
    assert select_layers([-1, 0], "concat", 6).indices == (6, 0)
    assert select_layers("mean", None, 2).indices == (0, 1, 2)
    assert parse_layers("-4,-3, -2") == [-4, -3, -2]
    assert parse_layers("concat") == "concat"


@pytest.mark.parametrize(
    ("layers", "combine", "message"),
    [
        ("top", None, "unknown preset 'top'"),
        ("last", "sum", "applies to an explicit list"),
        ([7], None, "index 7 is out of range"),
        ([-8], None, "index -8 is out of range"),
        ([1, -6], None, "names the same hidden state twice"),
        ([], None, "non-empty list"),
        ([1.5], None, "non-empty list of ints"),
        ([1], "max", "unknown combination 'max'"),
    ],
)
def test_bad_layer_specs(layers, combine, message):
    with pytest.raises(ConfigError, match=message):
        select_layers(layers, combine, 6)


def test_last_four_needs_four_layers():
    with pytest.raises(ConfigError, match="needs at least 4 layers; this model has 2"):
        select_layers("sum-last-four", None, 2)
    with pytest.raises(ConfigError, match="comma-separated integers"):
        parse_layers("last,2")


def test_word_pooling(minilm):
    text = "An unaffable clerk"
    result = {p: embed(minilm, [text], pooling=p) for p in ("first", "mean", "last")}
    tokens = result["mean"].tokens
    assert tokens.strings == ["an", "una", "##ffa", "##ble", "clerk"]
    assert tokens.word_index.tolist() == [0, 1, 1, 1, 2]
    words = result["mean"].words
    assert words.strings == ["An", "unaffable", "clerk"]
    assert list(zip(words.start.tolist(), words.end.tolist())) == [(0, 2), (3, 12), (13, 18)]
    piece = tokens.vectors[1:4]
    np.testing.assert_allclose(result["first"].words.vectors[1], piece[0], atol=1e-6)
    np.testing.assert_allclose(result["last"].words.vectors[1], piece[2], atol=1e-6)
    np.testing.assert_allclose(result["mean"].words.vectors[1], piece.mean(0), atol=1e-6)
    for p in ("first", "mean", "last"):  # one-token words are the token itself
        np.testing.assert_allclose(result[p].words.vectors[[0, 2]], tokens.vectors[[0, 4]], atol=1e-6)


def test_order_is_restored_after_length_sorting(minilm):
    texts = ["short", TEXTS[3], "a b", TEXTS[1], "", TEXTS[0]]
    together = embed(minilm, texts, batch_size=2)
    assert together.words.text_index.tolist() == sorted(together.words.text_index.tolist())
    for i, text in enumerate(texts):
        alone = embed(minilm, [text])
        np.testing.assert_allclose(together.sentences[i], alone.sentences[0], atol=1e-5)
        np.testing.assert_allclose(together.tokens.vectors[together.tokens.rows(i)], alone.tokens.vectors, atol=1e-5)
        assert together.words.strings[together.words.rows(i)] == alone.words.strings


def test_empty_and_whitespace_texts_have_no_words_and_a_specials_sentence_vector(minilm):
    result = embed(minilm, ["", "   \t\n ", "\u200b\u200b", "ok"], normalize=False)
    hidden, _ = direct(minilm, [""])
    specials_mean = hidden[-1][0, :2].mean(0)
    for i in range(3):
        assert result.tokens.rows(i) == slice(0, 0) and result.words.rows(i) == slice(0, 0)
        np.testing.assert_allclose(result.sentences[i], specials_mean, atol=1e-5)
    assert result.words.strings == ["ok"] and result.words.text_index.tolist() == [3]
    assert embed(minilm, []).sentences.shape == (0, 384)


def test_awkward_characters(minilm):
    long_word = "x" * 101  # past WordPiece's 100-character limit: one [UNK] spanning the whole word
    text = f"tab\there bell\x07ring zero\u200bwidth 😀 {long_word} {'y' * 100}"
    result = embed(minilm, [text])
    words = result.words
    assert "zero\u200bwidth" in words.strings and "😀" in words.strings and long_word in words.strings
    for word in words.strings:
        assert text.count(word) >= 1
    unk = words.strings.index(long_word)
    assert (words.start[unk], words.end[unk]) == (text.index(long_word), text.index(long_word) + 101)
    assert "[UNK]" in result.tokens.strings
    assert np.isfinite(result.tokens.vectors).all()
    hundred = words.strings.index("y" * 100)  # exactly 100 characters is still split into word pieces
    assert (result.tokens.word_index == hundred).sum() > 1


def test_text_that_fits_is_one_window_equal_to_direct_forward(small):
    text = " ".join(f"w{i}" for i in range(20))
    hidden, batch = direct(small, [text])
    n = len(batch.encodings[0].ids)
    assert n <= 64
    result = embed(small, [text], max_length=n)
    np.testing.assert_allclose(result.tokens.vectors, hidden[-1][0, 1: n - 1], atol=1e-5)
    np.testing.assert_allclose(result.sentences[0], hidden[-1][0, :n].mean(0), atol=1e-5)


def test_long_text_takes_each_token_from_its_max_context_window(small):
    text = " ".join(["the cat sat on a mat"] * 12)  # 72 content tokens
    max_length, stride = 20, 7
    capacity = max_length - 2
    result = embed(small, [text], max_length=max_length, stride=stride)
    encoding = small.tokenizer.encode(text)
    n = len(encoding.ids) - 2
    assert len(result.tokens) == n == 72
    # Windows built here independently: starts 0, 7, 14, ... ; the last ends at the text's end.
    starts = list(range(0, n, stride))
    starts = starts[: next(k for k, s in enumerate(starts) if s + capacity >= n) + 1]
    outputs = {}
    for s in starts:
        ids = [encoding.ids[0], *encoding.ids[1 + s: 1 + min(s + capacity, n)], encoding.ids[-1]]
        with torch.no_grad():
            out = small.model(torch.tensor([ids]), output_hidden_states=True)
        outputs[s] = out.hidden_states[-1][0].numpy()
    moved = 0
    for p in range(n):
        holders = [s for s in starts if s <= p < min(s + capacity, n)]
        score = {s: min(p - s, min(s + capacity, n) - 1 - p) + 0.01 * (min(s + capacity, n) - s) for s in holders}
        best = max(holders, key=lambda s: (score[s], -s))
        np.testing.assert_allclose(result.tokens.vectors[p], outputs[best][1 + p - best], atol=1e-5)
        others = [s for s in holders if s != best]
        if others and holders[0] != best:
            moved += 1
            assert not np.allclose(outputs[others[0]][1 + p - others[0]], outputs[best][1 + p - best], atol=1e-3)
    assert moved > 20  # many tokens are not taken from the first window that holds them
    np.testing.assert_allclose(result.sentences[0], np.concatenate(
        [outputs[0][:1], result.tokens.vectors, outputs[starts[-1]][-1:]]).mean(0), atol=1e-5)


def test_window_planning():
    assert plan_windows(0, 5, 2) == [(0, 0)]
    assert plan_windows(5, 5, 2) == [(0, 5)]
    assert plan_windows(9, 5, 2) == [(0, 5), (2, 7), (4, 9)]
    assert plan_windows(6, 5, 5) == [(0, 5), (5, 6)]
    # token 4: window 0 gives it no right context, window 1 two on each side, window 2 no left context;
    # token 3 scores min(3, 1) in window 0 and min(1, 3) in window 1: a tie, which the earlier window wins.
    assert max_context_window([(0, 5), (2, 7), (4, 9)], 9).tolist() == [0, 0, 0, 0, 1, 1, 2, 2, 2]
    with pytest.raises(ConfigError, match="stride must be between 1 and the window's 5"):
        plan_windows(9, 5, 6)


def test_ten_thousand_token_text(small):
    text = " ".join(["alpha beta gamma delta epsilon"] * 2000)
    result = embed(small, [text, "short one"], batch_size=64)
    tokens = result.tokens
    assert len(tokens.vectors[tokens.rows(0)]) == 10_000
    assert result.words.strings[:3] == ["alpha", "beta", "gamma"] and result.words.bounds[1] == 10_000
    assert np.isfinite(tokens.vectors).all() and (np.abs(tokens.vectors).sum(1) > 0).all()
    assert tokens.end[tokens.rows(0)][-1] == len(text)
    assert result.window_length == 64 and result.stride == 31


def test_word_vector_and_lookup(minilm):
    text = "I record the record."
    result = embed(minilm, [text])
    first, second = result.find(0, "record", 0), result.find(0, "record", 1)
    assert (first, second) == ((2, 8), (13, 19))
    v = word_vector(minilm, text, "record", occurrence=1)
    np.testing.assert_allclose(v, result.tokens.vectors[3], atol=1e-5)
    np.testing.assert_allclose(word_vector(minilm, text, (13, 19)), v, atol=1e-6)
    assert not np.allclose(result.vector(0, "record"), v, atol=1e-2)  # verb and noun differ
    with pytest.raises(EmbeddingError, match="occurs 2 time"):
        result.find(0, "record", 2)
    with pytest.raises(EmbeddingError, match="'rec' occurs 0 time"):
        result.find(0, "rec")
    with pytest.raises(EmbeddingError, match="no token overlaps characters 1:2"):
        result.span(0, 1, 2)
    with pytest.raises(EmbeddingError, match="span 5:99 is not a non-empty span of its 20 characters"):
        result.span(0, 5, 99)
    with pytest.raises(EmbeddingError, match="text index 3 is out of range for 1 texts"):
        result.span(3, 0, 1)
    with pytest.raises(EmbeddingError, match="token level was not computed"):
        embed(minilm, [text], levels=("word",)).span(0, 0, 1)


def test_bad_arguments(minilm, small):
    with pytest.raises(ConfigError, match="pooling: unknown 'max'"):
        embed(minilm, ["a"], pooling="max")
    with pytest.raises(ConfigError, match="sentence: unknown 'pooler'"):
        embed(minilm, ["a"], sentence="pooler")
    with pytest.raises(ConfigError, match="levels"):
        embed(minilm, ["a"], levels=("chars",))
    with pytest.raises(ConfigError, match="batch_size must be a positive integer"):
        embed(minilm, ["a"], batch_size=0)
    with pytest.raises(ConfigError, match="max_length 513 exceeds the model's 512 positions"):
        embed(minilm, ["a"], max_length=513)
    with pytest.raises(ConfigError, match="max_length must be an integer of at least 3"):
        embed(minilm, ["a"], max_length=2)
    with pytest.raises(ConfigError, match="stride must be between 1 and the window's 8"):
        embed(minilm, ["a"], max_length=10, stride=9)
    with pytest.raises(ConfigError, match="stride must be between 1"):
        embed(minilm, ["a"], stride=0)
    with pytest.raises(EmbeddingError, match=r"texts\[1\] is a int, expected a string"):
        embed(minilm, ["a", 3])
    with pytest.raises(EmbeddingError, match="needs a tokenizer"):
        embed(minilm.model, ["a"])
    with pytest.raises(EmbeddingError, match="got str"):
        embed("model", ["a"])
    tiny = EncoderModel(TransformerConfig(vocab_size=100, hidden_size=8, num_layers=1, num_heads=1, intermediate_size=8))
    with pytest.raises(TokenizerError, match="30522 tokens but the model's vocabulary only 100"):
        embed(tiny, ["a"], tokenizer=minilm.tokenizer)


def test_model_mode_is_restored_and_plain_models_work(minilm, small):
    model = small.model
    model.train()
    try:
        a = embed(model, ["same text"], tokenizer=small.tokenizer).sentences
        b = embed(model.encoder, "same text", tokenizer=small.tokenizer).sentences
        np.testing.assert_array_equal(a, b)  # no dropout while embedding
        assert model.training
    finally:
        model.eval()


def test_every_submodule_gets_its_own_mode_back(small):
    from bertology.embeddings import EncoderBackbone

    model = small.model
    wrapped = EncoderBackbone(small)
    assert not wrapped.training
    before = embed(small, ["same text"]).sentences
    embed(wrapped, ["same text"], tokenizer=small.tokenizer)
    assert not any(module.training for module in model.modules())  # the wrapper did not switch dropout on
    np.testing.assert_array_equal(embed(small, ["same text"]).sentences, before)
    model.encoder.layers[0].train()  # mixed modes come back as they were
    try:
        embed(EncoderBackbone(small), ["same text"])
        assert model.encoder.layers[0].training and not model.encoder.layers[1].training and not model.training
    finally:
        model.eval()


def test_demo_senses_separate_on_minilm(minilm):
    from bertology.demo import SENSE_EXAMPLES, sense_tables

    tables = sense_tables(minilm)
    assert [t.word for t in tables] == ["bank", "bat", "play", "record"]
    for table, (word, pairs) in zip(tables, SENSE_EXAMPLES.items()):
        assert table.cosine.shape == (len(pairs), len(pairs))
        np.testing.assert_allclose(np.diag(table.cosine), 1.0, atol=1e-5)
        assert table.same_sense_mean > table.cross_sense_mean, table.summary()
        # the vectors are those of the word occurrences, as word_vector gives them
        v = [word_vector(minilm, s, word, layers="sum-last-four") for _, s in pairs[:2]]
        expected = v[0] @ v[1] / np.linalg.norm(v[0]) / np.linalg.norm(v[1])
        assert table.cosine[0, 1] == pytest.approx(expected, abs=1e-5)


def test_sense_table_means_and_bad_examples(minilm):
    from bertology.demo import SenseTable, sense_tables

    cosine = np.array([[1.0, 0.9, 0.2], [0.9, 1.0, 0.4], [0.2, 0.4, 1.0]])
    table = SenseTable("w", ["a", "a", "b"], ["x", "y", "z"], cosine)
    assert table.same_sense_mean == pytest.approx(0.9) and table.cross_sense_mean == pytest.approx(0.3)
    assert table.labels() == ["a1", "a2", "b1"]
    # three labellings of a, a, b: the true one (gap +0.6) is the best of the three (-0.45 and -0.15), so p = 1/3
    assert table.gap() == pytest.approx(0.6) and sorted(table.null_gaps()) == pytest.approx([-0.45, -0.15, 0.6])
    assert ("w: same-sense 0.900 vs cross-sense 0.300 (+0.600; p = 0.33, smallest possible 0.33: senses separate"
            in table.format())
    with pytest.raises(EmbeddingError, match="'bank' needs two senses"):
        sense_tables(minilm, {"bank": [("river", "The bank of the river."), ("river", "A river bank.")]})
    with pytest.raises(EmbeddingError, match="'bank' occurs 0 time"):
        sense_tables(minilm, {"bank": [("a", "Banks."), ("a", "The bank."), ("b", "A bank.")]})


def test_sense_verdict_is_an_exact_permutation_test():
    from bertology.demo import SenseTable, combined_p_value, distinct_orders

    assert len(distinct_orders(["r", "r", "r", "m", "m", "m"])) == 20
    assert len(set(distinct_orders(["a", "b", "b", "c"]))) == 12
    rng = np.random.default_rng(0)
    senses = ["r"] * 3 + ["m"] * 3
    # vectors with no sense structure: a small positive gap is not called a separation
    flat = rng.normal(size=(6, 8))
    flat /= np.linalg.norm(flat, axis=1, keepdims=True)
    noise = SenseTable("w", senses, ["s"] * 6, flat @ flat.T)
    assert 0.1 <= noise.p_value() <= 1.0
    # two clean clusters: the true split is the best of the 20, p = 2/20 (it and its sense names swapped)
    centres = rng.normal(size=(2, 8)) * 3
    clustered = np.repeat(centres, 3, axis=0) + rng.normal(size=(6, 8)) * 0.1
    clustered /= np.linalg.norm(clustered, axis=1, keepdims=True)
    clean = SenseTable("w", senses, ["s"] * 6, clustered @ clustered.T)
    assert clean.p_value() == pytest.approx(0.1) and "senses separate" in clean.summary()
    assert combined_p_value([clean, clean]) == pytest.approx(0.01)
    # a shuffled labelling of the same clusters is not a separation
    shuffled = SenseTable("w", ["r", "m", "r", "m", "r", "m"], ["s"] * 6, clustered @ clustered.T)
    assert shuffled.p_value() > 0.5 and "do NOT separate beyond chance" in shuffled.summary()


def test_roberta_style_byte_level_bpe():
    from bertology.tokenization import train_tokenizer

    corpus = ["the cat sat on the mat", "the bank of the river is muddy", "she went to the bank to deposit money"]
    tokenizer = train_tokenizer(iter(corpus), "bpe", 300, min_frequency=1, show_progress=False)
    assert tokenizer.style == "roberta"
    torch.manual_seed(0)
    config = TransformerConfig(family="roberta", vocab_size=tokenizer.vocab_size, hidden_size=16, num_layers=2,
                           num_heads=2, intermediate_size=32, max_position_embeddings=22,
                           pad_token_id=tokenizer.pad_id, positions_after_padding=True, type_vocab_size=1)
    model = EncoderModel(config).eval()
    texts = ["the bank of the river, muddy mat!", "  spaced   words  ", "   "]
    result = embed(model, texts, tokenizer=tokenizer)
    assert result.window_length == 20  # 22 positions, less the padding index and the one before it
    assert result.words.strings == ["the", "bank", "of", "the", "river", ",", "muddy", "mat", "!", "spaced", "words"]
    assert result.words.text_index.tolist()[-2:] == [1, 1] and result.tokens.bounds[3] > result.tokens.bounds[2]
    batch = tokenizer.encode_batch(texts)
    with torch.no_grad():
        last = model(batch.input_ids, batch.attention_mask, output_hidden_states=True).hidden_states[-1].numpy()
    for i, encoding in enumerate(batch.encodings):
        n = len(encoding.ids)
        np.testing.assert_allclose(result.tokens.vectors[result.tokens.rows(i)], last[i, 1: n - 1], atol=1e-5)
        np.testing.assert_allclose(result.sentences[i], last[i, :n].mean(0), atol=1e-5)
    spaced = result.find(1, "spaced")
    np.testing.assert_allclose(result.vector(1, spaced), result.words.vectors[9], atol=1e-6)
    long_text = "the bank of the river " * 5
    long = embed(model, [long_text], tokenizer=tokenizer, stride=3)
    assert len(long.tokens) == len(tokenizer.encode(long_text).ids) - 2 > 18  # several windows
    assert len(long.words) == 25 and long.words.strings[:2] == ["the", "bank"]


def test_chunked_runs_keep_input_order(minilm, monkeypatch, capsys):
    module = sys.modules["bertology.embeddings.core"]

    texts = [TEXTS[3], "x", TEXTS[1], "", TEXTS[0], "two words"]
    whole = embed(minilm, texts)
    monkeypatch.setattr(module, "CHUNK_WINDOWS", 2)  # three chunks of two texts
    chunked = embed(minilm, texts, batch_size=3, show_progress=True)
    assert "6/6" in capsys.readouterr().err  # the progress bar counts finished texts
    np.testing.assert_allclose(chunked.sentences, whole.sentences, atol=1e-5)
    np.testing.assert_allclose(chunked.words.vectors, whole.words.vectors, atol=1e-5)
    assert chunked.words.strings == whole.words.strings
    assert chunked.tokens.bounds.tolist() == whole.tokens.bounds.tolist()


# ------------------------------------------------------------------ the backbone protocol
class ToyBackbone(torch.nn.Module):
    """Not a transformer: a fixed random embedding and two GRU layers, XLNet-style framing (content, then <sep>
    and <cls>, the summary token last; segment ids 0 for the text, 2 for <cls>). The GRUs read left to right, so
    right padding never changes a real position and any window can be recomputed on its own."""

    def __init__(self, tokenizer, hidden_size: int = 8, max_length: int = 12) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.word = torch.nn.Embedding(tokenizer.vocab_size, hidden_size)
        self.segment = torch.nn.Embedding(3, hidden_size)
        for table in (self.word, self.segment):
            torch.nn.init.normal_(table.weight, generator=generator)
        torch.manual_seed(0)
        self.grus = torch.nn.ModuleList(torch.nn.GRU(hidden_size, hidden_size, batch_first=True) for _ in range(2))
        self.dropout = torch.nn.Dropout(0.5)  # embed must run it in eval mode
        self.sep, self.cls = tokenizer.sep_id, tokenizer.cls_id
        self.tokenizer = tokenizer
        self.num_layers, self.hidden_size, self.max_length, self.pad_id = 2, hidden_size, max_length, tokenizer.pad_id
        self.calls = 0

    def frame(self, ids):
        return Framed([*ids, self.sep, self.cls], 0, len(ids), summary=len(ids) + 1,
                      type_ids=[0] * (len(ids) + 1) + [2])

    def hidden_states(self, input_ids, attention_mask, token_type_ids):
        self.calls += 1
        x = self.dropout(self.word(input_ids) + self.segment(token_type_ids))
        states = [x]
        for gru in self.grus:
            x = gru(x)[0]
            states.append(x)
        return tuple(states)


@pytest.fixture(scope="module")
def toy_tokenizer():
    from bertology.tokenization import train_tokenizer

    corpus = TEXTS + ["the cat sat on the mat", "a river bank is muddy", "unaffable clerks stamp forms"]
    return train_tokenizer(iter(corpus * 3), "wordpiece", 120, min_frequency=1, show_progress=False)


def toy_forward(toy: ToyBackbone, framed) -> list[np.ndarray]:
    with torch.no_grad():
        hidden = toy.hidden_states(torch.tensor([framed.ids]), torch.ones(1, len(framed.ids), dtype=torch.long),
                                   torch.tensor([framed.type_ids]))
    return [h[0].numpy() for h in hidden]


def test_toy_backbone_fits_the_protocol(toy_tokenizer, small):
    from bertology.embeddings import Backbone, EncoderBackbone, as_backbone

    toy = ToyBackbone(toy_tokenizer)
    assert isinstance(toy, Backbone) and as_backbone(toy, None) is toy
    wrapped = EncoderBackbone(small)
    assert isinstance(wrapped, Backbone) and (wrapped.num_layers, wrapped.hidden_size, wrapped.max_length) == (4, 32, 64)
    framed = wrapped.frame([7, 8])
    assert framed.ids == [101, 7, 8, 102] and (framed.start, framed.stop, framed.summary) == (1, 3, 0)
    # Wrapped or not, the BERT encoder gives the same vectors.
    direct_result, wrapped_result = embed(small, TEXTS), embed(wrapped, TEXTS, tokenizer=small.tokenizer)
    np.testing.assert_array_equal(direct_result.sentences, wrapped_result.sentences)
    np.testing.assert_array_equal(direct_result.tokens.vectors, wrapped_result.tokens.vectors)


def test_toy_backbone_short_texts_equal_its_direct_forward(toy_tokenizer):
    toy = ToyBackbone(toy_tokenizer)
    toy.train()
    texts = ["The bank raised its rates.", "Hi", "", "a river bank"]
    result = embed(toy, texts, layers="mean")  # the tokenizer comes from the backbone's attribute
    cls = embed(toy, texts, sentence="cls", layers=-1, levels=("sentence",), tokenizer=toy_tokenizer)
    assert toy.training  # the caller's mode comes back
    toy.eval()
    assert result.window_length == 12 and result.stride == 5  # capacity 12 - 2 specials, half of it
    for i, text in enumerate(texts):
        ids = toy_tokenizer.encode(text, add_special_tokens=False).ids
        hidden = toy_forward(toy, toy.frame(ids))
        mean_layers = np.mean(hidden, axis=0)
        rows = result.tokens.rows(i)
        np.testing.assert_allclose(result.tokens.vectors[rows], mean_layers[: len(ids)], atol=1e-5)
        assert result.tokens.ids[rows].tolist() == ids
        np.testing.assert_allclose(result.sentences[i], mean_layers.mean(0), atol=1e-5)  # specials included
        np.testing.assert_allclose(cls.sentences[i], hidden[-1][-1], atol=1e-5)  # <cls> is the last position
    assert result.tokens.bounds[3] == result.tokens.bounds[2]  # the empty text: no tokens, specials only
    assert result.words.strings[:4] == ["The", "bank", "raised", "its"]
    first_word = result.words.vectors[0]
    np.testing.assert_allclose(first_word, result.tokens.vectors[result.tokens.word_index == 0][:1].mean(0), atol=1e-6)
    vector = word_vector(toy, texts[3], "bank", layers="mean")
    np.testing.assert_allclose(vector, result.vector(3, "bank"), atol=1e-6)


def test_toy_backbone_windows(toy_tokenizer):
    toy = ToyBackbone(toy_tokenizer).eval()
    text = " ".join(TEXTS)
    ids = toy_tokenizer.encode(text, add_special_tokens=False).ids
    max_length, stride = 9, 3  # 7 content tokens a window
    result = embed(toy, [text, "Hi"], max_length=max_length, stride=stride, layers=-1)
    cls = embed(toy, [text], max_length=max_length, stride=stride, layers=-1, sentence="cls", levels=("sentence",))
    spans = plan_windows(len(ids), max_length - 2, stride)
    assert len(spans) > 5
    choice = max_context_window(spans, len(ids))
    outputs = [toy_forward(toy, toy.frame(ids[a:b]))[-1] for a, b in spans]
    expected = np.stack([outputs[k][t - spans[k][0]] for t, k in enumerate(choice)])
    np.testing.assert_allclose(result.tokens.vectors[result.tokens.rows(0)], expected, atol=1e-5)
    # <sep> and <cls> come after the content, so from the last window; the summary too.
    specials = outputs[-1][-2:]
    np.testing.assert_allclose(result.sentences[0], np.concatenate([expected, specials]).mean(0), atol=1e-5)
    np.testing.assert_allclose(cls.sentences[0], outputs[-1][-1], atol=1e-5)
    assert len(result.words) == len(embed(toy, [text, "Hi"], levels=("word",)).words)


def test_backbone_contract_is_checked(toy_tokenizer):
    class NoSummary(ToyBackbone):
        def frame(self, ids):
            return Framed([self.cls, *ids], 1, 1 + len(ids))

    class Growing(ToyBackbone):
        def frame(self, ids):
            before = 1 if ids else 2  # one special more for an empty text
            return Framed([self.cls] * before + list(ids), before, before + len(ids))

    class Shallow(ToyBackbone):
        def hidden_states(self, input_ids, attention_mask, token_type_ids):
            return super().hidden_states(input_ids, attention_mask, token_type_ids)[:2]

    assert embed(NoSummary(toy_tokenizer), ["a text"]).sentences.shape == (1, 8)
    with pytest.raises(ConfigError, match='NoSummary has no summary token; use sentence="mean"'):
        embed(NoSummary(toy_tokenizer), ["a text"], sentence="cls")
    with pytest.raises(EmbeddingError, match="the specials must not depend on the content"):
        embed(Growing(toy_tokenizer), ["the bank"])
    with pytest.raises(EmbeddingError, match=r"Shallow.hidden_states: expected 3 tensors of shape \[1, 4, 8\]"):
        embed(Shallow(toy_tokenizer), ["the bank"])
    with pytest.raises(ConfigError, match=r"max_length must be an integer of at least 3 \(2 specials and a token\)"):
        embed(ToyBackbone(toy_tokenizer), ["a"], max_length=2)
    with pytest.raises(ConfigError, match="max_length 13 exceeds the model's 12 positions"):
        embed(ToyBackbone(toy_tokenizer), ["a"], max_length=13)
    bare = ToyBackbone(toy_tokenizer)
    del bare.tokenizer
    with pytest.raises(EmbeddingError, match="needs a tokenizer"):
        embed(bare, ["a"])
    with pytest.raises(EmbeddingError, match=r"needs a Backbone \(num_layers, .*got object"):
        embed(object(), ["a"], tokenizer=toy_tokenizer)


def test_left_truncation_keeps_the_last_tokens_after_the_prompt(small, one_thread):
    tokenizer = small.tokenizer
    text = " ".join(TEXTS * 3)  # well over the 16-token window below
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    prompt = "query: "
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    assert tokenizer.encode(prompt + text, add_special_tokens=False).ids == prompt_ids + ids
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")

    def mean(content: list[int]) -> np.ndarray:  # the direct forward's mean over every row, in float64
        framed = torch.tensor([[cls, *content, sep]])
        with torch.no_grad():
            out = small.model(framed, torch.ones_like(framed), output_hidden_states=True)
        return out.hidden_states[-1][0].double().numpy().mean(0)

    options = dict(levels=("sentence", "token"), long_texts="truncate", max_length=16, model_settings=False)
    left = embed(small, [text], truncation_side="left", **options)
    np.testing.assert_allclose(left.sentences[0], mean(ids[-14:]), atol=1e-5, rtol=0)
    assert left.tokens.ids.tolist() == ids[-14:]
    assert [text[a:b] for a, b in zip(left.tokens.start, left.tokens.end)][-1] == text.split()[-1][-1]
    right = embed(small, [text], **options)
    np.testing.assert_allclose(right.sentences[0], mean(ids[:14]), atol=1e-5, rtol=0)
    prompted = embed(small, [text], truncation_side="left", prompt=prompt, **options)
    kept = prompt_ids + ids[-(14 - len(prompt_ids)):]
    np.testing.assert_allclose(prompted.sentences[0], mean(kept), atol=1e-5, rtol=0)
    assert prompted.tokens.ids.tolist() == ids[-(14 - len(prompt_ids)):]  # the text's tokens, not the prompt's
    short = embed(small, ["Hi"], truncation_side="left", **options).sentences[0]  # nothing to cut
    np.testing.assert_allclose(short, embed(small, ["Hi"], **options).sentences[0], atol=0, rtol=0)
    with pytest.raises(ConfigError, match="truncation_side: unknown 'middle'"):
        embed(small, [text], truncation_side="middle", **options)
