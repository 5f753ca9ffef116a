"""Every registered checkpoint family conforms, in every architecture its table declares: a small random transformers
model loads through bertology with transformers' logits (1e-5, fp32, a padded batch, packed and padded forwards),
saves, reloads with the same logits, and the saved directory loads in transformers with the same weights and outputs.

A family joins by registering its table (`bertology.model.convert.register_family`, or the table of built-ins):
the cases come from the registry, and the one thing this file needs from a family is the tiny transformers config of
`TINY` below (a family without one fails here, saying so)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from bertology.model import load_model, save_model  # noqa: E402
from bertology.model.convert import registry  # noqa: E402
from bertology.tokenization._pipeline import MODEL_TYPE_STYLE  # noqa: E402
from bertology.tokenization.framing import FRAMINGS  # noqa: E402

TOL = 1e-5  # fp32, depth 2-3, width 32: the observed differences are ~1e-6
SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
             max_position_embeddings=64)
# model_type -> a tiny transformers config of that family (ids 0-4 are specials in every one: the batch avoids them)
TINY = {
    "bert": lambda: transformers.BertConfig(**SMALL, type_vocab_size=2),
    "roberta": lambda: transformers.RobertaConfig(**SMALL, type_vocab_size=1, pad_token_id=1),
    "xlm-roberta": lambda: transformers.XLMRobertaConfig(**SMALL, type_vocab_size=1, pad_token_id=1),
    "electra": lambda: transformers.ElectraConfig(**SMALL, embedding_size=16),
    "albert": lambda: transformers.AlbertConfig(**{**SMALL, "num_hidden_layers": 4}, embedding_size=16,
                                                num_hidden_groups=2, inner_group_num=2, hidden_act="gelu_new"),
    "distilbert": lambda: transformers.DistilBertConfig(vocab_size=99, dim=32, n_layers=3, n_heads=4, hidden_dim=37,
                                                        max_position_embeddings=64),
    "gpt2": lambda: transformers.GPT2Config(vocab_size=99, n_embd=32, n_layer=3, n_head=4, n_positions=64,
                                            pad_token_id=0, bos_token_id=1, eos_token_id=1),
    "t5": lambda: transformers.T5Config(vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2,
                                        num_decoder_layers=2, num_heads=4, relative_attention_num_buckets=8,
                                        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0),
    "bart": lambda: transformers.BartConfig(vocab_size=99, d_model=32, encoder_layers=2, decoder_layers=2,
                                            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=37,
                                            decoder_ffn_dim=37, max_position_embeddings=64, pad_token_id=1,
                                            bos_token_id=0, eos_token_id=2, decoder_start_token_id=2),
    "xlnet": lambda: transformers.XLNetConfig(vocab_size=99, d_model=32, n_layer=2, n_head=4, d_inner=37,
                                              pad_token_id=0),
    "longformer": lambda: transformers.LongformerConfig(**SMALL, type_vocab_size=1, pad_token_id=1,
                                                        attention_window=[4, 4, 4], sep_token_id=2),
    # a window of 4 against rows of up to 12 tokens; layers global, local, local (every third global)
    "modernbert": lambda: transformers.ModernBertConfig(vocab_size=99, hidden_size=32, intermediate_size=40,
                                                        num_hidden_layers=3, num_attention_heads=4, local_attention=4,
                                                        global_attn_every_n_layers=3, max_position_embeddings=64,
                                                        pad_token_id=0, bos_token_id=1, cls_token_id=1,
                                                        eos_token_id=2, sep_token_id=2, attn_implementation="eager"),
    # DeBERTa-v3's settings: shared position keys, 4 log buckets a side up to distance 8 (rows of 12 reach beyond)
    "deberta-v2": lambda: transformers.DebertaV2Config(**SMALL, relative_attention=True, pos_att_type=["p2c", "c2p"],
                                                       position_buckets=4, max_relative_positions=8,
                                                       share_att_key=True, norm_rel_ebd="layer_norm",
                                                       position_biased_input=False, type_vocab_size=0),
}
LENGTHS = [12, 7, 12, 4]
LOGIT_FIELDS = ("logits", "prediction_logits", "seq_relationship_logits", "sop_logits", "start_logits", "end_logits")
CASES = [(model_type, suffix) for model_type, family in registry().items() for suffix in family.architectures]


# T5's classes whose decoder reads the input shifted right when given no decoder inputs (as BART's do)
T5_SHIFTED = ("ForSequenceClassification", "ForQuestionAnswering")


def padded_batch(model_type: str, config, suffix: str = "") -> SimpleNamespace:
    """Rows of LENGTHS real tokens (ids 5..98), padded on the family's side with its pad id; segment ids where the
    family has them; T5's decoder its own inputs, except in T5_SHIFTED (BART's, like transformers', shift the
    encoder's)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 99, (len(LENGTHS), max(LENGTHS)), generator=generator)
    mask = torch.zeros_like(ids)
    left = FRAMINGS[MODEL_TYPE_STYLE[model_type]].padding_side == "left"
    for row, n in enumerate(LENGTHS):
        if left:
            mask[row, -n:] = 1
        else:
            mask[row, :n] = 1
    last = mask.cumsum(1).argmax(1)  # each row's last real position
    rows = torch.arange(len(LENGTHS))
    if model_type in ("bart", "t5"):  # every row ends in one </s> (what transformers' sequence classifier reads)
        ids[rows, last] = config.eos_token_id
    if model_type == "longformer":  # a question, </s></s>, a context, </s>: where transformers' QA puts global tokens
        ids[rows, 1] = ids[rows, 2] = ids[rows, last] = config.sep_token_id
    ids = ids.masked_fill(mask == 0, config.pad_token_id or 0)
    batch = SimpleNamespace(input_ids=ids, attention_mask=mask)
    if getattr(config, "type_vocab_size", 1) > 1:
        batch.token_type_ids = (torch.arange(ids.shape[1]) >= 5).long().expand_as(ids) * mask
    if model_type == "t5" and suffix not in T5_SHIFTED:
        batch.decoder_input_ids = torch.randint(5, 99, (len(LENGTHS), 6), generator=generator)
    return batch


