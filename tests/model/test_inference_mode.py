"""Every family loads and runs under `torch.inference_mode()` and `torch.no_grad()`, loaded inside the context or
outside it, with the same outputs as a plain load run without gradients; the fused q/k/v weights of a block made of
inference tensors (no version counter) follow in-place changes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import bertology  # noqa: E402
from bertology.model import HeadSpec, save_model  # noqa: E402
from bertology.model.blocks import Block, BlockSpec  # noqa: E402
from bertology.model.elmo import ElmoModel, batch_to_ids, tiny_config  # noqa: E402

VOCAB = 61
SMALL = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
             max_position_embeddings=40)


def hf_models() -> dict[str, torch.nn.Module]:
    t = transformers
    return {
        "bert": t.BertModel(t.BertConfig(**SMALL)),
        "roberta": t.RobertaModel(t.RobertaConfig(**SMALL, type_vocab_size=1, pad_token_id=1)),
        "xlm-roberta": t.XLMRobertaModel(t.XLMRobertaConfig(**SMALL, type_vocab_size=1, pad_token_id=1)),
        "albert": t.AlbertModel(t.AlbertConfig(**SMALL, embedding_size=8)),
        "electra": t.ElectraModel(t.ElectraConfig(**SMALL, embedding_size=8)),
        "distilbert": t.DistilBertModel(t.DistilBertConfig(vocab_size=VOCAB, dim=16, n_layers=2, n_heads=2,
                                                           hidden_dim=24, max_position_embeddings=40)),
        "gpt2": t.GPT2LMHeadModel(t.GPT2Config(vocab_size=VOCAB, n_positions=40, n_embd=16, n_layer=2, n_head=2,
                                               bos_token_id=0, eos_token_id=0)),
        "t5": t.T5ForConditionalGeneration(t.T5Config(
            vocab_size=VOCAB, d_model=16, d_kv=4, d_ff=24, num_layers=2, num_decoder_layers=2, num_heads=2,
            relative_attention_num_buckets=8, relative_attention_max_distance=20, decoder_start_token_id=0)),
        "bart": t.BartForConditionalGeneration(t.BartConfig(
            vocab_size=VOCAB, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=24, decoder_ffn_dim=24, max_position_embeddings=40,
            pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)),
        "xlnet": t.XLNetModel(t.XLNetConfig(vocab_size=VOCAB, d_model=16, n_layer=2, n_head=2, d_inner=24,
                                            mem_len=None, pad_token_id=1)),
        "longformer": t.LongformerModel(t.LongformerConfig(**SMALL, type_vocab_size=1, pad_token_id=1,
                                                           attention_window=[4, 4])),
        "modernbert": t.ModernBertModel(t.ModernBertConfig(
            vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
            max_position_embeddings=40, local_attention=4, global_attn_every_n_layers=2, pad_token_id=1,
            bos_token_id=0, cls_token_id=0, eos_token_id=2, sep_token_id=2)),
        "deberta-v2": t.DebertaV2Model(t.DebertaV2Config(
            **SMALL, relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=4,
            max_relative_positions=16, share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False,
            type_vocab_size=0)),
    }


FAMILIES = [*hf_models(), "elmo"]


@pytest.fixture(scope="module")
def directories(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    torch.manual_seed(0)
    found = {}
    for family, model in hf_models().items():
        model.eval().save_pretrained(root / family)
        found[family] = root / family
    torch.manual_seed(0)
    elmo = ElmoModel(tiny_config(vocab_size=VOCAB, dropout=0.0), (HeadSpec("lm", "tied_lm_bias"),))
    elmo.init_weights(torch.Generator().manual_seed(1))  # the constructor leaves the weights to this
    save_model(elmo.eval(), root / "elmo")
    found["elmo"] = root / "elmo"
    return found


def inputs(family: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows, the second shorter (padding on the right; XLNet's mask reads either side)."""
    if family == "elmo":
        return batch_to_ids([["The", "cat", "sat", "."], ["a", "dog"]])
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(3, VOCAB, (2, 9), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    return ids.masked_fill(mask == 0, 1), mask


def outputs(model, family: str) -> torch.Tensor:
    ids, mask = inputs(family)
    if family in ("t5", "bart"):  # the decoder's states, over the encoder's
        return model(ids, mask, decoder_input_ids=ids[:, :4]).last_hidden_state.clone()
    return model(ids, mask).last_hidden_state.clone()


CONTEXTS = {"inference_mode": torch.inference_mode, "no_grad": torch.no_grad}


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("context", sorted(CONTEXTS))
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_loads_and_runs_under_the_context(directories, family, context):
    """Loaded inside the context or outside it, run inside it (twice: the second call meets what the first kept),
    the last hidden states equal a plain load's without gradients; loaded inside and run outside
    under no_grad too."""
    torch.manual_seed(0)
    directory = directories[family]
    with torch.no_grad():
        reference = outputs(bertology.load(directory).model.eval(), family)
    outside = bertology.load(directory).model.eval()
    with CONTEXTS[context]():
        inside = bertology.load(directory).model.eval()
        runs = [outputs(m, family) for m in (outside, inside, outside, inside)]
    with torch.no_grad():
        runs.append(outputs(inside, family))  # made in the context, run after it
    for got in runs:
        assert not got.requires_grad
        torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-6)
    if context == "inference_mode":
        assert any(p.is_inference() for p in inside.parameters())


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("family", ["gpt2", "t5", "bart"])
def test_generation_under_inference_mode_equals_generation_without_gradients(directories, family):
    """Decoding (steps of one row: the three projections apart for inference tensors) gives the tokens of
    the same model run under no_grad."""
    ids, mask = inputs(family)
    ids, mask = ids[:, :5], mask[:, :5]  # no padding: a decoder's prompts are padded on the left
    with torch.no_grad():
        plain = bertology.generate(bertology.load(directories[family]), ids, mask, max_new_tokens=6)
    with torch.inference_mode():
        pretrained = bertology.load(directories[family])
        again = bertology.generate(pretrained, ids, mask, max_new_tokens=6)
    assert plain.shape[1] > (ids.shape[1] if family == "gpt2" else 1)
    assert torch.equal(again, plain)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("rows", [1, 512])
