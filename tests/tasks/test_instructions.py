"""Instruction-format multi-task fine-tuning (bertology.tasks.instructions): templates rendered per example by a
keyed draw, examples-proportional mixing with a cap (rates within binomial standard deviations), the loss on the
target only (a decoder's prompt labelled -100, token for token against transformers' loss; an encoder-decoder's
decoder side), the held-out family never trained on, scoring from generated text, a short run end to end on tiny
random GPT-2 and T5, and the errors of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertology.errors import ConfigError, DataError
from bertology.model import load
from bertology.recipes.finetune import FinetuneConfig, finetune
from bertology.tasks.instructions import (InstructionExample, Mixture, PromptResponses, entities_text,
                                          mixing_rates, read_entities, template_fields)
from bertology.tasks.lookup import get_task
from bertology.tasks.text_to_text import TargetCrossEntropy, TextPairs, lm_head
from finetune_helpers import save_family_model

pytestmark = pytest.mark.usefixtures("one_thread")

GOOD, BAD, FILL = ["good", "great", "nice"], ["bad", "awful", "dull"], ["the", "film", "plot", "was", "very", "a"]

TEMPLATES = """\
sst2:
  - name: review
    prompt: "Review: {sentence}\\nIs this review positive or negative? OPTIONS: {options}\\nAnswer:"
  - name: feel
    prompt: "{sentence}\\nHow does the writer feel? {options}"
    target: "{answer}"
rte:
  - name: entail
    prompt: "{sentence1}\\nDoes this mean that {sentence2}? OPTIONS: {options}"
  - name: true-false
    prompt: "Premise: {sentence1} Hypothesis: {sentence2} ({options})"
notes:
  - name: plain
    prompt: "{instruction}\\n{input}"
"""


def sentence(rng, positive: bool) -> str:
    words = list(rng.choice(FILL, 4))
    words.insert(2, str(rng.choice(GOOD if positive else BAD)))
    return " ".join(words)


def write_glue(root: Path, sizes=(("train", 40), ("dev", 12)), seed: int = 0) -> Path:
    """SST-2 and RTE folders of cue-word sentences."""
    rng = np.random.default_rng(seed)
    for task in ("SST-2", "RTE"):
        (root / task).mkdir(parents=True, exist_ok=True)
    for split, n in sizes:
        with open(root / "SST-2" / f"{split}.tsv", "w", encoding="utf-8") as f:
            f.write("sentence\tlabel\n" + "".join(f"{sentence(rng, i % 2 == 1)}\t{i % 2}\n" for i in range(n)))
        with open(root / "RTE" / f"{split}.tsv", "w", encoding="utf-8") as f:
            f.write("index\tsentence1\tsentence2\tlabel\n" + "".join(
                f"{i}\t{sentence(rng, i % 2 == 0)}\t{sentence(rng, i % 2 == 1)}\t"
                f"{['entailment', 'not_entailment'][i % 2]}\n" for i in range(n)))
    return root


def write_files(root: Path, body: str, templates: str = TEMPLATES) -> Path:
    (root / "templates.yaml").write_text(templates, encoding="utf-8")
    path = root / "instructions.yaml"
    path.write_text(body, encoding="utf-8")
    return path


MIXTURE = """\
instructions:
  templates: templates.yaml
  limit: 30
  seed: 3
  tasks:
    - {name: rte}
    - {name: notes, train: notes-train.jsonl, dev: notes-dev.jsonl}
  heldout:
    - {name: sst2}
