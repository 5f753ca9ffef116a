"""The one config class of the transformer families: presets, validation, and native-format dicts written by the
two former classes (the encoders' and the decoders') loading as they were."""

from __future__ import annotations

import pytest

from bertology.errors import ConfigError
from bertology.model.config import (
    DECODER_DEFAULTS,
    DECODER_ONLY_FIELDS,
    ENCODER_ONLY_FIELDS,
    TransformerConfig,
    preset,
)

TINY = dict(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=24)


def test_the_decoder_preset_starts_from_a_gpt2_shaped_decoder():
    config = TransformerConfig.decoder(family="gpt2", **TINY)
    assert config.pre_norm and config.final_norm and not config.embedding_norm
    assert config.type_vocab_size == 0 and not config.pooler and config.hidden_act == "gelu_new"
    bert = TransformerConfig.bert(**TINY)
    assert bert == TransformerConfig(**TINY) == preset("tiny", **TINY)
    assert not bert.pre_norm and bert.embedding_norm and not bert.final_norm and bert.pooler
    assert {k: getattr(config, k) for k in DECODER_DEFAULTS} == DECODER_DEFAULTS | {"family": "gpt2",
                                                                                  "vocab_size": 40}


def test_a_decoder_dict_written_before_the_merge_loads_with_the_decoder_defaults():
    config = TransformerConfig.decoder(family="t5", positions="relative", norm="rmsnorm", **TINY)
    old = {k: v for k, v in config.to_dict().items() if k not in ENCODER_ONLY_FIELDS}
    assert TransformerConfig.from_dict(old) == config


def test_an_encoder_dict_written_before_the_merge_loads_with_berts_defaults():
    config = preset("tiny", family="albert", num_layer_groups=1, embedding_size=32, vocab_size=50)
    old = {k: v for k, v in config.to_dict().items() if k not in DECODER_ONLY_FIELDS}
    assert TransformerConfig.from_dict(old) == config
    assert TransformerConfig.from_dict(config.to_dict()) == config


def test_unknown_keys_are_named_with_the_kind_of_config():
    with pytest.raises(ConfigError, match="unknown encoder config key.*: colour"):
        TransformerConfig.from_dict({**preset("tiny").to_dict(), "colour": 1})
    with pytest.raises(ConfigError, match="unknown transformer config key.*: colour"):
        TransformerConfig.from_dict({**TransformerConfig.decoder(family="gpt2", **TINY).to_dict(), "colour": 1})


def test_windows_are_one_width_or_none_per_layer():
    config = TransformerConfig(**{**TINY, "num_layers": 3}, attention_window=[4, None, 8])
    assert [config.window_of(i) for i in range(3)] == [4, None, 8]
    assert TransformerConfig(**TINY, attention_window=6).attention_window == [6, 6]
    with pytest.raises(ConfigError, match="the window of layer 1 is 5"):
        TransformerConfig(**TINY, attention_window=[4, 5])
    with pytest.raises(ConfigError, match="attention_window: 1 windows for 2 layers"):
        TransformerConfig(**TINY, attention_window=[4])
    with pytest.raises(ConfigError, match="unknown model family 'mamba'"):
        TransformerConfig(family="mamba")  # type: ignore[arg-type]


def test_the_first_position_and_the_length_follow_the_position_scheme():
    roberta = preset("tiny", family="roberta", positions_after_padding=True, pad_token_id=1,
                     max_position_embeddings=514)
    assert roberta.first_position == 2 and roberta.max_length == 512
    bart = TransformerConfig.decoder(family="bart", position_offset=2, **TINY)
    assert bart.first_position == 2 and bart.max_length == 1024
    t5 = TransformerConfig.decoder(family="t5", positions="relative", **TINY)
    assert t5.max_length > 10 ** 6
