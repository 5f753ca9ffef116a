"""`bertology longformer convert`: a BERT or RoBERTa model made into a Longformer computes what it did on inputs
within half a window, loads in transformers, and bad options are named."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from bertology.cli.main import main  # noqa: E402
from bertology.errors import ConfigError  # noqa: E402
from bertology.model import EncoderModel, LongformerModel, load_model, save_model  # noqa: E402
from bertology.model.longformer import longformer_from  # noqa: E402

SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
             max_position_embeddings=40)


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
    torch.set_num_threads(1)


def short_model(tmp_path, family: str, suffix: str = "ForMaskedLM", vocab_size: int = 99):
    small = {**SMALL, "vocab_size": vocab_size}
    if family == "roberta":
        config = transformers.RobertaConfig(**small, type_vocab_size=1, pad_token_id=1)
    else:
        config = transformers.BertConfig(**small, type_vocab_size=2, pad_token_id=0)
    torch.manual_seed(1)
    model = getattr(transformers, ("Roberta" if family == "roberta" else "Bert") + suffix)(config).eval()
    model.save_pretrained(tmp_path / family)
    return tmp_path / family


@pytest.mark.parametrize("family,suffix", [("roberta", "ForMaskedLM"), ("bert", "ForPreTraining")])
def test_converted_model_equals_the_short_one_within_half_a_window(tmp_path, family, suffix):
    source_dir = short_model(tmp_path, family, suffix)
    assert main(["longformer", "convert", "--model", str(source_dir), "--max-length", "100", "--window", "16",
                 "--out", str(tmp_path / "long")]) == 0
    record = json.loads((tmp_path / "long" / "longformer.json").read_text())
    assert record["dropped_heads"] == (["nsp"] if family == "bert" else [])
    short, long = load_model(source_dir), load_model(tmp_path / "long")
    assert isinstance(long, LongformerModel) and long.config.max_length == 100
    assert long.config.attention_window == [16, 16]
    pad = short.config.pad_token_id
    ids = torch.randint(5, 99, (3, 9))  # 9 tokens: each within 8 (half the window) of every other
    mask = torch.ones_like(ids)
    mask[1, 6:], mask[2, 3:] = 0, 0
    ids = ids.masked_fill(mask == 0, pad)
    real = mask.bool()
    with torch.no_grad():
        a, b = short(ids, mask), long(ids, mask)
    assert (a.last_hidden_state[real] - b.last_hidden_state[real]).abs().max() <= 1e-5
    assert (a.head_logits["mlm"][real] - b.head_logits["mlm"][real]).abs().max() <= 1e-5
    # transformers reads it, with the same outputs
    hf = transformers.LongformerForMaskedLM.from_pretrained(tmp_path / "long").eval()
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask).logits
    assert (theirs[real] - b.head_logits["mlm"][real]).abs().max() <= 1e-5
    # positions are the source's, repeated: position t of the long model is position t mod 38 (40 - 2) of RoBERTa
    positions = long.encoder.embeddings.position.weight
    short_positions = short.encoder.embeddings.position.weight
    offset, width = short.config.first_position, short.config.max_length
    new_offset = long.config.first_position
    for t in (0, 5, width - 1, width, width + 7, 99):
        assert torch.equal(positions[new_offset + t], short_positions[offset + t % width])
    for i in range(2):
        layer = long.encoder.layers[i]
        assert torch.equal(layer.query_global.weight, layer.query.weight)
        assert torch.equal(layer.value_global.bias, layer.value.bias)


def test_bad_options_are_named(tmp_path, capsys):
    source_dir = short_model(tmp_path, "roberta")
    for options, message in ((["--window", "15"], "window (--window) 15: the attention window must be an even"),
                             (["--window", "0"], "window (--window) 0"),
                             (["--max-length", "20"], "max_length (--max-length) 20 is shorter than the source "
                                                      "model's 38 positions")):
        code = main(["longformer", "convert", "--model", str(source_dir), "--out", str(tmp_path / "x"), *options])
        assert code == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "x").exists() or not any((tmp_path / "x").iterdir())
    longformer, _ = longformer_from(load_model(source_dir), 38, 4)  # as long as the source: allowed
    with pytest.raises(ConfigError, match="model \\(--model\\): a Longformer is made from a bert"):
        longformer_from(longformer, 100, 4)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    assert main(["longformer", "convert", "--model", str(source_dir), "--out", str(tmp_path / "taken")]) == 2
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


def test_a_long_input_runs_in_the_converted_model(tmp_path):
    source = EncoderModel(load_model(short_model(tmp_path, "roberta")).config)
    long, _ = longformer_from(source, 300, 8)
    save_model(long, tmp_path / "long")
    again = load_model(tmp_path / "long")
    ids = torch.randint(5, 99, (1, 300))
    flags = torch.zeros_like(ids)
    flags[0, 0] = 1
    with torch.no_grad():
        out = again(ids, global_attention_mask=flags).last_hidden_state
    assert out.shape == (1, 300, 32) and torch.isfinite(out).all()


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_the_tokenizer_comes_along_in_its_own_framing(tmp_path, kind):
    """A Longformer made from a BERT model keeps BERT's [CLS] ... [SEP] framing, one made from RoBERTa <s> ... </s>."""
    from bertology.model import load
    from bertology.tokenization import train_tokenizer

    texts = [f"the {w} sat on the mat number {i}" for i, w in enumerate(["cat", "dog", "bird"] * 20)]
    tokenizer = train_tokenizer(iter(texts), kind, 120, show_progress=False)
    family = "bert" if kind == "wordpiece" else "roberta"
    source_dir = short_model(tmp_path, family)
    model = load_model(source_dir)
    model.config.pad_token_id = tokenizer.pad_id  # the short model and its tokenizer agree on padding
    save_model(EncoderModel(model.config, model.head_specs), tmp_path / "source")
    tokenizer.save(tmp_path / "source")
    assert main(["longformer", "convert", "--model", str(tmp_path / "source"), "--max-length", "64", "--window",
                 "8", "--out", str(tmp_path / "long")]) == 0
    long = load(tmp_path / "long")
    assert long.tokenizer is not None and long.tokenizer.style == family
    assert long.model.config.sep_token_id == tokenizer.sep_id
    assert long.tokenizer.model_max_length == 64


