"""Fine-tuning XLNet through the existing tasks on a tiny random XLNetLMHeadModel built by transformers: SST-2 (the
summary token <cls> is last, batches padded on the left), CoNLL-2003 tagging and extractive QA (a window without
the answer points at <cls>); transformers loads each fine-tuned model as its XLNetFor* class and gives the same
logits on a left-padded batch (1e-5); `bertology predict` repeats the run's dev predictions."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertology.cli.main import main
from bertology.model import load
from bertology.recipes.finetune import FinetuneConfig, finetune
from bertology.tasks.lookup import get_task
from bertology.tasks.examples import Answer, QAExample
from bertology.tasks.qa import PairFrame, QAWindows
from bertology.tasks.sequence import EncodedExamples
from finetune_helpers import BAD, FILL, GOOD, cue_sst2, key_squad, name_conll, save_family_model, strategy_trains_saves_and_predicts

transformers = pytest.importorskip("transformers")

CITIES = ["paris", "london", "rome", "oslo"]
WORDS = GOOD + BAD + FILL + CITIES + ["john", "mary", "met", "went", "to", "in", "key", "is", "what"]
TEXTS = [" ".join(WORDS)] * 5 + [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))]
PROBES = ["the film was good", "bad", "a very dull plot that was awful"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_family_model(tmp_path_factory.mktemp("xlnet"), "xlnet", TEXTS)


def config(data, model, out, task="sst2", epochs=6, lr=3e-3, max_length=None, pooling="cls"):
    return FinetuneConfig.from_dict({
        "model": str(model), "task": {"name": task, "data": str(data), "epochs": epochs, "max_length": max_length,
                                      "pooling": pooling},
        "optim": {"batch_size": 16, "lr": lr, "warmup_ratio": 0.1},
        "run": {"output_dir": str(out), "log_every": 10, "progress": False},
        "speed": {"threads": 1, "prefetch": 0}})


def same_logits_in_transformers(model_dir, hf_class, texts, pairs=None):
    """Ours and transformers' class loaded from the same directory, on the tokenizer's left-padded batch."""
    ours = load(model_dir)
    hf = getattr(transformers, hf_class).from_pretrained(model_dir).eval()
    batch = ours.tokenizer.encode_batch(texts, pairs)
    assert (batch.attention_mask[:, -1] == 1).all() and (batch.attention_mask[:, 0] == 0).any()  # left padding
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
              "token_type_ids": batch.token_type_ids}
    with torch.no_grad():
        theirs = hf(**inputs)
        mine = ours.model(**inputs).logits
    expected = torch.stack([theirs.start_logits, theirs.end_logits], -1) if hf_class.endswith("Simple") \
        else theirs.logits
    torch.testing.assert_close(mine, expected, atol=1e-5, rtol=1e-5)


def test_sst2_reads_the_last_token_and_transformers_gives_the_same_logits(model_dir, tmp_path):
    cue_sst2(tmp_path)
    tokenizer = load(model_dir).tokenizer
    encoded = get_task("sst2").encode(tokenizer, get_task("sst2").read(tmp_path / "SST-2" / "dev.tsv"), 64,
                                      train=False)
    batch = next(encoded.batches(0, 32, drop_last=False))
    assert (batch.input_ids[:, -1] == tokenizer.framing.cls_id).all()  # <cls> last in every row
    out = tmp_path / "run"
    result = finetune(config(tmp_path, model_dir, out))
    assert result.best["value"] > 80, result.best  # the cue word decides the label
    assert json.loads((out / "model" / "config.json").read_text())["architectures"] == \
        ["XLNetForSequenceClassification"]
    same_logits_in_transformers(out / "model", "XLNetForSequenceClassification", PROBES)
    assert main(["predict", "--model", str(out / "model"), "--task", "sst2", "--input",
                 str(tmp_path / "SST-2" / "dev.tsv"), "--output", str(tmp_path / "p.tsv")]) == 0
    assert (tmp_path / "p.tsv").read_text() == (out / "dev_predictions.tsv").read_text()
    # The mean of the real tokens' vectors (left padding excluded) instead of the summary token.
    mean = finetune(config(tmp_path, model_dir, tmp_path / "mean", pooling="mean"))
    assert mean.best["value"] > 80, mean.best
    assert [h.kind for h in load(tmp_path / "mean" / "model").model.head_specs] == ["mean_pooled"]


def test_ner_tags_the_names_and_transformers_gives_the_same_logits(model_dir, tmp_path):
    name_conll(tmp_path, words=(2, 6))
    out = tmp_path / "run"
    result = finetune(config(tmp_path, model_dir, out, task="conll2003", epochs=10, lr=1e-2))
    assert result.best["value"] > 50, result.best  # the name decides its tag
    assert json.loads((out / "model" / "config.json").read_text())["architectures"] == \
        ["XLNetForTokenClassification"]
    same_logits_in_transformers(out / "model", "XLNetForTokenClassification", PROBES)
    assert main(["predict", "--model", str(out / "model"), "--task", "conll2003", "--input",
                 str(tmp_path / "eng.testa"), "--output", str(tmp_path / "p.conll")]) == 0
    assert (tmp_path / "p.conll").read_text() == (out / "dev_predictions.conll").read_text()


def squad_file(path, seed=0, articles=8, paragraphs=8):
    """The answer is the city after 'key is' in 10 to 30 filler words."""
    return key_squad(path, FILL, CITIES, (10, 30), articles, paragraphs, seed)


def test_qa_windows_point_at_cls_last_and_move_with_left_padding(model_dir):
    tokenizer = load(model_dir).tokenizer
    frame = PairFrame.of(tokenizer)
    assert frame.before == () and frame.after == (tokenizer.framing.sep_id, tokenizer.framing.cls_id)
    assert frame.null == -1
    context = "the film was a plot key is rome the film"
    examples = [QAExample("a", "what is the key", context, [Answer("rome", context.index("rome"))], "t"),
                QAExample("b", "what is the key", "a film", [Answer("film", 2)], "t")]
    windows = QAWindows.encode(tokenizer, examples, 12, doc_stride=2)
    assert windows.padding_side == "left"
    batch = windows.collate(np.arange(len(windows)))
    width = batch.input_ids.shape[1]
    for row in range(len(windows)):
        shift = width - int(windows.lengths[row])
        start, end = batch.labels[row].tolist()
        unshifted = windows.labels[row].tolist()
        assert (start - shift, end - shift) == tuple(unshifted)
        ids = batch.input_ids[row].tolist()
        if unshifted[0] == int(windows.lengths[row]) - 1:  # no answer here: <cls>, the last token
            assert ids[start] == ids[end] == tokenizer.framing.cls_id == ids[-1]
        else:
            assert tokenizer.decode(ids[start:end + 1]).strip() in ("rome", "film")
    assert isinstance(windows, EncodedExamples)


def test_squad_learns_and_transformers_simple_qa_gives_the_same_logits(model_dir, tmp_path):
    squad_file(tmp_path / "tiny-squad.json")
    out = tmp_path / "run"
    result = finetune(config(tmp_path, model_dir, out, task="squad", epochs=10, lr=5e-3, max_length=40))
    assert result.best["value"] > 50, result.best
    assert json.loads((out / "model" / "config.json").read_text())["architectures"] == \
        ["XLNetForQuestionAnsweringSimple"]
    same_logits_in_transformers(out / "model", "XLNetForQuestionAnsweringSimple", ["what is the key"] * 2,
                                ["the film key is rome", "a plot was very dull key is oslo the film"])
    gold = out / "dev_gold.json"
    assert main(["predict", "--model", str(out / "model"), "--task", "squad", "--input", str(gold),
                 "--output", str(tmp_path / "p.json"), "--max-length", "40"]) == 0
    assert json.loads((tmp_path / "p.json").read_text()) == json.loads((out / "dev_predictions.json").read_text())


@pytest.mark.parametrize("kind", ["adapters", "prefix"])
def test_adapters_and_prefixes_train_save_and_predict_on_xlnet(model_dir, tmp_path, kind):
    cue_sst2(tmp_path, seed=2, sizes=(("train", 32), ("dev", 16)))
    out = tmp_path / "run"
    run = config(tmp_path, model_dir, out, epochs=1)
    run.strategy.kind = kind
    strategy_trains_saves_and_predicts(run, tmp_path, tmp_path)
    assert load(out / "model").model.extensions  # bertology's native format: the extensions are rebuilt
