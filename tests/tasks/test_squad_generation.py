"""SQuAD v1.1 as generation on encoder-decoders (T5, BART): inputs and targets made of real questions from the
shared data, a short fine-tuning run end to end on tiny random models, and the official EM/F1 of hand-made
generated answers computed exactly."""

from __future__ import annotations

import json

import pytest
import torch

from bertology.cli.main import main
from bertology.model import load
from bertology.recipes.finetune import FinetuneConfig, finetune
from bertology.tasks.lookup import get_task
from bertology.tasks.metrics import evaluate_files
from bertology.tasks.qa import write_squad_json
from bertology.tasks.text_to_text import SquadTextToText
from finetune_helpers import save_family_model

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def questions(data_dir):
    """The first 12 questions of the shared SQuAD file (read once: reading checks every answer of the file)."""
    path = data_dir / "squad" / "squad-v1.1-dev-part-a.json"
    if not path.is_file():
        pytest.skip(f"SQuAD data not found at {path}")
    return get_task("squad").read(path, 12)


@pytest.fixture(scope="module")
def squad(questions, tmp_path_factory):
    """A folder in the official layout: 8 training questions and 4 dev questions of the shared file."""
    folder = tmp_path_factory.mktemp("squad")
    write_squad_json(folder / "train-v1.1.json", questions[:8])
    write_squad_json(folder / "dev-v1.1.json", questions[8:])
    return folder


@pytest.fixture(scope="module")
def models(questions, tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    texts = [SquadTextToText.source(e) for e in questions] * 2
    yield {style: save_family_model(tmp_path_factory.mktemp(style), style, texts, positions=160)
           for style in ("t5", "bart")}
    torch.set_num_threads(threads)


@pytest.mark.parametrize("style", ["t5", "bart"])
def test_squad_generates_answers_end_to_end(squad, questions, models, tmp_path, style):
    out = tmp_path / "run"
    result = finetune(FinetuneConfig.from_dict({
        "model": str(models[style]), "task": {"name": "squad", "data": str(squad), "max_length": 128, "epochs": 1},
        "optim": {"batch_size": 4, "lr": 1e-3}, "run": {"output_dir": str(out), "progress": False},
        "speed": {"threads": 1, "prefetch": 0}}))
    assert result.steps == 2 and set(result.dev_metrics) == {"f1", "exact_match"}
    answers = json.loads((out / "dev_predictions.json").read_text())
    assert list(answers) == [e.id for e in questions[8:]] and all(isinstance(a, str) for a in answers.values())
    # dev_metrics.json is the official scoring of the written answers.
    assert result.dev_metrics == evaluate_files("squad", out / "dev_predictions.json", gold=squad / "dev-v1.1.json")
    # `bertology predict` generates the same answers from the saved model.
    assert main(["predict", "--model", str(out / "model"), "--task", "squad", "--input", str(squad / "dev-v1.1.json"),
                 "--output", str(tmp_path / "answers.json"), "--max-length", "128"]) == 0
    assert json.loads((tmp_path / "answers.json").read_text()) == answers


def test_inputs_targets_and_the_official_scores_of_hand_made_answers(questions, models, tmp_path):
    t5 = load(models["t5"])
    task = get_task("squad").for_model(t5.model)
    assert isinstance(task, SquadTextToText)
    dev = questions[:4]
    assert dev[0].question == "Which NFL team represented the AFC at Super Bowl 50?"
    assert task.source(dev[0]) == f"question: {dev[0].question} context: {dev[0].context}"
    encoded = task.encode(t5.tokenizer, dev, 64, train=False)
    batch = next(encoded.batches(0, 4, drop_last=False))
    row = batch.example_ids.tolist().index(0)
    target = batch.lm_labels[batch.masked_positions[:, 0] == row]
    assert t5.tokenizer.decode(target) == "Denver Broncos" == dev[0].answers[0].text
    assert target[-1] == t5.tokenizer.framing.sep_id  # the target ends with </s>
    # Gold: [Denver Broncos], [Carolina Panthers], [Santa Clara, California | Levi's Stadium | Levi's Stadium in the
    # San Francisco Bay Area at Santa Clara, California.], [Denver Broncos].
    predictions = ["the Denver Broncos.",  # EM 1 (the article and the full stop normalised away)
                   "Carolina",  # F1: P 1, R 1/2 -> 2/3
                   "Levi's Stadium in Santa Clara",  # best F1 against the long answer: P 5/5, R 5/11 -> 5/8
                   "nothing"]  # 0
    expected = {"exact_match": 25.0, "f1": 100 * (1 + 2 / 3 + 5 / 8) / 4}
    assert task.scores(predictions, dev) == pytest.approx(expected)
    task.write(tmp_path / "dev_predictions.json", predictions, dev)
    write_squad_json(tmp_path / "gold.json", dev)  # the official script's input: these four questions
    assert evaluate_files("squad", tmp_path / "dev_predictions.json", gold=tmp_path / "gold.json") == \
        pytest.approx(expected)
