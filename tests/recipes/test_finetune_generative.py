"""Fine-tuning GPT-2, BART and T5 through the existing tasks on tiny random models built by transformers: SST-2
with GPT-2's last-token and BART's and T5's EOS classifiers (transformers loads the result and gives the same logits
on a padded batch), SST-2 as text-to-text on T5 (generated labels; an unknown generated text counts as wrong) and,
with `task.text_to_text`, on BART; NER on GPT-2 and on BART's encoder."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertology.cli.main import main
from bertology.errors import ConfigError, DataError
from bertology.model import load
from bertology.model.heads import HeadSpec
from bertology.recipes.finetune import FinetuneConfig, finetune
from bertology.tasks.lookup import get_task
from bertology.tasks.examples import TextExample
from bertology.tasks.metrics import evaluate_files
from bertology.tasks.text_to_text import GlueTextToText, score_text, read_score
from finetune_helpers import BAD, FILL, GOOD, cue_sentence, name_conll, save_family_model

transformers = pytest.importorskip("transformers")

WORDS = GOOD + BAD + FILL + ["positive", "negative", "sst2", "sentence:", "john", "mary", "paris", "london", "met",
                             "went", "to", "in"]
TEXTS = [" ".join(WORDS)] * 5 + [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def glue(tmp_path_factory):
    root = tmp_path_factory.mktemp("glue")
    rng = np.random.default_rng(0)
    (root / "SST-2").mkdir()
    for split, n in (("train", 160), ("dev", 32)):
        rows = [(cue_sentence(rng, label), label) for label in rng.integers(0, 2, n)]
        (root / "SST-2" / f"{split}.tsv").write_text(
            "sentence\tlabel\n" + "".join(f"{s} \t{label}\n" for s, label in rows), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def conll(tmp_path_factory):
    """Sentences of filler words with one name: john and mary are people, paris and london places."""
    return name_conll(tmp_path_factory.mktemp("conll"), words=4)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return {style: save_family_model(tmp_path_factory.mktemp(style), style, TEXTS) for style in ("gpt2", "bart", "t5")}


def config(data, model, out, task="sst2", epochs=6, lr=3e-3, strategy="full", text_to_text=None):
    return FinetuneConfig.from_dict({
        "model": str(model), "task": {"name": task, "data": str(data), "epochs": epochs,
                                      "text_to_text": text_to_text},
        "strategy": {"kind": strategy},
        "optim": {"batch_size": 16, "lr": lr, "warmup_ratio": 0.1},
        "run": {"output_dir": str(out), "log_every": 10, "progress": False},
        "speed": {"threads": 1, "prefetch": 0}})


@pytest.mark.parametrize("style, architecture", [("gpt2", "GPT2ForSequenceClassification"),
                                                 ("bart", "BartForSequenceClassification"),
                                                 ("t5", "T5ForSequenceClassification")])
def test_classifier_learns_and_transformers_gives_the_same_logits(glue, models, tmp_path, style, architecture):
    out = tmp_path / "run"
    # T5 fine-tunes GLUE as text-to-text unless told otherwise; its classifier is BART's, on the decoder
    result = finetune(config(glue, models[style], out, text_to_text=False if style == "t5" else None))
    assert result.best["value"] > 80  # the cue word decides the label
    assert result.dev_metrics == evaluate_files("sst2", out / "dev_predictions.tsv", gold=glue / "SST-2" / "dev.tsv")
    saved = json.loads((out / "model" / "config.json").read_text())
    assert saved["architectures"] == [architecture]
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(out / "model").eval()
    ours = load(out / "model")
    rows = [e.ids for e in ours.tokenizer.encode_batch(["the film was good", "bad", "a very dull plot"]).encodings]
    width = max(map(len, rows))  # padded on the right: GPT-2 reads the last real token, BART the last EOS
    ids = torch.tensor([row + [ours.tokenizer.pad_id] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    with torch.no_grad():
        torch.testing.assert_close(ours.model(ids, mask).logits, hf(input_ids=ids, attention_mask=mask).logits,
                                   atol=1e-5, rtol=1e-5)


def test_t5_sst2_is_text_to_text(glue, models, tmp_path):
    out = tmp_path / "run"
    result = finetune(config(glue, models["t5"], out, epochs=12, lr=1e-2))
    # What text-to-text means: every generated text is a label word (written as its label, an unknown text as itself),
    # the decoder's cross-entropy of the label words falls, and the label follows the input. The bound was 60 while the
    # Unigram vocabulary (and so the random T5 built on it) changed between processes: 68.75 to 100 over 21 runs
    # after 8 epochs, 68.75 once in a clean-clone CI run at 12. finetune_helpers now trains it with bertology's own
    # trainer, the same in every process (tokenization/training.py's _rescore_unigram); at 12 epochs seeds 0-4 then
    # all gave 100 (seed 0 in two processes). 80 (26 of 32) leaves room for other CPUs' rounding and stays far above
    # the dev set's majority label (53.1 %), which a model that ignores its input cannot pass.
    predictions = (out / "dev_predictions.tsv").read_text().splitlines()
    assert predictions[0] == "index\tprediction\tgenerated" and len(predictions) == 33
    assert {line.split("\t")[1] for line in predictions[1:]} <= {"0", "1"}, predictions  # every one a label word
    assert result.best["value"] > 80, result.best
    assert result.dev_metrics == evaluate_files("sst2", out / "dev_predictions.tsv", gold=glue / "SST-2" / "dev.tsv",
                                                open_labels=True)
    saved = json.loads((out / "model" / "config.json").read_text())
    assert saved["architectures"] == ["T5ForConditionalGeneration"] and "id2label" not in saved
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["lm_loss"] for r in evals if r["kind"] == "eval"]
    assert losses[-1] < 0.25 * losses[0], losses  # the decoder's cross-entropy of the label words falls
    # `bertology predict` generates the same labels from the saved model.
    assert main(["predict", "--model", str(out / "model"), "--task", "sst2", "--input",
                 str(glue / "SST-2" / "dev.tsv"), "--output", str(tmp_path / "p.tsv")]) == 0
    assert (tmp_path / "p.tsv").read_text() == (out / "dev_predictions.tsv").read_text()


def test_text_to_text_formats_and_unknown_generations_count_as_wrong(models, tmp_path, capsys):
    t5 = load(models["t5"])
    task = get_task("sst2").for_model(t5.model)
    assert isinstance(task, GlueTextToText) and task.start_id == t5.model.config.decoder_start_token_id
    example = TextExample("0", "it was good", None, "1")
    assert (task.source(example), task.target(example)) == ("sst2 sentence: it was good", "positive")
    assert [task.prediction(t) for t in ("positive", "negative", "posit ive\tx")] == ["1", "0", "posit ive x"]
    examples = [TextExample(str(i), "x", None, label) for i, label in enumerate("1100")]
    assert task.scores(["1", "posi", "0", ""], examples) == {"accuracy": 50.0}
    gold = tmp_path / "dev.tsv"
    gold.write_text("sentence\tlabel\n" + "".join(f"x\t{e.label}\n" for e in examples), encoding="utf-8")
    task.write(tmp_path / "p.tsv", ["1", "posi", "0", ""], examples)
    # The generated text in a third column; the prediction empty where it is no label: evaluate counts it wrong.
    assert (tmp_path / "p.tsv").read_text().splitlines() == [
        "index\tprediction\tgenerated", "0\t1\tpositive", "1\t\tposi", "2\t0\tnegative", "3\t\t"]
    assert evaluate_files("sst2", tmp_path / "p.tsv", gold) == {"accuracy": 50.0}
    assert main(["evaluate", "--task", "sst2", "--gold", str(gold), "--predictions", str(tmp_path / "p.tsv")]) == 0
    assert json.loads(capsys.readouterr().out) == {"accuracy": 50.0}
    (tmp_path / "p.tsv").write_text("index\tprediction\tgenerated\n0\tposi\tposi\n1\t1\tx\n2\t0\tx\n3\t0\tx\n")
    with pytest.raises(DataError, match=r"p.tsv:2: label 'posi' is not one of 0, 1"):  # a filled prediction: a label
        evaluate_files("sst2", tmp_path / "p.tsv", gold)
    # A two-column file of free texts (GLUE's own format) is scored with open labels only.
    (tmp_path / "p2.tsv").write_text("index\tprediction\n0\t1\n1\tposi\n2\t0\n3\t\n")
    with pytest.raises(DataError, match=r"p2.tsv:3: label 'posi' is not one of 0, 1"):
        evaluate_files("sst2", tmp_path / "p2.tsv", gold)
    assert main(["evaluate", "--task", "sst2", "--gold", str(gold), "--predictions", str(tmp_path / "p2.tsv"),
                 "--open-labels"]) == 0
    assert json.loads(capsys.readouterr().out) == {"accuracy": 50.0}
    # STS-B: scores rounded to 0.2 as targets; a text that is not a number reads as -1 (T5's convention).
    assert [score_text(v) for v in (3.79, 0.0, 4.91)] == ["3.8", "0.0", "5.0"]
    assert [read_score(t) for t in ("3.8", "nan", "high")] == [3.8, -1.0, -1.0]
    stsb = GlueTextToText(get_task("stsb"), 0)
    pair = TextExample("0", "a cat", "a dog", 3.79)
    assert (stsb.source(pair), stsb.target(pair)) == ("stsb sentence1: a cat sentence2: a dog", "3.8")
    assert [stsb.prediction(t) for t in ("3.8", "high")] == [3.8, -1.0]
    rte = GlueTextToText(get_task("rte"), 0)
    assert rte.target(TextExample("0", "a", "b", "not_entailment")) == "not_entailment"
    assert rte.prediction("entailment") == "entailment"
    encoded = task.encode(t5.tokenizer, examples, 32, train=True)
    batch = next(encoded.batches(0, 4))
    target = t5.tokenizer.encode("positive").ids  # the label word then </s>
    row = batch.example_ids.tolist().index(0)
    assert batch.decoder_input_ids[row, :len(target)].tolist() == [task.start_id] + target[:-1]
    assert batch.lm_labels.numel() == batch.decoder_attention_mask.sum()
    # A decoder (GPT-2) keeps its own classifier: the GLUE task itself.
    assert get_task("sst2").for_model(load(models["gpt2"]).model) is get_task("sst2")


def test_text_to_text_or_the_classifier_is_chosen(models, tmp_path):
    """`task.text_to_text` picks the form on an encoder-decoder; unset, T5 is text-to-text (its recipe) unless the
    model is a fine-tuned classifier already, BART a classifier; a task or a model without the other form says so."""
    from bertology.recipes.finetune import for_model

    sst2 = get_task("sst2")
    t5, bart, gpt2 = (load(models[style]).model for style in ("t5", "bart", "gpt2"))
    assert isinstance(for_model(sst2, t5), GlueTextToText) and for_model(sst2, t5, False) is sst2
    assert for_model(sst2, bart) is sst2 and isinstance(for_model(sst2, bart, True), GlueTextToText)
    classifier = type(t5)(t5.config, [HeadSpec("classifier", "eos_token", 2, "tanh")])
    assert for_model(sst2, classifier) is sst2  # predicting with a fine-tuned T5ForSequenceClassification
    assert isinstance(for_model(sst2, classifier, True), GlueTextToText)
    with pytest.raises(ConfigError, match=r"task.text_to_text: true generates the labels with an encoder-decoder "
                                          r"\(T5, BART\); this is a DecoderModel of the gpt2 family"):
        for_model(sst2, gpt2, True)
    assert for_model(sst2, gpt2, False) is sst2
    with pytest.raises(ConfigError, match="task.text_to_text: squad has one form only; the setting applies to the "
                                          "GLUE tasks"):
        for_model(get_task("squad"), t5, False)
    with pytest.raises(ConfigError, match=r"task.text_to_text: expected bool or null, got str 'yes'"):
        config(tmp_path, models["t5"], tmp_path / "run", text_to_text="yes")


def test_bart_sst2_as_text_to_text(glue, models, tmp_path):
    """BART generates the label words too when asked (`task.text_to_text: true`), written as its conditional
    generation model."""
    out = tmp_path / "run"
    result = finetune(config(glue, models["bart"], out, epochs=2, text_to_text=True))
    predictions = (out / "dev_predictions.tsv").read_text().splitlines()
    assert predictions[0] == "index\tprediction\tgenerated" and len(predictions) == 33
    assert result.dev_metrics == evaluate_files("sst2", out / "dev_predictions.tsv", gold=glue / "SST-2" / "dev.tsv",
                                                open_labels=True)
    assert json.loads((out / "model" / "config.json").read_text())["architectures"] == \
        ["BartForConditionalGeneration"]


@pytest.mark.parametrize("style", ["gpt2", "bart"])
def test_ner_on_gpt2_and_on_barts_encoder(conll, models, tmp_path, style):
    out = tmp_path / "run"
    result = finetune(config(conll, models[style], out, task="conll2003", epochs=10, lr=1e-2))
    assert result.best["value"] > 50, result.best  # the name decides its tag
    model = load(out / "model")
    assert type(model.model).__name__ == ("DecoderModel" if style == "gpt2" else "EncoderModel")
    if style == "gpt2":
        assert json.loads((out / "model" / "config.json").read_text())["architectures"] == \
            ["GPT2ForTokenClassification"]


LORA_TARGETS = {"gpt2": "[query, value, ffn_in]", "t5": "[query, value, cross_query, cross_value]"}


@pytest.mark.parametrize("style, architecture", [("gpt2", "GPT2ForSequenceClassification"),
                                                 ("t5", "T5ForConditionalGeneration"),
                                                 ("t5", "T5ForSequenceClassification")])
def test_lora_through_the_cli_and_peft_reads_the_adapter(glue, models, tmp_path, capsys, style, architecture):
    out = tmp_path / "run"
    classifier = architecture.endswith("ForSequenceClassification")  # T5's: its base model under `transformer.`
    assert main(["finetune", "--task", "sst2", "--model", str(models[style]), "--out", str(out), "--data", str(glue),
                 "--set", "strategy.kind=lora", "--set", "strategy.rank=4", "--set",
                 f"strategy.targets={LORA_TARGETS[style]}", "--set", "task.epochs=4", "--set", "optim.lr=1e-2",
                 "--set", "optim.batch_size=16", "--set", "run.progress=false", "--set", "speed.threads=1",
                 "--set", "speed.prefetch=0", "--set", f"task.text_to_text={'false' if classifier else 'null'}"]) == 0
    assert "fine-tuned 40 steps (trainable parameters: " in capsys.readouterr().err
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in evals if r["kind"] == "eval"]
    assert losses[-1] < losses[0]
    base, tuned = load(models[style]).model, load(out / "model").model
    assert set(tuned.extensions) and all(factory == "lora" for factory, _ in tuned.extensions.values())
    tuned_state = tuned.state_dict()
    for name, tensor in base.state_dict().items():  # the base weights as they were; only LoRA (and a new head) moved
        assert torch.equal(tuned_state[name], tensor), name
    # The peft adapter written beside the model gives our logits on transformers' model.
    peft = pytest.importorskip("peft")
    adapter = json.loads((out / "peft_adapter" / "adapter_config.json").read_text())
    assert adapter["task_type"] == ("SEQ_CLS" if classifier else "SEQ_2_SEQ_LM")
    hf = peft.PeftModel.from_pretrained(getattr(transformers, architecture).from_pretrained(models[style]),
                                        out / "peft_adapter").eval()
    ours = load(out / "model")
    rows = [e.ids for e in ours.tokenizer.encode_batch(["the film was good", "bad", "a very dull plot"]).encodings]
    width = max(map(len, rows))
    ids = torch.tensor([row + [ours.tokenizer.pad_id] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    args = {"input_ids": ids, "attention_mask": mask}
    if style == "t5" and not classifier:
        args["decoder_input_ids"] = torch.tensor([[0, 5, 7], [0, 9, 3], [0, 4, 4]])
    with torch.no_grad():
        torch.testing.assert_close(ours.model.eval()(**args).logits, hf(**args).logits, atol=1e-5, rtol=1e-5)


def test_strategies_that_do_not_apply_are_named(glue, models, tmp_path):
    with pytest.raises(ConfigError, match="strategy.targets: expected some of query, .*, got \\['cross_qury'\\]"):
        FinetuneConfig.from_dict({"model": str(models["gpt2"]), "task": {"name": "sst2", "data": str(glue)},
                                  "strategy": {"kind": "lora", "targets": ["cross_qury"]}})
    with pytest.raises(ConfigError, match="lora targets: this model's \\(chosen\\) blocks have no projection "
                                          "'cross_query'"):
        finetune(FinetuneConfig.from_dict({
            "model": str(models["gpt2"]), "task": {"name": "sst2", "data": str(glue), "epochs": 1},
            "strategy": {"kind": "lora", "targets": ["cross_query"]},
            "run": {"output_dir": str(tmp_path / "a"), "progress": False}, "speed": {"threads": 1, "prefetch": 0}}))
    with pytest.raises(ConfigError, match="strategy.kind: scalar-mix \\(encoders, decoders .*\\) needs a model "
                                          "that has heads reading one stack's states .*\\(capability 'scalar-mix'\\); "
                                          "the model \\(Seq2SeqModel, registered as 'seq2seq'\\)"):
        finetune(config(glue, models["bart"], tmp_path / "b", strategy="scalar-mix"))
    with pytest.raises(ConfigError, match=r"strategy.kind: frozen leaves nothing to train: the task's heads \(lm\)"):
        finetune(config(glue, models["t5"], tmp_path / "c", strategy="frozen"))
