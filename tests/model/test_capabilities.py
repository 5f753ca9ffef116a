"""Each model declares what it can do; callers above the model package ask for a capability, not a class."""

from __future__ import annotations

import torch

from bertology.model import (DECODER_ONLY, ENCODER_DECODER, GENERATES, MASKED_LM, EncoderModel, HeadSpec, capabilities,
                             preset)
from bertology.model.transformer import DecoderModel, Seq2SeqModel
from transformer_helpers import tiny_config


def test_generating_models_declare_their_kind():
    torch.manual_seed(0)
    assert capabilities(DecoderModel(tiny_config(), [HeadSpec("lm", "tied_lm")])) == {GENERATES, DECODER_ONLY}
    assert capabilities(Seq2SeqModel(tiny_config(), [HeadSpec("lm", "tied_lm")])) == {GENERATES, ENCODER_DECODER}


def test_an_encoder_is_a_masked_lm_only_with_its_head():
    config = preset("tiny", vocab_size=40, num_layers=1, hidden_size=16, num_heads=2, intermediate_size=32)
    assert capabilities(EncoderModel(config, [HeadSpec("mlm", "masked_lm")])) == {MASKED_LM}
    assert capabilities(EncoderModel(config)) == frozenset()
    assert capabilities(object()) == frozenset()  # a model that declares nothing can do nothing asked of it
