"""`bertology embed`, `info` and `demo` end to end on temporary files, and every bad input."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from bertology.cli.main import main
from bertology.embeddings import embed, load_vectors
from bertology.info import describe
from bertology.model import TransformerConfig, EncoderModel, Pretrained, load

TEXTS = ["The bank raised its rates.", "", "An unaffable clerk stamped the form."]


@pytest.fixture(scope="module")
def minilm(minilm_path) -> Pretrained:
    return load(minilm_path)


def run(*argv: str) -> int:
    return main([str(a) for a in argv])


def test_lines_to_npy_sentence_vectors(minilm_path, minilm, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "out" / "vectors.npy"
    assert run("embed", "--model", minilm_path, "--input", source, "--output", out, "--quiet") == 0
    vectors = np.load(out)
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, embed(minilm, TEXTS).sentences, atol=1e-5)
    assert "wrote 3 sentence vectors (384 dimensions) for 3 texts" in capsys.readouterr().err
    assert [p.name for p in out.parent.iterdir()] == ["vectors.npy"]  # no temporary file left behind


def test_jsonl_to_npz_word_vectors(minilm_path, minilm, tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": i, "body": t}) + "\n" for i, t in enumerate(TEXTS)) + "\n",
                      encoding="utf-8")
    out = tmp_path / "words.npz"
    assert run("embed", "--model", minilm_path, "--input", source, "--format", "jsonl", "--text-field", "body",
               "--output", out, "--level", "word", "--pooling", "first", "--layers", "sum-last-four") == 0
    saved = load_vectors(out)
    expected = embed(minilm, TEXTS, layers="sum-last-four", pooling="first").words
    np.testing.assert_allclose(saved["vectors"], expected.vectors, atol=1e-4)
    assert saved["strings"][:4] == ["The", "bank", "raised", "its"] and saved["texts"] == TEXTS
    assert saved["text_index"].tolist() == expected.text_index.tolist()
    assert 1 not in saved["text_index"]  # the empty text has no words
    for row in range(len(saved["vectors"])):
        text = saved["texts"][saved["text_index"][row]]
        assert text[saved["start"][row]: saved["end"][row]] == saved["strings"][row]
    meta = saved["meta"]
    assert meta["format"] == 2 and meta["level"] == "word" and meta["layers"] == [3, 4, 5, 6] and meta["pooling"] == "first"


def test_token_level_with_explicit_layers(minilm_path, minilm, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("unaffable\r\nbank\r\n", encoding="utf-8")  # CRLF line ends are not part of the texts
    out = tmp_path / "tokens.npz"
    assert run("embed", "--model", minilm_path, "--input", source, "--output", out, "--level", "token",
               "--layers=-2,-1", "--combine", "concat", "--batch-size", "1", "--max-length", "3",
               "--stride", "1") == 0
    saved = load_vectors(out)
    assert saved["strings"] == ["una", "##ffa", "##ble", "bank"]
    assert saved["word_index"].tolist() == [0, 0, 0, 0] and saved["index"].tolist() == [0, 1, 2, 0]
    assert saved["vectors"].shape == (4, 768) and saved["ids"].tolist()[3] == minilm.tokenizer.token_to_id("bank")
    # one token per window: each token's vector is the forward of [CLS] token [SEP] alone
    with torch.no_grad():
        h = minilm.model(torch.tensor([[101, saved["ids"][1], 102]]), output_hidden_states=True).hidden_states
    np.testing.assert_allclose(saved["vectors"][1], torch.cat([h[5][0, 1], h[6][0, 1]]).numpy(), atol=1e-5)


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        (b"good line\n\xff\xfe bad\n", [], r"in\.txt: line 2: cannot decode as utf-8 at byte offset 10 \(byte 0xff\)"),
        (b"", [], r"in\.txt: no texts"),
        (b'{"text": "a"}\n{"text": \n', ["--format", "jsonl"], r"in\.txt: line 2: invalid JSON: .* \(column 10\)"),
        (b'{"text": "a"}\n["a"]\n', ["--format", "jsonl"], r"in\.txt: line 2: expected a JSON object, got a list"),
        (b'{"body": "a"}\n', ["--format", "jsonl"], r"in\.txt: line 1: missing field 'text' \(fields: 'body'\)"),
        (b'{"text": 3}\n', ["--format", "jsonl"], r"in\.txt: line 1: field 'text' is int, not a string"),
        (b"\n \n", ["--format", "jsonl"], r"in\.txt: no texts"),
    ],
)
def test_bad_input_files(minilm_path, tmp_path, capsys, content, extra, message):
    source = tmp_path / "in.txt"
    source.write_bytes(content)
    out = tmp_path / "out.npy"
    assert run("embed", "--model", minilm_path, "--input", source, "--output", out, *extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertology embed: error: ")
    assert re.search(message, err), err
    assert not out.exists()


@pytest.mark.parametrize(
    ("output", "extra", "message"),
    [
        ("out.npy", ["--level", "word"], "a .npy file holds a single array, which fits sentence vectors only"),
        ("out.csv", [], "output must end in .npy (sentence vectors) or .npz, not '.csv'"),
        ("out.npy", ["--max-length", "600"], "max_length 600 exceeds the model's 512 positions"),
        ("out.npy", ["--stride", "511"], "stride must be between 1 and the window's 510 content tokens"),
        ("out.npy", ["--batch-size", "0"], "batch_size must be a positive integer"),
        ("out.npy", ["--layers", "9"], "index 9 is out of range for a model with 6 layers"),
        ("out.npy", ["--layers", "last", "--combine", "sum"], "applies to an explicit list of layers"),
    ],
)
def test_bad_options(minilm_path, tmp_path, capsys, output, extra, message):
    source = tmp_path / "in.txt"
    source.write_text("a text\n", encoding="utf-8")
    assert run("embed", "--model", minilm_path, "--input", source, "--output", tmp_path / output, *extra) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / output).exists()


def test_missing_files_and_unparsable_layers(minilm_path, tmp_path, capsys):
    assert run("embed", "--model", minilm_path, "--input", tmp_path / "nope.txt", "--output", tmp_path / "o.npy") == 2
    assert "nope.txt: no such file" in capsys.readouterr().err
    source = tmp_path / "in.txt"
    source.write_text("a\n", encoding="utf-8")
    assert run("embed", "--model", tmp_path / "no-model", "--input", source, "--output", tmp_path / "o.npy") == 2
    assert "no-model: no such model directory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        run("embed", "--model", minilm_path, "--input", source, "--output", tmp_path / "o.npy", "--layers", "top,1")
    assert exit_info.value.code == 2
    assert "neither a preset" in capsys.readouterr().err


def test_info(minilm_path, capsys):
    assert run("info", minilm_path) == 0
    out = capsys.readouterr().out
    for expected in ("family          bert (BertModel)", "attention heads 12 (head size 32)", "22,713,216",
                     "11,918,592", "10,646,784", "lowercases    yes", "cls='[CLS]' (101)", "max length    512",
                     "512 (512 usable per sequence)"):
        assert expected in out, expected


def test_info_counts_shared_albert_layers_once():
    config = TransformerConfig(family="albert", vocab_size=50, hidden_size=16, num_layers=6, num_heads=2,
                           intermediate_size=32, embedding_size=8, num_layer_groups=1, type_vocab_size=2)
    info = describe(Pretrained(model=EncoderModel(config), tokenizer=None))
    one_layer = sum(p.numel() for p in EncoderModel(config).encoder.layers[0].parameters())
    assert info.parameters.layers == one_layer and info.parameters.layers_as_run == 6 * one_layer
    assert info.parameters.total == sum(p.numel() for p in EncoderModel(config).parameters())
    text = info.format()
    assert "6 layer calls over 1 unique layer(s)" in text and "layers as run" in text
    assert "embedding size  8 (projected to the hidden size)" in text and "none (no tokenizer files" in text


def test_info_on_a_missing_directory(tmp_path, capsys):
    assert run("info", tmp_path / "missing") == 2
    assert "missing: no such model directory" in capsys.readouterr().err


def test_demo(minilm_path, capsys):
    assert run("demo", "--model", minilm_path) == 0
    out = capsys.readouterr().out
    assert "layers: sum-last-four, subword pooling: mean" in out
    assert "[bank]" in out and "cricket [bat], made" in out
    summary = out.split("summary")[-1]
    for word in ("bank", "bat", "play", "record"):
        assert f"  {word}: same-sense " in summary and f"{word}" in summary
    assert summary.count("senses separate") == 4
