"""Every transformer model runs the one `Stack`: the encoder's features (a layer plan with shared layers, windows)
are the decoder's too, and a decoder with shared layers decodes through its cache as it reads a whole input."""

from __future__ import annotations

import torch

from bertology.model import DecoderModel, EncoderModel, Seq2SeqModel
from bertology.model.config import TransformerConfig, preset
from bertology.model.stack import Stack

TINY = dict(vocab_size=40, hidden_size=16, num_layers=4, num_heads=2, intermediate_size=24, hidden_dropout=0.0,
            attention_dropout=0.0)


def test_every_model_wraps_the_one_stack():
    encoder = EncoderModel(preset("tiny", vocab_size=40))
    decoder = DecoderModel(TransformerConfig.decoder(family="gpt2", **TINY))
    seq2seq = Seq2SeqModel(TransformerConfig.decoder(family="t5", positions="relative", **TINY))
    alone = EncoderModel(TransformerConfig.decoder(family="t5", positions="relative", **TINY))
    stacks = [encoder.encoder, decoder.decoder, seq2seq.encoder, seq2seq.decoder, alone.encoder]
    assert all(type(s) is Stack or isinstance(s, Stack) for s in stacks)
    assert encoder.encoder.embeddings is not None and decoder.decoder.embeddings is None
    assert [p.causal for p in (decoder.decoder.policy, seq2seq.encoder.policy, seq2seq.decoder.policy)] == [
        True, False, True]


def test_a_decoder_with_shared_layers_decodes_through_its_cache(one_thread):
    torch.manual_seed(0)
    config = TransformerConfig.decoder(family="gpt2", num_layer_groups=2, **TINY)
    model = DecoderModel(config).eval()
    model.init_weights(torch.Generator().manual_seed(1))
    assert len(model.decoder.layers) == 2 and model.decoder.plan == [0, 0, 1, 1]
    ids = torch.randint(0, 40, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        whole = model(ids, output_hidden_states=True)
        assert len(whole.hidden_states) == 5  # the embeddings, then each of the four layer calls
        out = model(ids[:, :4], use_cache=True)
        steps = [out.last_hidden_state]
        for t in range(4, 7):
            out = model(ids[:, t:t + 1], torch.ones(2, t + 1, dtype=torch.long),
                        past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.last_hidden_state)
    assert len(out.past_key_values) == 4  # one cache a layer call
    torch.testing.assert_close(torch.cat(steps, 1), whole.last_hidden_state, rtol=1e-5, atol=1e-5)
