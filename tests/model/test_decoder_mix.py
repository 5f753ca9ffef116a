"""ELMo's scalar mix on the other stacks: a GPT-2 decoder and an encoder-decoder's encoder alone (BART's encoder for
tagging, T5EncoderModel) with the extension `scalar_mix` at `mix`: their heads read gamma * sum_j softmax(s)_j h_j
over the embedding output and every block's output, the native format keeps the mix, `embed(layers="mix")` reads
the model's own weights, and `strategy.kind: scalar-mix` fine-tunes the mix and the head of a frozen GPT-2."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertology.embeddings import embed
from bertology.model import load
from bertology.model.checkpoint import Pretrained
from bertology.model.heads import HeadSpec
from bertology.model.encoder import EncoderModel
from bertology.model.transformer import DecoderModel, TransformerConfig
from bertology.recipes.finetune import FinetuneConfig, finetune
from finetune_helpers import BAD, FILL, GOOD, cue_sentence, family_tokenizer

TEXTS = [" ".join(GOOD + BAD + FILL)] * 4 + ["the cat sat on the mat", "a dull plot and a fine cast"]


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(cls: type, vocab: int = 60, pad: int = 0):
    config = TransformerConfig.decoder(family="gpt2" if cls is DecoderModel else "t5", vocab_size=vocab, hidden_size=16,
                               num_layers=3, num_heads=2, intermediate_size=32, max_position_embeddings=64,
                               positions="learned" if cls is DecoderModel else "relative", pad_token_id=pad,
                               hidden_dropout=0.0, attention_dropout=0.0)
    model = cls(config, [HeadSpec("token_classifier", "token", 3)])
    model.init_weights(torch.Generator().manual_seed(0))
    return model.eval()


def set_mix(model) -> torch.Tensor:
    mix = model.add_extension("mix", "scalar_mix")
    with torch.no_grad():
        mix.scalars.copy_(torch.tensor([0.3, -1.0, 2.0, 0.5]))
        mix.gamma.fill_(1.7)
    return 1.7 * torch.tensor([0.3, -1.0, 2.0, 0.5]).softmax(0)


@pytest.mark.parametrize("cls", [DecoderModel, EncoderModel])
def test_heads_read_the_softmax_weighted_sum_of_every_state(cls):
    model = tiny(cls)
    ids = torch.randint(1, 60, (3, 7))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    with torch.no_grad():
        states = model(ids, mask, output_hidden_states=True).hidden_states
        weights = set_mix(model)
        out = model(ids, mask)
        kept = model(ids, mask, output_hidden_states=True)
    assert len(states) == 4 and out.hidden_states is None  # the states the mix read are not returned unasked
    mixed = sum(w * s for w, s in zip(weights, states))
    head = model.heads["token_classifier"].out
    expected = mixed @ head.weight.T + head.bias
    real = mask.bool()
    torch.testing.assert_close(out.logits[real], expected[real], atol=1e-5, rtol=1e-5)
    assert len(kept.hidden_states) == 4
    torch.testing.assert_close(kept.logits, out.logits)


def test_the_native_format_keeps_the_mix_and_embed_reads_its_weights(tmp_path):
    tokenizer = family_tokenizer("gpt2", TEXTS)
    model = tiny(DecoderModel, tokenizer.vocab_size, tokenizer.pad_id)
    weights = set_mix(model)
    Pretrained(model, tokenizer).save(tmp_path / "mixed")
    back = load(tmp_path / "mixed")
    assert back.model.mix is not None and back.model.extensions == {"mix": ("scalar_mix", {})}
    ids = torch.tensor([tokenizer.encode("the cat sat on the mat").ids])
    with torch.no_grad():
        torch.testing.assert_close(back.model(ids).logits, model(ids).logits)
    texts = ["the cat sat on the mat", "a fine cast"]
    mixed = embed(back, texts, layers="mix", levels=("word",)).words.vectors
    one = [embed(back, texts, layers=[j], levels=("word",)).words.vectors for j in range(4)]
    np.testing.assert_allclose(mixed, sum(float(w) * v for w, v in zip(weights, one)), atol=1e-5)


def test_scalar_mix_fine_tunes_the_mix_and_the_head_of_a_frozen_gpt2(tmp_path):
    tokenizer = family_tokenizer("gpt2", TEXTS)
    base = tiny(DecoderModel, tokenizer.vocab_size, tokenizer.pad_id)
    base.head_specs, base.heads = (), torch.nn.ModuleDict()
    Pretrained(base, tokenizer).save(tmp_path / "base")
    rng = np.random.default_rng(0)
    glue = tmp_path / "glue" / "SST-2"
    glue.mkdir(parents=True)
    for split, n in (("train", 96), ("dev", 32)):
        rows = [(cue_sentence(rng, label), label) for label in rng.integers(0, 2, n)]
        (glue / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s} \t{y}\n" for s, y in rows))
    result = finetune(FinetuneConfig.from_dict({
        "model": str(tmp_path / "base"), "task": {"name": "sst2", "data": str(glue.parent), "epochs": 2},
        "strategy": {"kind": "scalar-mix"}, "optim": {"batch_size": 16, "lr": 1e-2},
        "run": {"output_dir": str(tmp_path / "run"), "progress": False}, "speed": {"threads": 1, "prefetch": 0}}))
    trained = load(tmp_path / "run" / "model").model
    assert isinstance(trained, DecoderModel) and trained.mix is not None
    for name, value in base.decoder.state_dict().items():  # the decoder is frozen
        torch.testing.assert_close(trained.decoder.state_dict()[name], value)
    assert not torch.equal(trained.mix.scalars.detach(), torch.zeros(4))  # the mix learnt its weights
    heads = sum(p.numel() for p in trained.heads.parameters())
    assert result.trainable.trainable == heads + 4 + 1  # the classifier, one scalar per state, gamma
