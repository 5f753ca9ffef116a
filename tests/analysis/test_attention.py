"""Attention-head statistics (Clark et al. 2019): hand-made attention for the conventions, a tiny model and
all-MiniLM-L6-v2 on UD English-EWT for the whole path."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bertology.analysis import attention
from bertology.analysis.ud import UDFormatError, UDSentence
from bertology.cli.main import main
from bertology.errors import DataError
from bertology.model import EncoderModel, Pretrained, load, preset
from bertology.tokenization import train_tokenizer

ROOT = Path(__file__).resolve().parents[2]
UD = ROOT.parent / "shared" / "data" / "ud-english-ewt"
needs_ud = pytest.mark.skipif(not UD.is_dir(), reason="UD English-EWT not in ../shared/data/ud-english-ewt")


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def sentence(words, heads, deprels) -> UDSentence:
    return UDSentence(sent_id="s", words=words, lemmas=words, upos=["X"] * len(words), heads=heads, deprels=deprels,
                      text=" ".join(words), spans=[(0, 0)] * len(words))


def test_word_level_attention_sums_over_attended_subwords_and_averages_over_attending_ones():
    # Tokens: [CLS] a b1 b2 c [SEP]; words: a (token 1), b (tokens 2-3), c (token 4). One head.
    s = sentence(["a", "b", "c"], [2, 0, 2], ["det", "root", "obj"])  # a -> b (det), c -> b (obj)
    encoding = SimpleNamespace(ids=[2, 10, 11, 12, 13, 3], word_ids=[None, 0, 1, 1, 2, None])
    p = torch.zeros(1, 1, 6, 6)
    p[0, 0, :, 0] = 1.0  # every token on [CLS] by default
    p[0, 0, 1] = torch.tensor([0.0, 0.0, 0.3, 0.3, 0.4, 0.0])  # a: token argmax c, word argmax b (0.6 > 0.4)
    p[0, 0, 4] = torch.tensor([0.0, 0.46, 0.0, 0.1, 0.0, 0.44])  # c: a gets 0.46, b 0.1 -> wrong (a)
    p[0, 0, 2] = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, 0.0])  # b1 -> b2 (next token)
    p[0, 0, 3] = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 0.0])  # b2 -> b1 (previous token)
    ids = torch.tensor([encoding.ids])
    mask = torch.ones_like(ids)
    punct = torch.zeros(20, dtype=torch.bool)
    punct[13] = True  # pretend "c" is punctuation
    totals = attention._Totals(1, ["det", "obj"])
    skipped = attention._accumulate(totals, p, ids, mask, [(s, encoding)], punct, sep_id=3, cls_id=2,
                                    relation_index={"det": 0, "obj": 1})
    numbers = attention._numbers(totals, [(0, 0)], 1, 1, {}, [(s, encoding)], [s], 0, skipped, min_relation_count=1)
    assert numbers["syntactic"]["det"]["accuracy"] == [[1.0]]
    assert numbers["syntactic"]["obj"]["accuracy"] == [[0.0]]
    assert numbers["syntactic"]["all"]["count"] == 2
    assert numbers["syntactic"]["det"]["baseline"] == {"offset": 1, "accuracy": 1.0}
    # 6 query tokens: [CLS], [SEP] and b? rows put 1.0 on one token (entropy 0); a's row: 0.3, 0.3, 0.4; c's row:
    # 0.46, 0.1, 0.44.
    entropy_a = -(2 * 0.3 * math.log(0.3) + 0.4 * math.log(0.4))
    entropy_c = -(0.46 * math.log(0.46) + 0.1 * math.log(0.1) + 0.44 * math.log(0.44))
    assert numbers["per_head"]["entropy"][0][0] == pytest.approx((entropy_a + entropy_c) / 6, abs=1e-6)
    assert numbers["per_head"]["cls"][0][0] == pytest.approx(2 / 6, abs=1e-6)  # [CLS] and [SEP] rows
    assert numbers["per_head"]["sep"][0][0] == pytest.approx(0.44 / 6, abs=1e-6)
    assert numbers["per_head"]["punct"][0][0] == pytest.approx(0.4 / 6, abs=1e-6)
    # previous: of the 5 tokens with one, only b2 (argmax b1); next: of the 5 with one, only b1.
    assert numbers["per_head"]["prev"][0][0] == pytest.approx(1 / 5)
    assert numbers["per_head"]["next"][0][0] == pytest.approx(1 / 5)
    assert numbers["mean"]["uniform_entropy"] == pytest.approx(math.log(6))


def tiny_pretrained(texts, pruned=None, positions=64) -> Pretrained:
    tokenizer = train_tokenizer(iter(texts), "wordpiece", 300, show_progress=False, min_frequency=1)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=2, hidden_size=32, num_heads=4,
                    intermediate_size=64, max_position_embeddings=positions)
    model = EncoderModel(config)
    model.init_weights(torch.Generator().manual_seed(0))
    if pruned:
        model.prune_heads(pruned)
    return Pretrained(model.eval(), tokenizer)


@needs_ud
def test_heads_stats_command_on_ud_with_a_pruned_tiny_model(tmp_path, capsys):
    from bertology.analysis.ud import read_split

    sentences = read_split(UD, "dev", 40)
    pretrained = tiny_pretrained([s.text for s in sentences], pruned={1: [0, 2]}, positions=512)
    pretrained.save(tmp_path / "model")
    code = main(["heads", "stats", "--model", str(tmp_path / "model"), "--ud", str(UD), "--out", str(tmp_path / "o"),
                 "--limit", "40", "--min-count", "20", "--quiet"])
    assert code == 0
    numbers = json.loads((tmp_path / "o" / "attention.json").read_text())
    assert numbers["sentences"] == 40 and numbers["skipped"]["sentences_longer_than_model"] == 0
    assert numbers["layers"] == 2 and numbers["heads"] == 4
    for name in attention.PER_HEAD:
        grid = numbers["per_head"][name]
        assert grid[1][0] is None and grid[1][2] is None  # pruned heads
        values = [v for row in grid for v in row if v is not None]
        assert len(values) == 6
        if name != "entropy":
            assert all(0.0 <= v <= 1.0 for v in values)
    assert max(v for row in numbers["per_head"]["entropy"] for v in row if v is not None) \
        <= numbers["mean"]["uniform_entropy"] + 1e-6  # no head is more spread than uniform on average
    arcs = Counter(r for s in sentences for r, h in zip(s.relations, s.heads) if h > 0)
    assert numbers["syntactic"]["all"]["count"] == sum(arcs.values())
    for relation, entry in numbers["syntactic"].items():
        if relation != "all":
            assert entry["count"] == arcs[relation] >= 20
            assert 0 < entry["baseline"]["accuracy"] <= 1
    for figure in ("attention-heads.png", "attention-syntactic.png"):
        assert (tmp_path / "o" / figure).read_bytes().startswith(b"\x89PNG")
    assert "syntactic heads" in capsys.readouterr().out


@needs_ud
def test_minilm_has_a_previous_token_head(minilm_path):
    """all-MiniLM-L6-v2's head 0-2 attends to the previous token (measured on UD dev: docs/analysis/attention.md)."""
    from bertology.analysis.ud import read_split

    numbers = attention.head_statistics(load(minilm_path), read_split(UD, "dev", 30), min_relation_count=30)
    assert {"layer": 0, "head": 2, "offset": -1} in [{k: h[k] for k in ("layer", "head", "offset")}
                                                    for h in numbers["positional_heads"]]
    assert numbers["syntactic"]["det"]["best_head"]["accuracy"] > numbers["syntactic"]["det"]["baseline"]["accuracy"]


def test_long_sentences_are_skipped_and_counted_and_nothing_left_is_an_error():
    short = sentence(["the", "cat"], [2, 0], ["det", "root"])
    long = sentence(["cat"] * 80, [0] + [1] * 79, ["root"] + ["dep"] * 79)
    pretrained = tiny_pretrained(["the cat sat"] * 5)
    numbers = attention.head_statistics(pretrained, [short, long], min_relation_count=1)
    assert numbers["sentences"] == 1 and numbers["skipped"]["sentences_longer_than_model"] == 1
    with pytest.raises(DataError, match="1 longer than the model's 64 positions"):
        attention.head_statistics(pretrained, [long])


def test_a_malformed_conllu_line_is_named(tmp_path):
    folder = tmp_path / "ud"
    folder.mkdir()
    (folder / "x-ud-dev.conllu").write_text("1\tThe\tthe\tDET\tDT\t_\t2\tdet\t_\t_\n2\tcat\tcat\tNOUN\n\n")
    pretrained = tiny_pretrained(["the cat"] * 5)
    with pytest.raises(UDFormatError, match=r"x-ud-dev.conllu:2: expected 10 tab-separated columns"):
        attention.analyze_heads(pretrained, folder, tmp_path / "out")
