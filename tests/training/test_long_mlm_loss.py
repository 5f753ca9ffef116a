"""Held-out MLM loss on long documents (bertology.recipes.long_mlm): documents masked once by their keys; a short
model's windows score each mask once, in its best window; a Longformer made from it reads each document in one
forward and, where its window covers the whole document, gives the short model's loss; `bertology longformer
mlm-loss` prints both."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/finetune_helpers.py

from finetune_helpers import save_tiny_model  # noqa: E402

from bertology.cli.main import main  # noqa: E402
from bertology.errors import ConfigError  # noqa: E402
from bertology.model import EncoderModel, HeadSpec, Pretrained, load  # noqa: E402
from bertology.recipes.long_mlm import document_ids, long_document_mlm_loss, mask_documents  # noqa: E402

WORDS = "the cat sat on the mat and a dog ran in the park while old men walked by a green river".split()


def _text(rng, words):
    return " ".join(rng.choice(WORDS, words))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("long-mlm")
    base = load(save_tiny_model(root / "base", WORDS, vocab_size=60))  # 64 positions
    model = EncoderModel(base.model.config, [HeadSpec("mlm", "masked_lm")])
    model.init_weights(torch.Generator().manual_seed(1))
    Pretrained(model, base.tokenizer).save(root / "short")
    for name, window in (("wide", 128), ("long", 8)):
        assert main(["longformer", "convert", "--model", str(root / "short"), "--max-length", "256", "--window",
                     str(window), "--out", str(root / name)]) == 0
    return root


def test_documents_are_cut_and_masked_by_their_keys(models):
    tokenizer = load(models / "short").tokenizer
    rng = np.random.default_rng(0)
    texts = [_text(rng, 130), _text(rng, 20)]
    counts = [len(tokenizer.encode(t, add_special_tokens=False).ids) for t in texts]
    cut = document_ids(tokenizer, texts, 50)
    assert [len(d) for d in cut] == [50] * (counts[0] // 50) + [counts[1]]  # a shorter text whole, a tail dropped
    a = mask_documents(tokenizer, texts, 50, seed=3)
    b = mask_documents(tokenizer, texts, 50, seed=3, max_documents=2)
    c = mask_documents(tokenizer, texts, 50, seed=4)
    assert len(b) == 2 and all(np.array_equal(x, y) for x, y in zip(a.ids, b.ids))
    assert any(not np.array_equal(x, y) for x, y in zip(a.positions, c.positions))
    for ids, positions, labels, original in zip(a.ids, a.positions, a.labels, cut):
        assert len(positions) == round(0.15 * len(original)) and np.array_equal(labels, original[positions])
        unmasked = np.setdiff1d(np.arange(len(original)), positions)
        assert np.array_equal(ids[unmasked], original[unmasked])
    with pytest.raises(ConfigError, match="--length"):
        document_ids(tokenizer, texts, 0)


def test_windows_score_each_mask_once_and_one_forward_agrees_where_the_window_covers_all(models):
    torch.manual_seed(0)
    short, wide, long = (load(models / name) for name in ("short", "wide", "long"))
    rng = np.random.default_rng(1)
    texts = [_text(rng, 150) for _ in range(3)]
    # Documents that fit the short model: one window each, computed by hand; the Longformer whose window spans
    # them computes the same.
    fitting = mask_documents(short.tokenizer, texts, 60, seed=0)
    expected = []
    for ids, positions, labels in zip(fitting.ids, fitting.positions, fitting.labels):
        framed = torch.tensor([[short.tokenizer.cls_id, *ids.tolist(), short.tokenizer.sep_id]])
        logits = short.model(framed).head_logits["mlm"][0, 1 + torch.from_numpy(positions)]
        expected.append(F.cross_entropy(logits, torch.from_numpy(labels), reduction="sum").item())
    one = long_document_mlm_loss(short, fitting, batch_size=2)
    assert one.forwards == len(fitting) and one.masked == fitting.masked
    assert one.loss == pytest.approx(sum(expected) / fitting.masked, abs=1e-5)
    assert long_document_mlm_loss(wide, fitting).loss == pytest.approx(one.loss, abs=1e-5)
    # Long documents: the short model reads windows, the Longformer one forward per document; every mask once.
    documents = mask_documents(short.tokenizer, texts, 180, seed=0)
    windows = long_document_mlm_loss(short, documents, batch_size=3)
    whole = long_document_mlm_loss(long, documents)
    assert windows.window == 64 and whole.window == 256
    assert windows.masked == whole.masked == documents.masked
    assert whole.forwards == len(documents) < windows.forwards
    assert np.isfinite(windows.loss) and np.isfinite(whole.loss)
    # A window of the whole 64 positions with a step of one token scores the same masks, in different windows.
    assert long_document_mlm_loss(short, documents, stride=1).masked == documents.masked


def test_the_command_prints_each_models_loss(models, tmp_path, capsys):
    rng = np.random.default_rng(2)
    (tmp_path / "book.txt").write_text(_text(rng, 400), encoding="utf-8")
    capsys.readouterr()
    assert main(["longformer", "mlm-loss", "--model", str(models / "short"), "--model", str(models / "long"),
                 "--text", str(tmp_path / "book.txt"), "--max-documents", "1"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["model"] for line in lines] == [str(models / "short"), str(models / "long")]
    assert [line["document_tokens"] for line in lines] == [254, 254] and lines[1]["forwards"] == 1
    assert lines[0]["masked"] == lines[1]["masked"] == round(0.15 * 254) and lines[0]["forwards"] > 1
    direct = long_document_mlm_loss(load(models / "long"), mask_documents(
        load(models / "long").tokenizer, [(tmp_path / "book.txt").read_text()], 254, max_documents=1))
    assert lines[1]["loss"] == pytest.approx(direct.loss, abs=1e-6)
    assert main(["longformer", "mlm-loss", "--model", str(models / "short"), "--text",
                 str(tmp_path / "missing.txt")]) == 2
    assert "--text" in capsys.readouterr().err


def test_bad_input_names_the_option(models, tmp_path, capsys):
    from bertology.data.masking import MaskingConfig

    short = load(models / "short")
    texts = ["the cat sat on the mat"]
    with pytest.raises(ConfigError, match="masking: .*whole_word"):
        mask_documents(short.tokenizer, texts, 4, masking=MaskingConfig(whole_word=True))
    documents = mask_documents(short.tokenizer, texts, 4)
    bare = load(models / "base")  # no masked-LM head
    with pytest.raises(ConfigError, match="no masked-LM head"):
        long_document_mlm_loss(bare, documents)
    # another tokenizer splits the text otherwise: not the same masked tokens
    other = load(save_tiny_model(tmp_path / "other-base", ["th", "e", "cat", "s", "at"], vocab_size=30))
    model = EncoderModel(other.model.config, [HeadSpec("mlm", "masked_lm")])
    model.init_weights(torch.Generator().manual_seed(0))
    Pretrained(model, other.tokenizer).save(tmp_path / "other")
    (tmp_path / "book.txt").write_text("the cat sat on the mat and the dog ran", encoding="utf-8")
    (tmp_path / "latin.txt").write_bytes("the café".encode("latin-1"))
    capsys.readouterr()
    assert main(["longformer", "mlm-loss", "--model", str(models / "short"), "--model", str(tmp_path / "other"),
                 "--text", str(tmp_path / "book.txt")]) == 2
    assert f"--model {tmp_path / 'other'}: its tokenizer splits the texts otherwise" in capsys.readouterr().err
    assert main(["longformer", "mlm-loss", "--model", str(models / "short"), "--text",
                 str(tmp_path / "latin.txt")]) == 2
    assert "--encoding" in capsys.readouterr().err