def reference_model(model_type: str, suffix: str):
    family = registry()[model_type]
    if model_type not in TINY:
        pytest.fail(f"family {model_type!r} is registered but has no tiny transformers config: add one to TINY")
    config = TINY[model_type]()
    config.num_labels = 2 if "QuestionAnswering" in suffix else 3
    torch.manual_seed(1)
    model = getattr(transformers, family.class_stem + suffix)(config)
    with torch.no_grad():  # transformers initialises some biases and norms to constants: random values test them too
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name.lower():
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def reference_inputs(batch: SimpleNamespace) -> dict:
    return {k: v for k, v in vars(batch).items() if v is not None}


def reference_outputs(output) -> list[torch.Tensor]:
    found = [getattr(output, name) for name in LOGIT_FIELDS if getattr(output, name, None) is not None]
    return found or [output.last_hidden_state]


def our_outputs(output, suffix: str) -> list[torch.Tensor]:
    if not output.head_logits:
        return [output.last_hidden_state]
    found = []
    for logits in output.head_logits.values():
        if "QuestionAnswering" in suffix:
            found.extend(logits.unbind(-1))
        else:
            found.append(logits)
    return found


def compare(ours: list[torch.Tensor], reference: list[torch.Tensor], real: torch.Tensor, tol: float, what: str):
    assert len(ours) == len(reference), what
    for a, b in zip(ours, reference):
        if a.dim() == b.dim() + 1 and a.shape[-1] == 1:
            a = a.squeeze(-1)
        assert a.shape == b.shape, (what, a.shape, b.shape)
        if a.dim() >= 2 and a.shape[:2] == real.shape:  # per-token outputs: at the real tokens only
            a, b = a[real], b[real]
        assert (a - b).abs().max() <= tol, (what, float((a - b).abs().max()))


