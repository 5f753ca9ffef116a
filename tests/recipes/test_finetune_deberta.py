"""Fine-tuning DeBERTa-v3 through the existing tasks and every strategy on a tiny random DebertaV2ForMaskedLM built
by transformers (v3's settings: shared position keys, 4 log buckets a side up to distance 16, shorter than the
texts) with a deberta-style SentencePiece tokenizer: SST-2 through the ContextPooler, CoNLL-2003 tagging, extractive
QA, each learnt and loaded back by transformers' DebertaV2For* class with the same logits (1e-5); full, frozen,
LoRA, adapters, prefix tuning and the scalar mix each train and `bertology predict` repeats the run's dev
predictions."""

from __future__ import annotations

import json

import pytest
import torch

from bertology.cli.main import main
from bertology.model import Pretrained, load, load_model
from bertology.recipes.finetune import FinetuneConfig, finetune
from bertology.tokenization import train_tokenizer
from finetune_helpers import BAD, FILL, GOOD, cue_sst2, key_squad, name_conll, strategy_trains_saves_and_predicts

transformers = pytest.importorskip("transformers")

CITIES = ["paris", "london", "rome", "oslo"]
WORDS = GOOD + BAD + FILL + CITIES + ["john", "mary", "met", "went", "to", "in", "key", "is", "what"]
PROBES = ["the film was good", "bad", "a very dull plot that was awful and the film was bad"]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("deberta")
    tokenizer = train_tokenizer(iter(WORDS * 3), "unigram", 80, style="deberta", show_progress=False)
    torch.manual_seed(0)
    config = transformers.DebertaV2Config(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
        intermediate_size=48, max_position_embeddings=128, relative_attention=True, pos_att_type=["p2c", "c2p"],
        position_buckets=4, max_relative_positions=16, share_att_key=True, norm_rel_ebd="layer_norm",
        position_biased_input=False, type_vocab_size=0, pad_token_id=tokenizer.pad_id)
    transformers.DebertaV2ForMaskedLM(config).save_pretrained(root / "hf")
    Pretrained(load_model(root / "hf"), tokenizer).save(root / "model")
    return root / "model"


def config(data, model, out, task="sst2", epochs=6, lr=3e-3, max_length=None, strategy="full"):
    return FinetuneConfig.from_dict({
        "model": str(model), "task": {"name": task, "data": str(data), "epochs": epochs, "max_length": max_length},
        "strategy": {"kind": strategy},
        "optim": {"batch_size": 16, "lr": lr, "warmup_ratio": 0.1},
        "run": {"output_dir": str(out), "log_every": 10, "progress": False},
        "speed": {"threads": 1, "prefetch": 0}})


def same_logits_in_transformers(model_dir, hf_class, texts, pairs=None):
    """Ours and transformers' class loaded from the same directory, on a right-padded batch."""
    ours = load(model_dir)
    hf = getattr(transformers, hf_class).from_pretrained(model_dir).eval()
    batch = ours.tokenizer.encode_batch(texts, pairs)
    assert (batch.attention_mask[:, -1] == 0).any()  # padding
    with torch.no_grad():
        theirs = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        mine = ours.model(batch.input_ids, batch.attention_mask).logits
    expected = torch.stack([theirs.start_logits, theirs.end_logits], -1) if hf_class.endswith("Answering") \
        else theirs.logits
    if mine.dim() == 3:  # per token: the real ones
        real = batch.attention_mask.bool()
        mine, expected = mine[real], expected[real]
    torch.testing.assert_close(mine, expected, atol=1e-5, rtol=0)


def test_sst2_learns_through_the_context_pooler(model_dir, tmp_path):
    data = cue_sst2(tmp_path)
    out = tmp_path / "run"
    result = finetune(config(data, model_dir, out))
    assert result.best["value"] > 80, result.best  # the cue word decides the label
    saved = json.loads((out / "model" / "config.json").read_text())
    assert saved["architectures"] == ["DebertaV2ForSequenceClassification"]
    same_logits_in_transformers(out / "model", "DebertaV2ForSequenceClassification", PROBES)


def test_ner_tags_the_names_and_transformers_gives_the_same_logits(model_dir, tmp_path):
    name_conll(tmp_path, words=(2, 8))
    out = tmp_path / "run"
    result = finetune(config(tmp_path, model_dir, out, task="conll2003", epochs=10, lr=1e-2))
    assert result.best["value"] > 50, result.best  # the name decides its tag
    assert json.loads((out / "model" / "config.json").read_text())["architectures"] == \
        ["DebertaV2ForTokenClassification"]
    same_logits_in_transformers(out / "model", "DebertaV2ForTokenClassification", PROBES)
    assert main(["predict", "--model", str(out / "model"), "--task", "conll2003", "--input",
                 str(tmp_path / "eng.testa"), "--output", str(tmp_path / "p.conll")]) == 0
    assert (tmp_path / "p.conll").read_text() == (out / "dev_predictions.conll").read_text()


def test_squad_learns_and_transformers_gives_the_same_logits(model_dir, tmp_path):
    key_squad(tmp_path / "tiny-squad.json", FILL, CITIES, (10, 30), 8, 8, 0)
    out = tmp_path / "run"
    result = finetune(config(tmp_path, model_dir, out, task="squad", epochs=10, lr=5e-3, max_length=40))
    assert result.best["value"] > 50, result.best
    assert json.loads((out / "model" / "config.json").read_text())["architectures"] == \
        ["DebertaV2ForQuestionAnswering"]
    same_logits_in_transformers(out / "model", "DebertaV2ForQuestionAnswering", ["what is the key"] * 2,
                                ["the film key is rome", "a plot was very dull key is oslo the film"])
    assert main(["predict", "--model", str(out / "model"), "--task", "squad", "--input", str(out / "dev_gold.json"),
                 "--output", str(tmp_path / "p.json"), "--max-length", "40"]) == 0
    assert json.loads((tmp_path / "p.json").read_text()) == json.loads((out / "dev_predictions.json").read_text())


@pytest.mark.parametrize("kind", ["frozen", "lora", "adapters", "prefix", "scalar-mix"])
def test_every_strategy_trains_saves_and_predicts(model_dir, tmp_path, kind):
    data = cue_sst2(tmp_path, seed=2)
    out = tmp_path / kind
    strategy_trains_saves_and_predicts(config(data, model_dir, out, epochs=2, strategy=kind), data, tmp_path)
    if kind == "lora":  # peft's format, on transformers' names of the projections
        adapter = json.loads((out / "peft_adapter" / "adapter_config.json").read_text())
        assert adapter["target_modules"] == ["query_proj", "value_proj"]