"""


def write_notes(root: Path, train: int = 8, dev: int = 4) -> None:
    for split, n in (("train", train), ("dev", dev)):
        (root / f"notes-{split}.jsonl").write_text("".join(json.dumps(
            {"instruction": "Repeat the word.", "input": f"word{i}", "output": f"word{i}"}) + "\n"
            for i in range(n)), encoding="utf-8")


@pytest.fixture
def mixture(tmp_path):
    glue = write_glue(tmp_path / "glue")
    write_notes(tmp_path)
    return get_task(str(write_files(tmp_path, MIXTURE))), str(glue)


# ------------------------------------------------------------------------------------------------ templates
def test_templates_render_each_examples_fields_and_the_verbalised_answer(mixture):
    task, glue = mixture
    rows = [line.split("\t") for line in (Path(glue) / "RTE" / "dev.tsv").read_text().splitlines()[1:]]
    dev = task.read(task.path(glue, "dev"))
    rte = [e for e in dev if e.task == "rte"]
    assert len(rte) == 12 and {e.template for e in rte} == {"entail", "true-false"}
    for example, (_, first, second, label) in zip(rte, rows, strict=True):
        expected = {"entail": f"{first}\nDoes this mean that {second}? OPTIONS: entailment, not_entailment",
                    "true-false": f"Premise: {first} Hypothesis: {second} (entailment, not_entailment)"}
        assert example.prompt == expected[example.template]
        assert example.target == label
    notes = [e for e in dev if e.task == "notes"]
    assert [(e.prompt, e.target) for e in notes] == [(f"Repeat the word.\nword{i}", f"word{i}") for i in range(4)]
    sst2 = [e for e in dev if e.task == "sst2"]
    assert all(e.heldout for e in sst2) and {e.target for e in sst2} == {"negative", "positive"}


def test_the_template_of_an_example_is_a_keyed_draw_the_same_in_every_read(mixture):
    task, glue = mixture
    first = [e.template for e in task.read(task.path(glue, "train"))]
    again = [e.template for e in task.read(task.path(glue, "train"))]
    fewer = [e.template for e in task.read(task.path(glue, "train"), limit=10)]
    assert first == again
    assert fewer == [t for e, t in zip(task.read(task.path(glue, "train")), first) if int(e.id.split(":")[1]) < 10
                     and e.task == "rte"] + [t for e, t in zip(task.read(task.path(glue, "train")), first)
                                            if e.task == "notes"][:8]
    counts = {name: first[:40].count(name) for name in ("entail", "true-false")}
    assert min(counts.values()) >= 8  # both templates are used (40 draws of 1/2 each: sd 3.2)


def test_template_fields_are_parsed_and_a_field_with_a_format_is_refused():
    assert template_fields("Q: {question} {{literal}} C: {context}", "t") == ["question", "context"]
    with pytest.raises(ConfigError, match=r"t: field \{answer:>5\} is not a plain \{name\}"):
        template_fields("{answer:>5}", "t")
    with pytest.raises(ConfigError, match="t: not a template"):
        template_fields("{answer", "t")


def test_an_unknown_field_is_a_config_error_naming_the_file_the_template_and_the_field(tmp_path):
    write_glue(tmp_path / "glue")
    bad = TEMPLATES.replace("{sentence2}? OPTIONS", "{hypothesis}? OPTIONS")
    path = write_files(tmp_path, MIXTURE.replace("    - {name: notes, train: notes-train.jsonl, dev: "
                                                  "notes-dev.jsonl}\n", ""), bad)
    with pytest.raises(ConfigError) as error:
        get_task(str(path))
    message = str(error.value)
    assert str(tmp_path / "templates.yaml") in message and "template 'entail'" in message
    assert "unknown field {hypothesis} for task rte" in message and "{sentence2}" in message


@pytest.mark.parametrize("body, templates, expected", [
    (MIXTURE.replace("limit: 30", "limit: 0"), TEMPLATES, r"instructions.limit: must be >= 1"),
    (MIXTURE.replace("{name: sst2}", "{name: rte}"), TEMPLATES, r"task 'rte' is named twice"),
    (MIXTURE.replace("{name: rte}", "{name: mnli}"), TEMPLATES, r"'mnli' is not a task instruction tuning reads"),
    (MIXTURE.replace("limit: 30", "limit: 30\n  mixing: 2"), TEMPLATES, r"instructions.mixing: unknown key"),
    (MIXTURE, TEMPLATES.replace("sst2:", "sst-2:"), r"no templates for 'sst2' \(task sst2\)"),
    (MIXTURE, TEMPLATES.replace("    target: \"{answer}\"\n", "    answer: x\n"), r"feel.*|unknown key 'answer'"),
    (MIXTURE + "other: 1\n", TEMPLATES, r"holds the instructions section only"),
])
def test_bad_instruction_files_are_config_errors_naming_the_file_and_key(tmp_path, body, templates, expected):
    write_notes(tmp_path)
    path = write_files(tmp_path, body, templates)
    with pytest.raises(ConfigError, match=expected) as error:
        get_task(str(path))
    assert str(tmp_path) in str(error.value)


def test_a_task_without_data_and_a_bad_jsonl_record_are_errors_naming_where(tmp_path):
    write_glue(tmp_path / "glue")
    write_notes(tmp_path)
    task = get_task(str(write_files(tmp_path, MIXTURE)))
    with pytest.raises(ConfigError, match="task rte: no data folder"):
        task.read(task.path(None, "train"))
    (tmp_path / "notes-train.jsonl").write_text('{"instruction": "x", "output": "y"}\n{"instruction": "x"}\n')
    with pytest.raises(DataError, match=r"notes-train.jsonl:2: 'output': a non-empty string is required"):
        task.read(task.path(str(tmp_path / "glue"), "train"))
    with pytest.raises(ConfigError, match=r"an instruction task reads the tasks its file names, not .*dev.tsv"):
        task.read(tmp_path / "glue" / "RTE" / "dev.tsv")


# ------------------------------------------------------------------------------------------------ mixing
def test_mixing_rates_are_examples_proportional_with_the_cap():
    rates = mixing_rates([10, 1000, 5000], limit=500)
    assert np.allclose(rates, np.array([10, 500, 500]) / 1010, rtol=0, atol=1e-15)
    assert np.allclose(mixing_rates([10, 20], limit=10 ** 6), [1 / 3, 2 / 3], rtol=0, atol=1e-15)


class Lengths:
    """A stand-in for encoded examples: their lengths only (the mixture draws indices)."""

    def __init__(self, count: int) -> None:
        self.lengths = np.ones(count, dtype=np.int64)

    def collate(self, rows):
        return rows


def test_an_epoch_draws_each_task_at_its_rate_within_binomial_deviations():
    sizes, limit = (50, 400, 3000), 1000
    tasks = np.repeat(np.arange(3), sizes)
    mixture = Mixture(Lengths(len(tasks)), tasks, limit, seed=0)
    total = 50 + 400 + 1000
    assert mixture.epoch_size == total
    expected = mixture.rates * total
    sd = np.sqrt(total * mixture.rates * (1 - mixture.rates))
    for epoch in range(3):
        drawn = mixture.draw(epoch)
        counts = np.bincount(tasks[drawn], minlength=3)
        assert np.all(np.abs(counts - expected) <= 4 * sd), (epoch, counts, expected, sd)
        # a task never repeats an example before it has shown them all
        for m, size in enumerate(sizes):
            shown = drawn[tasks[drawn] == m]
            assert len(np.unique(shown[:size])) == min(size, len(shown))
    assert not np.array_equal(mixture.draw(0), mixture.draw(1))
    assert np.array_equal(mixture.draw(2), Mixture(Lengths(len(tasks)), tasks, limit, seed=0).draw(2))
    batches = list(mixture.batches(0, 32))
    assert len(batches) == mixture.num_batches(0, 32) == total // 32
    assert sorted(np.concatenate(batches).tolist()) == sorted(mixture.draw(0)[:total // 32 * 32].tolist())


def test_the_held_out_family_is_never_read_for_training_nor_drawn(tmp_path):
    glue = write_glue(tmp_path / "glue")
    (glue / "SST-2" / "train.tsv").unlink()  # held out: its training file is never read
    write_notes(tmp_path)
    task = get_task(str(write_files(tmp_path, MIXTURE)))
    train = task.read(task.path(str(glue), "train"))
    assert {e.task for e in train} == {"rte", "notes"} and not any(e.heldout for e in train)
    gpt2 = save_family_model(tmp_path / "gpt2", "gpt2", [e.prompt + " " + e.target for e in train])
    pretrained = load(gpt2)
    bound = task.for_model(pretrained.model)
    source = bound.encode(pretrained.tokenizer, train, 64, train=True, seed=0)
    seen = {train[i].task for epoch in range(4) for rows in source._order(epoch, 4, 0, 1, False) for i in rows}
    assert seen == {"rte", "notes"}
    dev = task.read(task.path(str(glue), "dev"))
    assert {e.task for e in dev if e.heldout} == {"sst2"}


# ------------------------------------------------------------------------------------------------ the loss
def examples_of(prompts, targets):
    return [InstructionExample(str(i), "t", "x", p, t, None) for i, (p, t) in enumerate(zip(prompts, targets))]


PROMPTS = ["Review: the film was good\nAnswer:", "Is the plot dull? OPTIONS: yes, no", "very"]
TARGETS = ["positive", "yes", "the film was a very nice plot"]


def test_a_decoders_loss_is_on_the_response_tokens_only_token_for_token(tmp_path):
    transformers = pytest.importorskip("transformers")
    gpt2 = save_family_model(tmp_path / "gpt2", "gpt2", [p + " " + t for p, t in zip(PROMPTS, TARGETS)] * 3)
    pretrained = load(gpt2)
    tokenizer, eos = pretrained.tokenizer, pretrained.model.config.eos_token_id
    encoded = PromptResponses(tokenizer, PROMPTS, TARGETS, max_length=64, eos_id=eos, max_new_tokens=8,
                              shuffle=False)
    batch = encoded.collate(np.arange(3))
    for row, (prompt, target) in enumerate(zip(PROMPTS, TARGETS)):
        prompt_ids = tokenizer.encode(prompt).ids
        response_ids = tokenizer.encode(" " + target, add_special_tokens=False).ids + [eos]
        length = len(prompt_ids) + len(response_ids)
        assert batch.input_ids[row, :length].tolist() == prompt_ids + response_ids
        assert batch.labels[row].tolist() == [-100] * len(prompt_ids) + response_ids + \
            [-100] * (batch.input_ids.shape[1] - length)
        predicted = [(int(c), int(t)) for (r, c), t in zip(batch.masked_positions.tolist(), batch.lm_labels.tolist())
                     if r == row]
        assert predicted == [(len(prompt_ids) - 1 + k, token) for k, token in enumerate(response_ids)]
    # the objective's loss is transformers' loss of the same labels (the prompt and padding -100)
    model = pretrained.model.eval()
    head = lm_head(model.config)
    objective = TargetCrossEntropy(head)
    from bertology.objectives.base import Passes

    with torch.no_grad():
        ours = objective(Passes(model, batch, None), batch)
        hf = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "gpt2" / "hf")).eval()
        reference = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=batch.labels).loss
    units = int((batch.labels[:, 1:] != -100).sum())
    assert int(objective.units(batch)) == units == sum(len(tokenizer.encode(" " + t, add_special_tokens=False).ids)
                                                       + 1 for t in TARGETS)
    assert float(ours.loss_sum) / units == pytest.approx(float(reference), rel=1e-5)


def test_an_encoder_decoders_loss_is_on_its_decoder_side_the_target_and_its_eos(tmp_path):
    transformers = pytest.importorskip("transformers")
    t5 = save_family_model(tmp_path / "t5", "t5", [p + " " + t for p, t in zip(PROMPTS, TARGETS)] * 3)
    pretrained = load(t5)
    tokenizer = pretrained.tokenizer
    start = pretrained.model.config.decoder_start_token_id
    encoded = TextPairs(tokenizer, PROMPTS, TARGETS, max_length=64, start_id=start, max_new_tokens=8, shuffle=False)
    batch = encoded.collate(np.arange(3))
    for row, (prompt, target) in enumerate(zip(PROMPTS, TARGETS)):
        assert batch.input_ids[row][batch.attention_mask[row].bool()].tolist() == tokenizer.encode(prompt).ids
        target_ids = tokenizer.encode(target).ids
        assert target_ids[-1] == tokenizer.framing.sep_id  # </s>
        assert [t for (r, _), t in zip(batch.masked_positions.tolist(), batch.lm_labels.tolist()) if r == row] == \
            target_ids
    labels = torch.full(batch.decoder_input_ids.shape, -100)
    labels[batch.masked_positions[:, 0], batch.masked_positions[:, 1]] = batch.lm_labels
    model = pretrained.model.eval()
    objective = TargetCrossEntropy(lm_head(model.config))
    from bertology.objectives.base import Passes

    with torch.no_grad():
        ours = objective(Passes(model, batch, None), batch)
        hf = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path / "t5" / "hf")).eval()
        reference = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels).loss
    assert float(ours.loss_sum) / int(objective.units(batch)) == pytest.approx(float(reference), rel=1e-5)


# ------------------------------------------------------------------------------------------------ scoring
def test_generated_entities_are_read_back_as_tags_and_scored_by_conlleval(data_dir):
    from bertology.tasks.instructions import ConllSource

    source = ConllSource()
    sentences = source.read(source.path(str(data_dir / "conll2003"), "dev"), 50)
    answers = [entities_text(s) for s in sentences]
    assert answers[:2] == ["CRICKET: MISC; LEICESTERSHIRE: ORG", "LONDON: LOC"] or all(answers)
    assert [read_entities(a, s.words, source.types) for a, s in zip(answers, sentences)] == \
        [s.tags for s in sentences]
    assert source.scores(answers, sentences)["f1"] == pytest.approx(100.0)
    assert source.scores(["none"] * len(sentences), sentences)["f1"] == 0.0


def test_classification_is_scored_from_the_generated_label_word(mixture):
    task, glue = mixture
    dev = task.read(task.path(glue, "dev"))
    exact = [e.target for e in dev]
    scores = task.scores(exact, dev)
    assert scores["rte_accuracy"] == scores["heldout_sst2_accuracy"] == scores["notes_exact_match"] == 100.0
    flipped = [{"positive": "negative", "negative": "positive"}.get(e.target, e.target) if e.task == "sst2"
               else e.target + "\nmore text" for e in dev]  # a decoder's second line is not read
    scores = task.scores(flipped, dev)
    assert scores["heldout_sst2_accuracy"] == 0.0 and scores["rte_accuracy"] == 100.0
    assert scores["mixture_mean"] == pytest.approx(100.0)


# ------------------------------------------------------------------------------------------------ end to end
@pytest.mark.parametrize("style", ["gpt2", "t5"])
def test_instruction_tuning_runs_end_to_end_and_scores_every_task(tmp_path, style):
    glue = write_glue(tmp_path / "glue")
    write_notes(tmp_path)
    path = write_files(tmp_path, MIXTURE)
    texts = [line for f in (glue / "RTE" / "train.tsv", glue / "SST-2" / "dev.tsv") for line in f.read_text().split("\n")]
    model = save_family_model(tmp_path / style, style, texts + [TEMPLATES] * 2, positions=128)
    out = tmp_path / "run"
    result = finetune(FinetuneConfig.from_dict({
        "model": str(model), "task": {"name": str(path), "data": str(glue), "epochs": 1, "max_length": 96},
        "optim": {"batch_size": 8, "lr": 1e-3}, "run": {"output_dir": str(out), "progress": False},
        "speed": {"threads": 1, "prefetch": 0}}))
    assert result.steps == (30 + 8) // 8
    assert set(result.dev_metrics) == {"mixture_mean", "rte_accuracy", "notes_exact_match", "notes_f1",
                                       "heldout_sst2_accuracy"}
    records = [json.loads(line) for line in (out / "dev_predictions.jsonl").read_text().splitlines()]
    assert [r["task"] for r in records] == ["rte"] * 12 + ["notes"] * 4 + ["sst2"] * 12
    assert result.dev_metrics == pytest.approx(result.best["scores"])
    reloaded = load(out / "model")
    assert lm_head(reloaded.model.config).name in reloaded.model.heads


def test_a_decoder_without_an_eos_id_ends_its_responses_with_the_tokenizers_end_of_text(mixture, tmp_path):
    task, glue = mixture
    gpt2 = save_family_model(tmp_path / "gpt2", "gpt2", PROMPTS + TARGETS)
    pretrained = load(gpt2)
    pretrained.model.config.eos_token_id = None  # as bertology's own GPT-2 pretraining leaves it
    bound = task.for_model(pretrained.model)
    tokenizer = pretrained.tokenizer
    end = tokenizer.token_to_id("<|endoftext|>")
    assert bound.end_id(tokenizer) == end == tokenizer.pad_id
    examples = task.read(task.path(glue, "dev"), limit=2)
    source = bound.encode(tokenizer, examples, 96, train=False)
    batch = source.inner.collate(np.arange(len(examples)))
    for row, example in enumerate(examples):
        response = [t for t in batch.labels[row].tolist() if t != -100]
        assert response == tokenizer.encode(" " + example.target, add_special_tokens=False).ids + [end]


def test_the_shipped_instructions_file_and_its_templates_load():
    from bertology.tasks.instructions import load_instructions

    configs = Path(__file__).resolve().parents[2] / "configs"
    task = load_instructions(configs / "instructions-example.yaml")
    assert task.mixture == ["cola", "mrpc", "rte"] and task.heldout == ["sst2"]
    assert all(len(task.templates[name]) >= 2 for name in [*task.mixture, *task.heldout])  # several templates each