def real_positions(model_type: str, suffix: str, batch: SimpleNamespace, reference_output) -> torch.Tensor:
    first = reference_outputs(reference_output)[0]
    if model_type == "t5" and suffix != "EncoderModel":  # the decoder's positions, the shifted pads too: all real
        decoder = getattr(batch, "decoder_input_ids", batch.input_ids)
        return torch.ones(decoder.shape, dtype=torch.bool)
    if first.dim() >= 2 and first.shape[:2] == batch.attention_mask.shape:
        return batch.attention_mask.bool()
    return torch.ones(first.shape[:2], dtype=torch.bool)


@pytest.mark.parametrize("model_type,suffix", CASES, ids=[f"{t}-{s}" for t, s in CASES])
def test_a_registered_family_loads_saves_and_reloads_with_transformers_outputs(tmp_path, one_thread, model_type,
                                                                               suffix):
    reference = reference_model(model_type, suffix)
    reference.save_pretrained(tmp_path / "hf")
    batch = padded_batch(model_type, reference.config, suffix)
    ours = load_model(tmp_path / "hf")
    with torch.no_grad():
        expected = reference(**reference_inputs(batch))
        real = real_positions(model_type, suffix, batch, expected)
        first = None
        accepts = inspect.signature(ours.forward).parameters
        # the packed and the padded computation, where the model has both (XLNet packs by itself, without memory)
        modes = ({"packed": True}, {"packed": False}) if "packed" in accepts else ({},)
        states = "output_hidden_states" in accepts and "output_hidden_states" in inspect.signature(
            reference.forward).parameters
        if states:  # every hidden state too, and the pooler's output, where both models return them
            expected = reference(**reference_inputs(batch), output_hidden_states=True)
        for mode in modes:
            output = ours(**ours.forward_inputs(batch), **mode, **({"output_hidden_states": True} if states else {}))
            got = our_outputs(output, suffix)
            compare(got, reference_outputs(expected), real, TOL, f"loaded, {mode}")
            first = first or got
            if states and getattr(expected, "hidden_states", None) is not None:
                length = batch.input_ids.shape[1]  # Longformer's are padded to a multiple of its window
                compare(list(output.hidden_states), [h[:, :length] for h in expected.hidden_states],
                        batch.attention_mask.bool(), TOL, f"hidden states, {mode}")
            if getattr(expected, "pooler_output", None) is not None and getattr(output, "pooler_output", None) is not None:
                compare([output.pooler_output], [expected.pooler_output], real, TOL, f"pooler, {mode}")

    save_model(ours, tmp_path / "ours")
    again = load_model(tmp_path / "ours")
    with torch.no_grad():
        compare(our_outputs(again(**again.forward_inputs(batch)), suffix), first, real, 0.0, "reloaded")

    # the same attention implementation as the reference (ModernBERT's tiny config asks for eager; SDPA rounds apart)
    back = type(reference).from_pretrained(tmp_path / "ours",
                                           attn_implementation=reference.config._attn_implementation).eval()
    saved = back.state_dict()
    for name, tensor in reference.state_dict().items():
        assert torch.equal(saved[name], tensor), name
    with torch.no_grad():
        compare(reference_outputs(back(**reference_inputs(batch))), reference_outputs(expected), real, 0.0,
                "transformers, from our save")


def test_every_registered_family_has_a_tiny_config():
    assert set(registry()) <= set(TINY), sorted(set(registry()) - set(TINY))


def test_transformers_auto_classes_load_our_save(tmp_path):
    reference = reference_model("bert", "ForPreTraining")
    reference.save_pretrained(tmp_path / "hf")
    save_model(load_model(tmp_path / "hf"), tmp_path / "ours")
    auto = transformers.AutoModelForPreTraining.from_pretrained(tmp_path / "ours")
    assert type(auto).__name__ == "BertForPreTraining"
    assert transformers.AutoModel.from_pretrained(tmp_path / "ours").config.model_type == "bert"
