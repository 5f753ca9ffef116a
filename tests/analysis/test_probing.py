"""Probing: control-task labels, selectivity, the probe on separable data, and the command end to end on a tiny
random model and a hand-made treebank."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from bertology.analysis.probing import (ProbeOptions, control_labels, selectivity, task_examples, train_probe)
from bertology.analysis.ud import read_conllu
from finetune_helpers import save_tiny_model


@pytest.fixture(autouse=True)
def one_thread():
    """Small tensors: torch's thread pool only adds synchronisation (10x slower on a loaded machine)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_control_labels_follow_the_label_distribution_and_are_fixed_per_type():
    train = ["NOUN"] * 600 + ["VERB"] * 300 + ["DET"] * 100
    types = [f"w{i}" for i in range(20000)]
    control = control_labels(train, types + types[:50], seed=0)
    assert len(control) == 20000
    shares = Counter(control.values())
    # 20,000 independent draws: within 1.5 points of 60/30/10 (over 5 standard deviations)
    assert abs(shares["NOUN"] / 20000 - 0.6) < 0.015
    assert abs(shares["VERB"] / 20000 - 0.3) < 0.015
    assert abs(shares["DET"] / 20000 - 0.1) < 0.015
    assert control == control_labels(train, list(reversed(types)), seed=0)  # order does not matter
    assert control != control_labels(train, types, seed=1)


def test_selectivity():
    assert selectivity(0.97, 0.71) == pytest.approx(0.26)


def test_probe_learns_separable_labels_and_not_noise():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1200, 8, generator=g)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    noise = torch.randint(0, 4, (1200,), generator=g)
    options = ProbeOptions(epochs=15, learning_rate=0.05, l2=(0.0,))
    result = train_probe(x[:800], y[:800], x[800:1000], y[800:1000], x[1000:], y[1000:], 4, options)
    assert result.test_accuracy > 0.9
    chance = train_probe(x[:800], noise[:800], x[800:1000], noise[800:1000], x[1000:], noise[1000:], 4, options)
    assert chance.test_accuracy < 0.4


TREEBANK = """# sent_id = {n}a
1\tthe\tthe\tDET\tDT\t_\t2\tdet\t_\t_
2\tcat\tcat\tNOUN\tNN\t_\t3\tnsubj\t_\t_
3\tsat\tsit\tVERB\tVBD\t_\t0\troot\t_\t_

# sent_id = {n}b
1-2\tdogs'\t_\t_\t_\t_\t_\t_\t_\t_
1\tdogs\tdog\tNOUN\tNNS\t_\t3\tnmod:poss\t_\t_
2\t'\t'\tPART\tPOS\t_\t1\tcase\t_\t_
3\tball\tball\tNOUN\tNN\t_\t4\tnsubj\t_\t_
4\tran\trun\tVERB\tVBD\t_\t0\troot\t_\t_
4.1\tran\trun\tVERB\tVBD\t_\t_\t_\t4:conj\t_

"""


def test_task_examples(tmp_path):
    path = tmp_path / "t.conllu"
    path.write_text(TREEBANK.format(n=0), encoding="utf-8")
    sentences = read_conllu(path)
    examples, labels, types = task_examples(sentences, "upos")
    assert labels == ["DET", "NOUN", "VERB", "NOUN", "PART", "NOUN", "VERB"] and types[3] == "dogs"
    examples, labels, types = task_examples(sentences, "relation")
    # roots left out, subtypes stripped, (sentence, dependent, head) 0-based
    assert labels == ["det", "nsubj", "nmod", "case", "nsubj"]
    assert examples[2] == (1, 0, 2) and examples[3] == (1, 1, 0)


def test_probe_command_end_to_end(tmp_path):
    from bertology.cli.main import main

    model = save_tiny_model(tmp_path / "model", "the cat sat dogs ' ball ran".split())
    ud = tmp_path / "ud"
    ud.mkdir()
    for split, count in (("train", 30), ("dev", 5), ("test", 5)):
        (ud / f"x-ud-{split}.conllu").write_text("".join(TREEBANK.format(n=f"{split}{i}") for i in range(count)),
                                                 encoding="utf-8")
    out = tmp_path / "out"
    assert main(["probe", "--model", str(model), "--ud", str(ud), "--out", str(out), "--epochs", "20",
                 "--learning-rate", "0.05", "--l2", "0", "--quiet"]) == 0
    numbers = json.loads((out / "probing.json").read_text())
    upos = numbers["tasks"]["upos"]
    assert [r["layer"] for r in upos["layers"]] == [0, 1, 2]
    assert upos["examples"] == {"train": 210, "dev": 35, "test": 35}
    assert numbers["data"]["train"]["multiword_tokens"] == 30 and numbers["data"]["train"]["empty_nodes_skipped"] == 30
    for row in upos["layers"] + numbers["tasks"]["relation"]["layers"]:
        assert row["selectivity"] == pytest.approx(row["test_accuracy"] - row["control_test_accuracy"])
        assert 0 <= row["test_accuracy"] <= 1
    # each word type has one POS here, so the embedding layer's word identity gives it away
    assert upos["layers"][0]["test_accuracy"] == 1.0
    assert (out / "probing.png").stat().st_size > 1000
    limited = tmp_path / "limited"
    assert main(["probe", "--model", str(model), "--ud", str(ud), "--out", str(limited), "--limit", "2",
                 "--layers", "1", "--tasks", "upos", "--epochs", "1", "--l2", "0", "--quiet"]) == 0
    numbers = json.loads((limited / "probing.json").read_text())
    assert list(numbers["tasks"]) == ["upos"] and numbers["tasks"]["upos"]["examples"]["train"] == 7
