"""Parity with transformers for every family and head: a small random model built with transformers, saved, loaded
by bertology (every hidden state and head logit within 1e-5), then saved by bertology and loaded back by
transformers (exact)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from bertology.model import load_model, save_model  # noqa: E402

TOL = 1e-5
SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
             max_position_embeddings=64)
CONFIGS = {
    "bert": lambda: transformers.BertConfig(**SMALL, type_vocab_size=2),
    "roberta": lambda: transformers.RobertaConfig(**SMALL, type_vocab_size=1, pad_token_id=1),
    "xlm-roberta": lambda: transformers.XLMRobertaConfig(**SMALL, type_vocab_size=1, pad_token_id=1),
    "electra": lambda: transformers.ElectraConfig(**SMALL, embedding_size=16),
    "albert": lambda: transformers.AlbertConfig(**SMALL, embedding_size=16, num_hidden_groups=1, inner_group_num=1,
                                                hidden_act="gelu_new"),
    "albert-groups": lambda: transformers.AlbertConfig(**{**SMALL, "num_hidden_layers": 4}, embedding_size=16,
                                                       num_hidden_groups=2, inner_group_num=2),
    "distilbert": lambda: transformers.DistilBertConfig(vocab_size=99, dim=32, n_layers=3, n_heads=4, hidden_dim=37,
                                                        max_position_embeddings=64),
}
STEMS = {"bert": "Bert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta", "electra": "Electra", "albert": "Albert",
         "albert-groups": "Albert", "distilbert": "DistilBert"}
# transformers class suffix -> the output attribute(s) holding its logits
ARCHITECTURES = {
    "bert": ["Model", "ForPreTraining", "ForMaskedLM", "ForNextSentencePrediction", "ForSequenceClassification",
             "ForTokenClassification", "ForQuestionAnswering"],
    "roberta": ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering"],
    "electra": ["Model", "ForPreTraining", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
                "ForQuestionAnswering"],
    "albert": ["Model", "ForPreTraining", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
               "ForQuestionAnswering"],
    "distilbert": ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
                   "ForQuestionAnswering"],
}
ARCHITECTURES["xlm-roberta"] = ARCHITECTURES["roberta"]
ARCHITECTURES["albert-groups"] = ["Model", "ForPreTraining"]
CASES = [(family, suffix) for family, suffixes in ARCHITECTURES.items() for suffix in suffixes]


def batch(family: str, pad: int):
    torch.manual_seed(0)
    lengths = [12, 7, 12, 3]
    ids = torch.randint(5, 99, (len(lengths), max(lengths)))
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    ids = ids.masked_fill(mask == 0, pad)
    types = (torch.arange(ids.shape[1]) >= 5).long().expand_as(ids) * mask
    if family in ("roberta", "xlm-roberta", "distilbert"):
        types = None
    return ids, mask, types


def reference_logits(output) -> list[torch.Tensor]:
    names = ["logits", "prediction_logits", "seq_relationship_logits", "sop_logits", "start_logits", "end_logits"]
    return [getattr(output, n) for n in names if getattr(output, n, None) is not None]


def our_logits(output, suffix: str) -> list[torch.Tensor]:
    if suffix == "Model":
        return []
    if suffix == "ForQuestionAnswering":
        return list(output.logits.unbind(-1))
    return list(output.head_logits.values())


def build_reference(family: str, suffix: str, num_labels: int = 3):
    config = CONFIGS[family]()
    config.num_labels = num_labels
    torch.manual_seed(1)
    model = getattr(transformers, STEMS[family] + suffix)(config)
    with torch.no_grad():  # transformers initialises some biases to zero; random values test their mapping too
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


@pytest.mark.parametrize("family,suffix", CASES, ids=[f"{f}-{s}" for f, s in CASES])
def test_transformers_round_trip(tmp_path, family, suffix):
    reference = build_reference(family, suffix, num_labels=2 if suffix == "ForQuestionAnswering" else 3)
    reference.save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    ids, mask, types = batch(family, reference.config.pad_token_id)
    kwargs = dict(input_ids=ids, attention_mask=mask)
    if types is not None:
        kwargs["token_type_ids"] = types
    with torch.no_grad():
        expected = reference(**kwargs, output_hidden_states=True)
        real = mask.bool()
        for packed in (True, False):
            got = ours(ids, mask, types, output_hidden_states=True, packed=packed)
            assert len(got.hidden_states) == len(expected.hidden_states)
            for ours_h, ref_h in zip(got.hidden_states, expected.hidden_states):
                assert (ours_h[real] - ref_h[real]).abs().max() <= TOL
            if getattr(expected, "pooler_output", None) is not None:
                assert (got.pooler_output - expected.pooler_output).abs().max() <= TOL
            ref_logits, got_logits = reference_logits(expected), our_logits(got, suffix)
            assert len(ref_logits) == len(got_logits)
            for a, b in zip(got_logits, ref_logits):
                if a.dim() >= 2 and a.shape[:2] == real.shape:  # per-token logits: real tokens only
                    a, b = a[real], b[real]
                assert (a - b).abs().max() <= TOL

    save_model(ours, tmp_path / "ours")
    back = type(reference).from_pretrained(tmp_path / "ours").eval()
    for name, tensor in reference.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    with torch.no_grad():
        again = back(**kwargs, output_hidden_states=True)
    for a, b in zip(reference_logits(again) or [again.last_hidden_state],
                    reference_logits(expected) or [expected.last_hidden_state]):
        assert torch.equal(a, b)


def test_auto_model_loads_our_save(tmp_path):
    reference = build_reference("bert", "ForPreTraining")
    reference.save_pretrained(tmp_path / "hf")
    save_model(load_model(tmp_path / "hf"), tmp_path / "ours")
    auto = transformers.AutoModelForPreTraining.from_pretrained(tmp_path / "ours")
    assert type(auto).__name__ == "BertForPreTraining"
    assert transformers.AutoModel.from_pretrained(tmp_path / "ours").config.model_type == "bert"