def test_embed_reads_a_long_text_in_one_forward_with_a_global_summary_token(tmp_path):
    """embed of a text longer than the short model's positions: the short model reads it in windows, the Longformer
    in one forward whose <s> is global; its vectors are that forward's."""
    from bertology import embed
    from bertology.model import load
    from bertology.tokenization import train_tokenizer

    words = ["cat", "dog", "bird", "mat", "hat", "sun"]
    texts = [" ".join(words[(i * j) % 6] for j in range(12)) for i in range(30)]
    tokenizer = train_tokenizer(iter(texts), "bpe", 280, show_progress=False)
    source = load_model(short_model(tmp_path, "roberta", vocab_size=280))
    source.config.pad_token_id = tokenizer.pad_id
    save_model(EncoderModel(source.config, ()), tmp_path / "source")
    tokenizer.save(tmp_path / "source")
    assert main(["longformer", "convert", "--model", str(tmp_path / "source"), "--max-length", "256", "--window", "8",
                 "--out", str(tmp_path / "long")]) == 0
    long, short = load(tmp_path / "long"), load(tmp_path / "source")
    text = " ".join(words[j % 5] + " " + words[j % 6] for j in range(60))
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    framed = torch.tensor([long.tokenizer.framing.frame(ids).ids])
    shapes = []
    for model in (long.model, short.model):
        model.encoder.register_forward_hook(lambda module, args, out: shapes.append(tuple(args[0].shape)))
    got = embed(long, text, sentence="cls")
    assert shapes == [tuple(framed.shape)]  # one forward over the whole text
    embed(short, text, sentence="cls")
    assert shapes[1][0] > 1  # the short model: several windows
    assert 38 < framed.shape[1] <= 256
    flags = torch.zeros_like(framed)
    flags[0, 0] = 1
    with torch.no_grad():
        direct = long.model(framed, global_attention_mask=flags).last_hidden_state[0, 0]
    assert torch.allclose(torch.as_tensor(got.sentences[0]), direct, atol=1e-5)
