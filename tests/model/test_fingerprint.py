"""`bertology.model.fingerprint`: which model this is, whatever format it was saved in."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
import torch

from bertology.errors import ConfigError
from bertology.model import EncoderModel, HeadSpec, Pretrained, fingerprint, load, preset
from bertology.model.identity import state_fingerprint
from bertology.tokenization import train_tokenizer

WORDS = "the cat sat on the mat . the dog ran in the park . rain fell all day .".split()


@pytest.fixture(scope="module")
def tiny() -> Pretrained:
    tokenizer = train_tokenizer(iter([" ".join(WORDS)] * 4), "wordpiece", 60, show_progress=False, min_frequency=1)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=2, hidden_size=32, num_heads=2,
                    intermediate_size=64, max_position_embeddings=64)
    model = EncoderModel(config)
    model.init_weights(torch.Generator().manual_seed(0))
    return Pretrained(model.eval(), tokenizer)


def test_the_same_weights_in_transformers_and_native_layout_have_one_fingerprint(tiny, tmp_path):
    tiny.save(tmp_path / "hf", format="hf")
    tiny.save(tmp_path / "native", format="native")
    assert (tmp_path / "hf" / "config.json").is_file() and (tmp_path / "native" / "bertology.json").is_file()
    from_hf, from_native = load(tmp_path / "hf"), load(tmp_path / "native")
    assert fingerprint(from_hf) == fingerprint(from_native) == fingerprint(tiny)


def test_one_changed_weight_changes_it_dropout_and_heads_do_not(tiny):
    config = dataclasses.replace(tiny.model.config, hidden_dropout=0.3, attention_dropout=0.2, initializer_range=0.5)
    with_head = EncoderModel(config, (HeadSpec("label", "pooled", num_labels=3),))
    with_head.encoder.load_state_dict(tiny.model.encoder.state_dict())
    assert fingerprint(Pretrained(with_head, tiny.tokenizer)) == fingerprint(tiny)

    changed = EncoderModel(tiny.model.config)
    changed.encoder.load_state_dict(tiny.model.encoder.state_dict())
    with torch.no_grad():
        changed.encoder.layers[1].ffn_out.weight[0, 0] += 1e-3
    assert fingerprint(Pretrained(changed, tiny.tokenizer)) != fingerprint(tiny)
    # The tokenizer is part of it: the same weights without one are another model.
    assert fingerprint(tiny.model) == fingerprint(Pretrained(tiny.model, None)) != fingerprint(tiny)
    assert fingerprint(tiny.model, tiny.tokenizer) == fingerprint(tiny)


def test_state_fingerprint_hashes_name_dtype_shape_and_bytes():
    tensor = torch.tensor([1.0, -2.0])
    expected = hashlib.sha256(b"w|torch.float32|(2,)|" + tensor.numpy().tobytes()).hexdigest()
    assert state_fingerprint({"w": tensor, "skipped": torch.zeros(3)}, {"skipped"}) == expected
    assert state_fingerprint({"w": tensor.double()}) != expected


def test_something_not_a_model_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="expected a loaded model .bertology.load., got PosixPath"):
        fingerprint(tmp_path)


def test_an_xlnet_has_one_fingerprint_in_both_layouts_and_without_its_head(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.XLNetConfig(vocab_size=40, d_model=16, n_layer=1, n_head=2, d_inner=16)
    transformers.XLNetLMHeadModel(config).save_pretrained(tmp_path / "hf")
    lm = load(tmp_path / "hf")
    lm.save(tmp_path / "native", format="native")
    body = transformers.XLNetModel.from_pretrained(tmp_path / "hf")
    body.save_pretrained(tmp_path / "body")
    assert fingerprint(lm) == fingerprint(load(tmp_path / "native")) == fingerprint(load(tmp_path / "body"))
    with torch.no_grad():
        lm.model.layers[0].content_bias[0, 0] += 1e-3
    assert fingerprint(lm) != fingerprint(load(tmp_path / "body"))
