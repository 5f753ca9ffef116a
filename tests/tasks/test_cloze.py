"""Cloze-prompt classification: label scores are the masked-LM logits of the verbaliser words at the mask,
zero-shot with a pretrained head, few-shot fine-tuning through the recipe, and the template and verbaliser errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertology.errors import ConfigError
from bertology.model import EncoderModel, Pretrained, load, preset
from bertology.model.encoder import HeadSpec
from bertology.recipes.finetune import FinetuneConfig, build_model, finetune
from bertology.tasks.lookup import get_task
from bertology.tasks.cloze import ClozeTask, cloze_scores, zero_shot
from bertology.tasks.examples import TextExample
from bertology.tasks.glue import GlueFinetuneTask
from bertology.tasks.readers import GLUE_TASKS
from bertology.tokenization import train_tokenizer

GOOD, BAD = ["good", "nice"], ["bad", "awful"]
FILL = ["the", "film", "plot", "was", "very", "a", "it", "is"]
ANSWERS = ["great", "terrible", "yes", "no", "It", "?", ",", "."]


def _sentence(rng: np.random.Generator, positive: bool) -> str:
    words = list(rng.choice(FILL, int(rng.integers(2, 6))))
    words.insert(int(rng.integers(len(words) + 1)), str(rng.choice(GOOD if positive else BAD)))
    return " ".join(words)


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(iter(GOOD + BAD + FILL + ANSWERS), "wordpiece", 120, show_progress=False,
                           min_frequency=1)


@pytest.fixture(scope="module")
def glue(tmp_path_factory):
    root = tmp_path_factory.mktemp("glue")
    rng = np.random.default_rng(0)
    (root / "SST-2").mkdir()
    (root / "RTE").mkdir()
    for split, n in (("train", 64), ("dev", 48)):
        rows = [(_sentence(rng, bool(label)), label) for label in rng.integers(0, 2, n)]
        (root / "SST-2" / f"{split}.tsv").write_text(
            "sentence\tlabel\n" + "".join(f"{s}\t{label}\n" for s, label in rows), encoding="utf-8")
        gold = ["not_entailment", "entailment"]
        pairs = [f"{i}\t{_sentence(rng, True)}\t{_sentence(rng, False)}\t{gold[i % 2]}\n" for i in range(n)]
        (root / "RTE" / f"{split}.tsv").write_text("index\tsentence1\tsentence2\tlabel\n" + "".join(pairs),
                                                   encoding="utf-8")
    return root


def _config(tokenizer, layers=2):
    return preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=layers, hidden_size=32, num_heads=2,
                  intermediate_size=64, max_position_embeddings=64)


def _random_model(tokenizer, seed=0):
    model = EncoderModel(_config(tokenizer), [HeadSpec("mlm", "masked_lm")])
    model.init_weights(torch.Generator().manual_seed(seed))
    return model


@pytest.mark.parametrize("name", ["sst2-cloze", "rte-cloze"])
def test_score_is_the_mlm_logit_of_the_verbaliser_token_at_the_mask(name, tokenizer, glue):
    task = get_task(name)
    model = _random_model(tokenizer)
    examples = task.read(task.path(str(glue), "dev"), 7)
    encoded = task.encode(tokenizer, examples, 64, train=False)
    scores = cloze_scores(model, encoded, batch_size=3)
    word_ids = [tokenizer.token_to_id(w) for w in task.words]
    model.eval()
    for row, example in enumerate(examples):
        text = f"{example.text} It was {tokenizer.mask_token} ." if name == "sst2-cloze" \
            else f"{example.text} ? {tokenizer.mask_token} , {example.text_pair}"
        encoding = tokenizer.encode(text)
        ids = torch.tensor([encoding.ids])
        column = encoding.ids.index(tokenizer.mask_id)
        with torch.no_grad():
            logits = model(ids, torch.ones_like(ids), torch.zeros_like(ids)).head_logits["mlm"]  # every position
        expected = logits[0, column, word_ids].numpy()
        np.testing.assert_allclose(scores[row], expected, rtol=1e-5, atol=1e-5)
    assert task.predict(model, encoded, examples, 4) == [task.label_names()[i] for i in scores.argmax(1)]


def test_a_long_example_is_shortened_and_keeps_its_mask(tokenizer):
    task = get_task("rte-cloze")
    examples = [TextExample("0", " ".join(["film"] * 80), " ".join(["plot"] * 10), "entailment")]
    encoded = task.encode(tokenizer, examples, 24, train=False)
    batch = next(encoded.batches(0, 1, drop_last=False))
    assert batch.input_ids.shape[1] <= 24
    row, column = batch.masked_positions[0].tolist()
    assert batch.input_ids[row, column] == tokenizer.mask_id
    assert tokenizer.token_to_id("plot") in batch.input_ids[0].tolist()  # the shorter field survives


def _hand_set_model(tokenizer) -> EncoderModel:
    """One layer with uniform attention and no feed-forward: the mask's state is the normalised sum of the cue
    word's embedding direction; the tied decoder gives 'great' the direction of 'good'/'nice' and 'terrible' that
    of 'bad'/'awful'."""
    model = EncoderModel(_config(tokenizer, layers=1), [HeadSpec("mlm", "masked_lm")])
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.fill_(1.0)
        layer = model.encoder.layers[0]
        layer.value.weight.copy_(torch.eye(32))
        layer.attn_out.weight.copy_(torch.eye(32))
        model.heads["mlm"].dense.weight.copy_(torch.eye(32))
        word = model.encoder.embeddings.word.weight
        for words, dim in ((GOOD + ["great"], 0), (BAD + ["terrible"], 1)):
            for w in words:
                word[tokenizer.token_to_id(w), dim] = 1.0
    return model


def test_zero_shot_uses_the_pretrained_mlm_head_as_it_is(tokenizer, glue, tmp_path):
    Pretrained(_hand_set_model(tokenizer), tokenizer).save(tmp_path / "model")
    assert zero_shot(tmp_path / "model", "sst2-cloze", str(glue)) == {"accuracy": 100.0}
    flipped = ClozeTask(GlueFinetuneTask(GLUE_TASKS["sst2"]), "{text} It was [MASK] .",
                        {"great": 0, "terrible": 1}, name="sst2-flipped")
    assert zero_shot(tmp_path / "model", flipped, str(glue), limit=20) == {"accuracy": 0.0}
    Pretrained(EncoderModel(_config(tokenizer)), tokenizer).save(tmp_path / "bare")
    with pytest.raises(Exception, match="masked-LM head"):
        zero_shot(tmp_path / "bare", "sst2-cloze", str(glue))


def test_the_recipe_keeps_the_pretrained_mlm_head(tokenizer, tmp_path):
    Pretrained(_hand_set_model(tokenizer), tokenizer).save(tmp_path / "model")
    pretrained = load(tmp_path / "model")
    model, _ = build_model(pretrained, get_task("sst2-cloze"), seed=1)
    for key, value in pretrained.model.heads["mlm"].state_dict().items():
        assert torch.equal(model.heads["mlm"].state_dict()[key], value), key


def test_few_shot_finetuning_improves_accuracy(tokenizer, glue, tmp_path):
    Pretrained(_random_model(tokenizer, seed=3), tokenizer).save(tmp_path / "model")
    before = zero_shot(tmp_path / "model", "sst2-cloze", str(glue))["accuracy"]
    config = FinetuneConfig.from_dict({
        "model": str(tmp_path / "model"),
        "task": {"name": "sst2-cloze", "data": str(glue), "epochs": 15, "limit_train": 32},
        "optim": {"batch_size": 8, "lr": 3e-3, "warmup_ratio": 0.1},
        "run": {"output_dir": str(tmp_path / "run"), "log_every": 10, "progress": False},
        "speed": {"threads": 1, "prefetch": 0}})
    result = finetune(config)
    after = result.dev_metrics["accuracy"]
    print(f"few-shot: dev accuracy {before:.1f} zero-shot -> {after:.1f} after 32 examples")
    assert after >= 90 and after > before + 20, (before, after)
    assert zero_shot(result.model_dir, "sst2-cloze", str(glue))["accuracy"] == after  # the saved model's head
    lines = (tmp_path / "run" / "dev_predictions.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 49
    assert {line.split("\t")[1] for line in lines[1:]} <= {"0", "1"}


def test_errors_name_the_word_and_the_template(tokenizer):
    sst2 = GlueFinetuneTask(GLUE_TASKS["sst2"])
    task = ClozeTask(sst2, "{text} It was [MASK] .", {"greatest": "1", "terrible": "0"})
    with pytest.raises(ConfigError, match=r"'greatest' is not a single token.*\['great', '##e', '##s', '##t'\]"):
        task.label_token_ids(tokenizer)
    with pytest.raises(ConfigError, match="mask slot"):
        ClozeTask(sst2, "{text} It was great .", {"great": "1", "terrible": "0"})
    with pytest.raises(ConfigError, match=r"\{text\}"):
        ClozeTask(sst2, "It was [MASK] .", {"great": "1", "terrible": "0"})
    with pytest.raises(ConfigError, match="text_pair"):
        ClozeTask(GlueFinetuneTask(GLUE_TASKS["rte"]), "{text} ? [MASK]", {"yes": "entailment", "no": "not_entailment"})
    with pytest.raises(ConfigError, match="one word per label"):
        ClozeTask(sst2, "{text} It was [MASK] .", {"great": "1", "good": "1", "terrible": "0"})
    with pytest.raises(ConfigError, match="not sst2's labels"):
        ClozeTask(sst2, "{text} It was [MASK] .", {"great": "pos", "terrible": "0"})
    with pytest.raises(ConfigError, match="regression"):
        ClozeTask(GlueFinetuneTask(GLUE_TASKS["stsb"]), "{text} [MASK] {text_pair}", {"yes": "1"})
