"""Longformer: random small checkpoints built by transformers (per-layer windows, global tokens, padding, lengths
that are not a multiple of the window) load with every hidden state and logit within 1e-5 and save back exactly;
transformers' default global tokens for classification and question answering; bad input named."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from bertology.errors import ConfigError, InputError  # noqa: E402
from bertology.model import LongformerConfig, LongformerModel, load_model, save_model  # noqa: E402
from bertology.model.checkpoint import config_from_hf  # noqa: E402

TOL = 1e-5
SEP = 2
SUFFIXES = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering"]


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
    torch.set_num_threads(1)


def reference(suffix: str, windows=(4, 8, 16), num_labels: int = 3):
    config = transformers.LongformerConfig(vocab_size=99, hidden_size=32, num_hidden_layers=len(windows),
                                           num_attention_heads=4, intermediate_size=37, max_position_embeddings=80,
                                           type_vocab_size=1, pad_token_id=1, sep_token_id=SEP,
                                           attention_window=list(windows), num_labels=num_labels)
    torch.manual_seed(1)
    model = getattr(transformers, "Longformer" + suffix)(config)
    with torch.no_grad():  # random biases and norms, so that their mapping is tested too
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def batch(lengths=(37, 21, 37, 5, 12)):
    """Ids with three separators a row (a question, then a context), right padding, global tokens on real ones."""
    ids = torch.randint(5, 99, (len(lengths), max(lengths)))
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
        ids[row, 0] = 0
        ids[row, [min(2, n - 3), min(3, n - 2), n - 1]] = SEP
    ids = ids.masked_fill(mask == 0, 1)
    flags = torch.zeros_like(ids)
    flags[:, 0] = 1
    if len(lengths) == 5:
        flags[0, [9, 30]] = 1
        flags[1, 20] = 1
        flags[2:4, 0] = 0  # rows 2 and 3: none
        flags[4, :4] = 1
    return ids, mask, flags


def logits_of(output, suffix):
    if suffix == "Model":
        return []
    if suffix == "ForQuestionAnswering":
        return [output.start_logits, output.end_logits] if hasattr(output, "start_logits") else \
            list(output.logits.unbind(-1))
    return [output.logits]


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_transformers_round_trip(tmp_path, suffix):
    ref = reference(suffix, num_labels=2 if suffix == "ForQuestionAnswering" else 3)
    ref.save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    assert isinstance(ours, LongformerModel) and ours.config.attention_window == [4, 8, 16]
    ids, mask, flags = batch()
    real = mask.bool()
    # explicit global tokens, and none (transformers' default of each class: [CLS] for the sequence classifier,
    # the question for question answering)
    for given in (flags, None):
        with torch.no_grad():
            expected = ref(input_ids=ids, attention_mask=mask, global_attention_mask=given, output_hidden_states=True)
            for packed in (True, False):
                got = ours(input_ids=ids, attention_mask=mask, global_attention_mask=given,
                           output_hidden_states=True, packed=packed)
                assert len(got.hidden_states) == len(expected.hidden_states) == 4
                for a, b in zip(got.hidden_states, expected.hidden_states):
                    assert (a[real] - b[real]).abs().max() <= TOL
                if suffix == "Model":
                    assert (got.pooler_output - expected.pooler_output).abs().max() <= TOL
                    assert (got.last_hidden_state[real] - expected.last_hidden_state[real]).abs().max() <= TOL
                for a, b in zip(logits_of(got, suffix), logits_of(expected, suffix), strict=True):
                    if a.shape[:2] == real.shape:
                        a, b = a[real], b[real]
                    assert (a - b).abs().max() <= TOL

    save_model(ours, tmp_path / "ours")
    back = type(ref).from_pretrained(tmp_path / "ours").eval()
    for name, tensor in ref.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    assert back.config.attention_window == [4, 8, 16]
    save_model(ours, tmp_path / "native", format="native")
    again = load_model(tmp_path / "native")
    assert isinstance(again, LongformerModel) and again.config == ours.config
    with torch.no_grad():
        a = again(ids, mask, global_attention_mask=flags).last_hidden_state
        b = ours(ids, mask, global_attention_mask=flags).last_hidden_state
    assert torch.equal(a, b)


@pytest.mark.parametrize("window", [4, 6])  # transformers fails on a window of 2 itself
def test_one_window_for_every_layer_and_sequences_shorter_than_it(tmp_path, window):
    """A config.json with one number; sequences shorter, and not a multiple, of the window: transformers pads them
    to a multiple of the window, the blocked kernel needs no padding."""
    ref = reference("Model", windows=(window,) * 2)
    ref.config.attention_window = window
    ref.save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    assert ours.config.attention_window == [window, window]
    ids, mask, flags = batch((3, 7, 11))
    with torch.no_grad():
        expected = ref(input_ids=ids, attention_mask=mask, global_attention_mask=flags).last_hidden_state
        got = ours(ids, mask, global_attention_mask=flags).last_hidden_state
    real = mask.bool()
    assert (got[real] - expected[real]).abs().max() <= TOL


def test_question_answering_needs_a_pair_without_a_global_mask(tmp_path):
    ref = reference("ForQuestionAnswering", num_labels=2)
    ref.save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    ids, mask, _ = batch()
    ids[1, 3] = 7  # a BERT-style pair: the question before the first of two separators
    flags = torch.zeros_like(ids)
    flags[1, :2] = 1
    flags[[0, 2, 3, 4], :2] = 1
    with torch.no_grad():
        assert torch.equal(ours(ids, mask).logits, ours(ids, mask, global_attention_mask=flags).logits)
    ids[1, 2] = 7
    with pytest.raises(InputError, match=r"global_attention_mask: row 1 has 1 separator token\(s\)"):
        ours(ids, mask)


def test_bad_windows_are_errors_naming_the_option():
    for bad, message in ((3, "the window of layer 0 is 3; it must be even"), (0, "the window of layer 0 is 0"),
                         (-4, "the window of layer 0 is -4"), ([4, 5], "the window of layer 1 is 5"),
                         ([4], "1 windows for 2 layers"), ("4", "expected a number")):
        with pytest.raises(ConfigError, match="attention_window: " + message):
            LongformerConfig(num_layers=2, hidden_size=8, num_heads=2, intermediate_size=8, attention_window=bad)
    hf = reference("Model").config.to_dict()
    hf["attention_window"] = [4, 7, 16]
    with pytest.raises(ConfigError, match="config.json: attention_window: the window of layer 1 is 7"):
        config_from_hf(hf)


def test_bad_inputs_are_errors_naming_the_option():
    config = LongformerConfig(vocab_size=50, num_layers=1, hidden_size=8, num_heads=2, intermediate_size=8,
                              max_position_embeddings=20, attention_window=4)
    model = LongformerModel(config).eval()
    ids = torch.randint(3, 50, (2, 10))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    flags = torch.zeros_like(ids)
    flags[1, 8] = 1
    with pytest.raises(InputError, match=r"global_attention_mask: row 1 puts a global token on padding \(column 8"):
        model(ids, mask, global_attention_mask=flags)
    with pytest.raises(InputError, match="global_attention_mask: expected 0"):
        model(ids, mask, global_attention_mask=flags * 2)
    with pytest.raises(InputError, match="global_attention_mask must have the shape"):
        model(ids, mask, global_attention_mask=flags[:, :4])
    with pytest.raises(InputError, match="input_ids: a sequence of 19 tokens is longer than this Longformer's 18 "
                                         r"positions \(max_position_embeddings 20 less the padding offset\); make a "
                                         "longer one with `bertology longformer convert --max-length`"):
        model(torch.randint(3, 50, (1, 19)))
    assert model(torch.randint(3, 50, (1, 18))).last_hidden_state.shape == (1, 18, 8)
    full = LongformerModel.__mro__[1](LongformerConfig.__mro__[1](vocab_size=50, num_layers=1, hidden_size=8,
                                                                  num_heads=2, intermediate_size=8))
    with pytest.raises(InputError, match="global_attention_mask: this model attends from every token"):
        full(ids, global_attention_mask=torch.zeros_like(ids))


def test_training_step_reaches_every_projection():
    """With dropout, padding and global tokens, the loss's gradient is finite and reaches the global projections
    (through the global rows) and the local ones."""
    config = LongformerConfig(vocab_size=50, num_layers=2, hidden_size=16, num_heads=2, intermediate_size=16,
                              max_position_embeddings=80, attention_window=[4, 8])
    model = LongformerModel(config).train()
    ids = torch.randint(3, 50, (3, 40))
    mask = torch.ones_like(ids)
    mask[1, 25:], mask[2, 9:] = 0, 0
    ids = ids.masked_fill(mask == 0, config.pad_token_id)
    flags = torch.zeros_like(ids)
    flags[0, [0, 17]], flags[2, 0] = 1, 1
    for packed in (True, False):
        model.zero_grad()
        out = model(ids, mask, global_attention_mask=flags, packed=packed)
        ((out.last_hidden_state[mask.bool()] ** 2).mean() + out.pooler_output.sum()).backward()
        for name, p in model.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
        for part in ("query_global", "key_global", "value_global", "query", "key"):
            assert model.encoder.layers[0].get_submodule(part).weight.grad.abs().sum() > 0, part


def test_info_names_the_windows():
    from bertology.info import describe
    from bertology.model import Pretrained

    config = LongformerConfig(vocab_size=50, num_layers=2, hidden_size=8, num_heads=2, intermediate_size=8,
                              max_position_embeddings=40, attention_window=[4, 8])
    text = describe(Pretrained(model=LongformerModel(config), tokenizer=None)).format()
    assert "family          longformer" in text
    assert "window          4, 8 tokens (half on each side), global tokens with their own projections" in text
