"""`bertology generate` on small models saved natively with small tokenizers: one line per text, equal to
bertology.generate's tokens; bad options and inputs are one-line errors (exit 2)."""

from __future__ import annotations

import re

import pytest
import torch
from framing_helpers import tokenizer
from transformer_helpers import tiny_config

from bertology import generate
from bertology.cli.main import main
from bertology.model import HeadSpec, Pretrained
from bertology.model.transformer import DecoderModel, Seq2SeqModel

TEXTS = ["the cat sat on the", "a dog ran in the park with"]


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    tok = tokenizer("gpt2")
    eos = tok.token_to_id("<|endoftext|>")
    model = DecoderModel(tiny_config(vocab_size=tok.vocab_size, max_position_embeddings=64, eos_token_id=eos,
                                     pad_token_id=eos, initializer_range=0.3), [HeadSpec("lm", "tied_lm")])
    model.init_weights(torch.Generator().manual_seed(0))
    directory = tmp_path_factory.mktemp("gpt2") / "model"
    Pretrained(model.eval(), tok).save(directory)
    return directory, model, tok


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    tok = tokenizer("t5")
    model = Seq2SeqModel(tiny_config(vocab_size=tok.vocab_size, positions="relative", norm="rmsnorm", bias=False,
                                     pad_token_id=tok.pad_id, eos_token_id=tok.token_to_id("</s>"),
                                     decoder_start_token_id=tok.pad_id, initializer_range=0.3),
                         [HeadSpec("lm", "tied_lm")])
    model.init_weights(torch.Generator().manual_seed(1))
    directory = tmp_path_factory.mktemp("t5") / "model"
    Pretrained(model.eval(), tok).save(directory)
    return directory, model, tok


def run(capsys, *argv):
    code = main(["generate", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def expected_texts(model, tok, decoder, **options):
    """What the command should print, from the Python API: left-padded prompts for a decoder."""
    prompts = [tok.encode(text).ids for text in TEXTS]
    width, pad = max(map(len, prompts)), model.config.pad_token_id
    if decoder:
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    else:
        ids = torch.tensor([p + [pad] * (width - len(p)) for p in prompts])
        mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in prompts])
    sequences = generate(model, input_ids=ids, attention_mask=mask, **options)
    texts = []
    for prompt, row in zip(prompts, sequences.tolist()):
        new = row[width:] if decoder else row[1:]
        eos = model.config.eos_token_id
        new = new[:new.index(eos)] if eos in new else new
        texts.append(tok.decode((prompt if decoder else []) + new))
    return texts


@pytest.mark.parametrize("argv,options", [
    ([], dict(max_new_tokens=20)),
    (["--max-new-tokens", "6", "--num-beams", "3", "--length-penalty", "0.5", "--early-stopping"],
     dict(max_new_tokens=6, num_beams=3, length_penalty=0.5, early_stopping=True)),
    (["--max-new-tokens", "8", "--do-sample", "--seed", "5", "--top-k", "20", "--top-p", "0.9", "--temperature", "0.8"],
     dict(max_new_tokens=8, do_sample=True, seed=5, top_k=20, top_p=0.9, temperature=0.8)),
], ids=["greedy", "beam", "sample"])
@pytest.mark.parametrize("which", ["gpt2", "t5"])
def test_one_generated_text_per_input_as_the_api_gives(argv, options, which, gpt2_dir, t5_dir, capsys):
    directory, model, tok = gpt2_dir if which == "gpt2" else t5_dir
    code, out, err = run(capsys, "--model", directory, *argv, *TEXTS)
    assert code == 0, err
    lines = out.split("\n")[:-1]  # (random models write any character: split at line feeds only)
    expected = expected_texts(model, tok, which == "gpt2", **options)
    assert lines == [text.replace("\r", "\\r").replace("\n", "\\n") for text in expected]
    assert len(lines) == len(TEXTS)
    if which == "gpt2":  # a decoder prints the prompt and its continuation
        assert all(line.startswith(text) and len(line) > len(text) for line, text in zip(lines, TEXTS))


def test_a_prefix_lm_reads_the_prompt_both_ways(gpt2_dir, t5_dir, capsys):
    directory, model, tok = gpt2_dir
    code, out, err = run(capsys, "--model", directory, "--max-new-tokens", "6", "--prefix-lm", *TEXTS)
    assert code == 0, err
    expected = expected_texts(model, tok, True, max_new_tokens=6, prefix_lm=True)
    assert out.split("\n")[:-1] == [text.replace("\r", "\\r").replace("\n", "\\n") for text in expected]
    code, out, err = run(capsys, "--model", t5_dir[0], "--prefix-lm", TEXTS[0])
    assert code == 2 and "prefix_lm: a decoder's option" in err


def test_the_same_seed_prints_the_same_samples(gpt2_dir, capsys):
    directory = gpt2_dir[0]
    argv = ("--model", directory, "--do-sample", "--seed", "9", "--max-new-tokens", "10", *TEXTS)
    first = run(capsys, *argv)
    assert first[0] == 0 and run(capsys, *argv) == first
    assert run(capsys, "--model", directory, "--do-sample", "--seed", "10", "--max-new-tokens", "10", *TEXTS)[1] \
        != first[1]


@pytest.mark.parametrize("argv,message", [
    (["--num-beams", "0"], "num_beams must be an integer of at least 1, got 0"),
    (["--do-sample", "--top-p", "1.5"], r"top_p must lie in \(0, 1\], got 1.5"),
    (["--do-sample", "--temperature", "0"], "temperature must be a positive number when sampling"),
    (["--max-new-tokens", "0"], "max_new_tokens must be an integer of at least 1, got 0"),
    (["--max-new-tokens", "60"], "max_new_tokens: [0-9]+ prompt token.* \\+ 60 new tokens exceed the model's 64 positions"),
    (["--top-k", "5"], "top_k=5 applies to sampling only: add do_sample=True"),
])
def test_bad_options_are_one_line_errors(argv, message, gpt2_dir, capsys):
    code, out, err = run(capsys, "--model", gpt2_dir[0], *argv, TEXTS[1])
    assert code == 2 and not out
    assert err.count("\n") == 1 and err.startswith("bertology generate: error: ")
    assert re.search(message, err), err
    assert "Traceback" not in err


def test_missing_model_tokenizer_and_empty_texts(gpt2_dir, tmp_path, capsys):
    directory, model, _ = gpt2_dir
    code, _, err = run(capsys, "--model", tmp_path / "nowhere", "hello")
    assert code == 2 and "nowhere" in err and err.count("\n") == 1
    from bertology.model import save_model

    bare = tmp_path / "bare"
    save_model(model, bare)
    code, _, err = run(capsys, "--model", bare, "hello")
    assert code == 2 and "no tokenizer files next to the model" in err
    code, _, err = run(capsys, "--model", directory, "the cat", "")
    assert code == 2 and "TEXT 2 ('') has no tokens" in err
