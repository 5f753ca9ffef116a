"""SQuAD with the whole article as the context (``squad-article``): the joined articles and their answer offsets
(on a small file and on the shared one), and the comparison's machinery end to end on a few articles: a short model
reading windows of each article and a Longformer made from it reading the article in one window (its question
global), fine-tuned at the same budget and scored with the official EM/F1; `bertology predict` on the Longformer."""

from __future__ import annotations

import json

import pytest
import torch

from bertology.cli.main import main
from bertology.model import EncoderModel, LongformerModel, Pretrained, load, preset
from bertology.recipes.finetune import FinetuneConfig, finetune
from bertology.tasks.lookup import get_task
from bertology.tasks.examples import Answer, QAExample
from bertology.tasks.qa import ARTICLE_SEPARATOR, split_path, whole_articles
from bertology.tokenization import train_tokenizer
from finetune_helpers import key_squad

FILL = "the river city old man walked near green hills and a small house stood by road door cat sat on mat".split()
CITIES = ["paris", "london", "rome", "berlin", "madrid", "oslo"]


def test_whole_articles_join_paragraphs_and_move_answers():
    examples = [QAExample("a", "q1", "one two", [Answer("two", 4)], "T"),
                QAExample("b", "q2", "three four", [Answer("four", 6), Answer("three", 0)], "T"),
                QAExample("c", "q3", "one two", [Answer("one", 0)], "T"),
                QAExample("d", "q4", "five", [Answer("five", 0)], "U")]
    joined = whole_articles(examples)
    article = "one two" + ARTICLE_SEPARATOR + "three four"
    assert [e.context for e in joined] == [article, article, article, "five"]
    assert [e.id for e in joined] == ["a", "b", "c", "d"] and [e.title for e in joined] == ["T", "T", "T", "U"]
    assert [[(x.text, x.start) for x in e.answers] for e in joined] == [
        [("two", 4)], [("four", 15), ("three", 9)], [("one", 0)], [("five", 0)]]
    assert all(e.context[a.start:a.end] == a.text for e in joined for a in e.answers)


def test_the_shared_file_as_whole_articles(data_dir):
    path = data_dir / "squad" / "squad-v1.1-dev-part-a.json"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    task = get_task("squad-article")
    examples = task.read(path)
    assert len(examples) == 5397 and sum(len(e.answers) for e in examples) == 18368
    contexts = {e.title: e.context for e in examples}
    assert len(contexts) == 24 and all(e.context == contexts[e.title] for e in examples)
    assert all(e.context[a.start:a.end] == a.text for e in examples for a in e.answers)
    paragraphs = get_task("squad").read(path)  # the same questions, answers at the same characters of a paragraph
    assert [e.id for e in paragraphs] == [e.id for e in examples]
    assert all(p.context in e.context for p, e in zip(paragraphs[::97], examples[::97]))
    train, dev = (task.read(split_path(path, split)) for split in ("train", "dev"))
    assert len(train) + len(dev) == 5397 and {e.title for e in train}.isdisjoint({e.title for e in dev})
    assert len({e.title for e in dev}) == 6


def _articles(path, articles=6, paragraphs=3, seed=0):
    """Articles of `paragraphs` paragraphs of filler words, each with 'key is CITY' and a question about it."""
    return key_squad(path, FILL, CITIES, (15, 30), articles, paragraphs, seed)


def _run(model, data, out, max_length):
    return finetune(FinetuneConfig.from_dict({
        "model": str(model), "task": {"name": "squad-article", "data": str(data), "max_length": max_length,
                                      "max_steps": 3},
        "optim": {"batch_size": 4, "lr": 1e-3},
        "run": {"output_dir": str(out), "log_every": 1, "progress": False, "eval_every": 3},
        "speed": {"threads": 1, "prefetch": 0}}))


def test_short_windows_and_one_longformer_window_fine_tune_and_predict(tmp_path):
    torch.manual_seed(0)
    data = tmp_path / "squad"
    data.mkdir()
    _articles(data / "articles.json")
    tokenizer = train_tokenizer(iter([" ".join(FILL + CITIES + ["what", "is", "key"])] * 3), "wordpiece", 120,
                                show_progress=False, min_frequency=1)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=2, hidden_size=32, num_heads=2,
                    intermediate_size=64, max_position_embeddings=64)
    short = EncoderModel(config)
    short.init_weights(torch.Generator().manual_seed(0))
    Pretrained(short, tokenizer).save(tmp_path / "short")
    assert main(["longformer", "convert", "--model", str(tmp_path / "short"), "--max-length", "256", "--window",
                 "8", "--out", str(tmp_path / "long")]) == 0

    task = get_task("squad-article")
    dev = task.read(task.path(str(data), "dev"))
    assert len(dev) == 6 and len({e.context for e in dev}) == 2  # two articles, three questions each
    windows_short = task.encode(tokenizer, dev, 64, train=False)
    windows_long = task.encode(tokenizer, dev, 256, train=False)
    assert (windows_long.num_windows == 1).all() and (windows_short.num_windows >= 2).all()

    results = {}
    for name, length in (("short", 512), ("long", 4096)):  # each read at the task's length, capped at the model's
        results[name] = _run(tmp_path / name, data, tmp_path / f"run-{name}", length)
        assert results[name].steps == 3
        assert set(results[name].dev_metrics) >= {"f1", "exact_match"}
        assert all(0 <= results[name].dev_metrics[k] <= 100 for k in ("f1", "exact_match"))
        predictions = json.loads((tmp_path / f"run-{name}" / "dev_predictions.json").read_text(encoding="utf-8"))
        assert list(predictions) == [e.id for e in dev]
        assert all(p == "" or p in dev[0].context or p in dev[-1].context for p in predictions.values())
    gold = json.loads((tmp_path / "run-long" / "dev_gold.json").read_text(encoding="utf-8"))
    assert [len(article["paragraphs"]) for article in gold["data"]] == [1, 1]  # an article is one context

    ours = load(tmp_path / "run-long" / "model")
    assert isinstance(ours.model, LongformerModel) and ours.model.head_specs[0].name == "qa"
    batch = next(windows_long.batches(0, 2, drop_last=False))
    flags = ours.model.default_global_tokens(batch.input_ids)  # [CLS] and the question: before the first [SEP]
    first_sep = (batch.input_ids == tokenizer.sep_id).int().argmax(1)
    assert flags.sum(1).tolist() == first_sep.tolist() and bool((first_sep == 1 + 4).all())  # 4 question tokens

    written = tmp_path / "predictions.json"
    assert main(["predict", "--model", str(tmp_path / "run-long" / "model"), "--task", "squad-article", "--input",
                 str(tmp_path / "run-long" / "dev_gold.json"), "--output", str(written)]) == 0
    assert json.loads(written.read_text(encoding="utf-8")) == json.loads(
        (tmp_path / "run-long" / "dev_predictions.json").read_text(encoding="utf-8"))