def test_fused_projections_of_inference_tensors_follow_in_place_changes(rows):
    """Inference tensors have no version counter, so nothing is kept: a weight changed in place inside inference
    mode is seen at the next call (three products, at any number of rows)."""
    torch.manual_seed(0)
    with torch.inference_mode():
        block = Block(BlockSpec(hidden_size=16, num_heads=2, head_dim=8, intermediate_size=32)).eval()
        x = torch.randn(rows, 16)
        assert block.query.weight.is_inference()
        for step in range(3):
            got = block.project(x)
            want = (block.query(x), block.key(x), block.value(x))
            for g, w in zip(got, want):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
            block.key.weight.mul_(2.0)  # in place, no version bump
            block.value.bias.add_(1.0)
        assert "_fused_qkv" not in block.__dict__
        assert block.fused_qkv() is None


def test_fused_projections_of_normal_weights_are_kept_under_inference_mode():
    """Weights made outside inference mode keep their version counter: the concatenation is kept across calls under
    inference_mode, and an in-place change made under no_grad (a version bump) replaces it."""
    torch.manual_seed(0)
    block = Block(BlockSpec(hidden_size=16, num_heads=2, head_dim=8, intermediate_size=32)).eval()
    x = torch.randn(3, 16)
    with torch.inference_mode():
        first = block.fused_qkv()
        assert block.fused_qkv() is first
    with torch.no_grad():
        block.key.weight.mul_(2.0)
    with torch.inference_mode():
        second = block.fused_qkv()
        assert second is not first
        for got, want in zip(block.project(x), (block.query(x), block.key(x), block.value(x))):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
