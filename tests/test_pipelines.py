"""Pipelines on raw text: tiny random BERTs saved by transformers and loaded by bertology give transformers'
pipeline labels, scores and entities; QA reuses the SQuAD task's windows; the `predict` command's JSON lines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tokenizers
import torch

from bertology import pipeline
from bertology.cli.main import main
from bertology.errors import ConfigError, DataError, InputError
from bertology.model import load
from bertology.pipelines import bio_tags, entities

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = ("new york paris is a city in france the river bank was muddy john smith lives there . , ? where does live "
         "who lon").split()
NER_LABELS = ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
# Words with subword pieces (lon ##don ##s) so that first / average / max differ from simple.
NER_TEXT = "John Smith lives in Londons, where the river bank was muddy; Paris is a city in France."


def save_hf(kind: str, directory: Path, labels: list[str] | None = None, seed: int = 0) -> Path:
    """A tiny random BERT of transformers' class `kind`, with a WordPiece vocabulary of WORDS, saved there."""
    directory.mkdir(parents=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "##s", "##ing", "##er", "##don"]
    backend = tokenizers.Tokenizer(tokenizers.models.WordPiece({w: i for i, w in enumerate(vocab)},
                                                               unk_token="[UNK]"))
    backend.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    backend.decoder = tokenizers.decoders.WordPiece()
    backend.post_processor = tokenizers.processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
        mask_token="[MASK]", model_max_length=64,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"]).save_pretrained(directory)
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    names = {} if labels is None else {"id2label": dict(enumerate(labels)),
                                       "label2id": {name: i for i, name in enumerate(labels)}}
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=64, **names)
    torch.manual_seed(seed)
    getattr(transformers, kind)(config).eval().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pipelines")
    return {
        "cls": save_hf("BertForSequenceClassification", root / "cls", ["negative", "neutral", "positive"]),
        "ner": save_hf("BertForTokenClassification", root / "ner", NER_LABELS, seed=3),
        "qa": save_hf("BertForQuestionAnswering", root / "qa"),
        "mlm": save_hf("BertForMaskedLM", root / "mlm"),
    }


def hf_pipeline(task: str, directory: Path, **options):
    return transformers.pipeline(task, model=str(directory), device="cpu", **options)


def test_the_task_comes_from_the_model(models):
    assert [pipeline(model=models[key]).task for key in ("cls", "ner", "qa", "mlm")] == \
        ["text-classification", "token-classification", "question-answering", "fill-mask"]
    assert pipeline("ner", models["ner"]).task == "token-classification"
    assert pipeline("sentiment-analysis", models["cls"]).task == "text-classification"


def test_text_classification_equals_transformers(models):
    texts = ["new york is a city", "paris", "", "the river bank was muddy . " * 20]  # the last one truncated
    ours = pipeline(model=models["cls"])(texts, top_k=None)
    theirs = hf_pipeline("text-classification", models["cls"])(texts, top_k=None, truncation=True)
    pairs = [{"text": "who lives there ?", "text_pair": "john smith"}, {"text": "paris", "text_pair": "france"}]
    ours += pipeline(model=models["cls"], top_k=None)(pairs)
    theirs += [hf_pipeline("text-classification", models["cls"])(pair, top_k=None) for pair in pairs]
    for mine, reference in zip(ours, theirs):
        assert [label["label"] for label in mine] == [label["label"] for label in reference]
        np.testing.assert_allclose([label["score"] for label in mine], [label["score"] for label in reference],
                                   atol=1e-5)
    best = pipeline(model=models["cls"])("paris")
    assert len(best) == 1 and best[0]["label"] == ours[1][0]["label"]
    assert best[0]["score"] == pytest.approx(ours[1][0]["score"], abs=1e-6)
    top = pipeline(model=models["cls"])(("paris", "france"), top_k=2)
    assert [x["label"] for x in top] == [x["label"] for x in ours[-1][:2]]


def test_classifier_logits_equal_transformers(models):
    items = [{"text": "paris", "text_pair": None}, {"text": "who lives there ?", "text_pair": "john smith"}]
    ours = pipeline(model=models["cls"]).logits(items)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(models["cls"]))
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(str(models["cls"])).eval()
    with torch.no_grad():
        theirs = np.concatenate([reference(**tokenizer(item["text"], item["text_pair"], return_tensors="pt")).logits
                                 .numpy() for item in items])
    assert ours.shape == (2, 3) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
    with pytest.raises(ConfigError, match="a fill-mask pipeline has no classifier logits"):
        pipeline(model=models["mlm"]).logits(items)


@pytest.mark.parametrize("aggregation", ["none", "simple", "first", "average", "max"])
def test_token_classification_equals_transformers(models, aggregation):
    ours = pipeline(model=models["ner"], aggregation=aggregation)(NER_TEXT)
    theirs = hf_pipeline("token-classification", models["ner"], aggregation_strategy=aggregation)(NER_TEXT)
    key = "entity" if aggregation == "none" else "entity_group"
    assert ours and [(e[key], e["start"], e["end"]) for e in ours] == \
        [(e[key], e["start"], e["end"]) for e in theirs]
    np.testing.assert_allclose([e["score"] for e in ours], [float(e["score"]) for e in theirs], atol=1e-5)
    for entity in ours:
        assert entity["word"] == NER_TEXT[entity["start"]:entity["end"]]
    if aggregation != "none":  # grouped entities read as valid BIO over the text's tokens
        encoding = load(models["ner"]).tokenizer.encode(NER_TEXT, add_special_tokens=False)
        assert_valid_bio(bio_tags(ours, encoding.offsets))


def assert_valid_bio(tags: list[str]) -> None:
    previous = "O"
    for tag in tags:
        if tag.startswith("I-"):
            assert previous in (f"B-{tag[2:]}", f"I-{tag[2:]}"), tags
        previous = tag


def test_entities_of_crafted_tags_are_valid_bio_spans():
    text = "New York and Paris met John Smith"
    offsets = [(0, 3), (4, 8), (9, 12), (13, 18), (19, 22), (23, 27), (28, 33)]
    words = list(range(7))
    # Token tags: I-LOC I-LOC (an entity opened by I-), O, B-LOC, O, B-PER I-LOC (two entities: the type changes)
    tags = ["I-LOC", "I-LOC", "O", "B-LOC", "O", "B-PER", "I-LOC"]
    scores = np.full((7, len(NER_LABELS)), 0.1)
    for i, tag in enumerate(tags):
        scores[i, NER_LABELS.index(tag)] = 0.6
    found = entities(text, offsets, words, scores, NER_LABELS, "simple")
    assert [(e["entity_group"], e["word"], e["start"], e["end"]) for e in found] == [
        ("LOC", "New York", 0, 8), ("LOC", "Paris", 13, 18), ("PER", "John", 23, 27), ("LOC", "Smith", 28, 33)]
    assert all(e["score"] == pytest.approx(0.6) for e in found)
    repaired = bio_tags(found, offsets)
    assert repaired == ["B-LOC", "I-LOC", "O", "B-LOC", "O", "B-PER", "B-LOC"]
    assert_valid_bio(repaired)
    # Two B- tags in a row are two entities; "first" takes a word's first piece, "max" its most confident one.
    pieces = entities("Londons", [(0, 3), (3, 6), (6, 7)], [0, 0, 0],
                      np.array([[0.1, 0.5, 0.1, 0.2, 0.1], [0.1, 0.1, 0.1, 0.7, 0.0], [0.1, 0.1, 0.6, 0.1, 0.1]]),
                      NER_LABELS, "first")
    assert [(e["entity_group"], e["word"], e["score"]) for e in pieces] == [("LOC", "Londons", 0.5)]
    assert entities("Londons", [(0, 3), (3, 6), (6, 7)], [0, 0, 0],
                    np.array([[0.1, 0.5, 0.1, 0.2, 0.1], [0.1, 0.1, 0.1, 0.7, 0.0], [0.1, 0.1, 0.6, 0.1, 0.1]]),
                    NER_LABELS, "max")[0]["entity_group"] == "PER"
    two = entities("a b", [(0, 1), (2, 3)], [0, 1], np.array([[0.1, 0.9, 0, 0, 0], [0.1, 0.9, 0, 0, 0]]),
                   NER_LABELS, "simple")
    assert [(e["word"], e["start"]) for e in two] == [("a", 0), ("b", 2)]
    with pytest.raises(ConfigError, match="aggregation: unknown 'longest'"):
        entities(text, offsets, words, scores, NER_LABELS, "longest")


def test_long_texts_are_tagged_in_windows(models):
    """A text past the model's 64 positions: each token's logits come from the window where it has the most
    context, so a token far from the cuts is tagged as in a window of its own neighbourhood."""
    pretrained = load(models["ner"])
    text = " ".join(["john smith lives in paris ."] * 30)  # 180 tokens
    tokenizer = pretrained.tokenizer
    encoding = tokenizer.encode(text, add_special_tokens=False)
    assert len(encoding.ids) > 150
    found = pipeline(model=pretrained, aggregation="none", ignore_labels=())(text)
    assert len(found) == len(encoding.ids) and found[-1]["end"] == len(text)
    # Windows of 62 content tokens (64 positions, two specials), half a window apart.
    from bertology.embeddings.windows import max_context_window, plan_windows

    spans = plan_windows(len(encoding.ids), 62, 31)
    choice = max_context_window(spans, len(encoding.ids))
    for token in (5, 40, 100, len(encoding.ids) - 3):
        start, stop = spans[choice[token]]
        ids = [tokenizer.token_to_id("[CLS]"), *encoding.ids[start:stop], tokenizer.token_to_id("[SEP]")]
        with torch.inference_mode():
            logits = pretrained.model(torch.tensor([ids])).head_logits["token_classifier"][0, 1 + token - start]
        probabilities = torch.softmax(logits.double(), -1)
        assert found[token]["entity"] == NER_LABELS[int(probabilities.argmax())]
        assert found[token]["score"] == pytest.approx(float(probabilities.max()), abs=1e-5)


def test_question_answering_reuses_the_squad_windows(models):
    from bertology.tasks.examples import QAExample
    from bertology.tasks.qa import SquadTask

    context = " ".join(["the river bank was muddy ."] * 8 + ["john smith lives in paris , a city in france ."]
                       + ["the river bank was muddy ."] * 8)
    questions = ["where does john smith live ?", "who lives in paris ?", "where is the bank ?"]
    pretrained = load(models["qa"])
    assert len(pretrained.tokenizer.encode(context).ids) > 64  # several windows of 64 positions
    answers = pipeline(model=pretrained, doc_stride=16, max_answer_length=30, max_length=64)(
        [{"question": q, "context": context} for q in questions])
    task = SquadTask(doc_stride=16, max_answer_length=30)
    examples = [QAExample(str(i), q, context, [], "") for i, q in enumerate(questions)]
    expected = task.predict(pretrained.model, task.encode(pretrained.tokenizer, examples, 64, train=False), examples,
                            8)
    assert [a["answer"] for a in answers] == expected
    for answer in answers:
        assert context[answer["start"]:answer["end"]] == answer["answer"] and 0 < answer["score"] <= 1
    single = pipeline(model=pretrained)({"question": questions[0], "context": "john smith lives in paris ."})
    assert set(single) == {"answer", "score", "start", "end"} and single["answer"]


def test_fill_mask_equals_transformers(models):
    ours = pipeline(model=models["mlm"])("john smith lives in [MASK] .")
    theirs = hf_pipeline("fill-mask", models["mlm"])("john smith lives in [MASK] .")
    assert [p["token"] for p in ours] == [p["token"] for p in theirs]
    np.testing.assert_allclose([p["score"] for p in ours], [p["score"] for p in theirs], atol=1e-5)
    two = pipeline(model=models["mlm"], top_k=2)("[MASK] lives in [MASK] .")
    assert len(two) == 2 and all(len(predictions) == 2 for predictions in two)


def test_feature_extraction_is_embed(minilm_path):
    from bertology.embeddings import embed

    pretrained = load(minilm_path)
    texts = ["a cat sat on the mat .", "paris is the capital of france ."]
    vectors = pipeline("feature-extraction", pretrained)(texts)
    np.testing.assert_allclose(np.asarray(vectors), embed(pretrained, texts, levels=("sentence",)).sentences,
                               atol=1e-6)


def test_bad_inputs_and_options(models):
    with pytest.raises(ConfigError, match="unknown pipeline task 'summarize'"):
        pipeline("summarize", models["cls"])
    with pytest.raises(ConfigError, match=r"has no 'qa' head for question-answering \(heads: classifier"):
        pipeline("question-answering", models["cls"])
    qa = pipeline(model=models["qa"])
    with pytest.raises(InputError, match="input 0: question-answering takes a question and a context"):
        qa("where ?")
    with pytest.raises(InputError, match=r"input 1: missing field 'context'"):
        qa([{"question": "a", "context": "b"}, {"question": "a"}])
    tagger = pipeline(model=models["ner"])
    with pytest.raises(InputError, match="input 0: unknown field 'txt'"):
        tagger({"txt": "x"})
    with pytest.raises(InputError, match="input 0: field 'text' is int, not a string"):
        tagger({"text": 3})
    with pytest.raises(ConfigError, match="aggregation: unknown 'all'"):
        tagger("x", aggregation="all")
    with pytest.raises(ConfigError, match="unknown option 'top_k'"):
        tagger("x", top_k=2)
    with pytest.raises(ConfigError, match="top_k must be a positive integer or None"):
        pipeline(model=models["cls"], top_k=0)


# ----------------------------------------------------------------------------------------------- the command
def test_predict_command_writes_json_lines(models, tmp_path, capsys):
    assert main(["predict", "--model", str(models["cls"]), "--text", "paris", "--text", "new york is a city",
                 "--top-k", "0"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = pipeline(model=models["cls"], top_k=None)(["paris", "new york is a city"])
    assert [line["text"] for line in lines] == ["paris", "new york is a city"]
    for line, labels in zip(lines, expected):
        assert [x["label"] for x in line["labels"]] == [x["label"] for x in labels]
        np.testing.assert_allclose([x["score"] for x in line["labels"]], [x["score"] for x in labels], atol=1e-6)
    # A plain text file (one item a line), and JSON lines with the task's fields and an id, to --output.
    plain = tmp_path / "in.txt"
    plain.write_text("John Smith lives in Paris.\n\nParis is a city.\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert main(["predict", "--model", str(models["ner"]), "--input", str(plain), "--output", str(out)]) == 0
    # with --output the answers go to the file and stdout has the command's one-object result, as every command's
    assert json.loads(capsys.readouterr().out) == {"output": str(out), "task": "token-classification",
                                                   "predictions": 3}
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [row["text"] for row in rows] == ["John Smith lives in Paris.", "", "Paris is a city."]
    assert rows[0]["entities"] == json.loads(json.dumps(pipeline(model=models["ner"])(rows[0]["text"])))
    assert rows[1]["entities"] == []
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"id": "q1", "question": "who lives in paris ?",
                                     "context": "john smith lives in paris ."}) + "\n\n", encoding="utf-8")
    assert main(["predict", "--model", str(models["qa"]), "--input", str(questions)]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["id"] == "q1" and row["answer"] == "john smith lives in paris ."[row["start"]:row["end"]]
    assert main(["predict", "--model", str(models["qa"]), "--text", "who lives in paris ?", "--context",
                 "john smith lives in paris ."]) == 0
    assert {k: v for k, v in json.loads(capsys.readouterr().out).items() if k != "id"} == \
        {k: v for k, v in row.items() if k != "id"}


def test_predict_command_errors(models, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "paris"}\n{"text": \n', encoding="utf-8")
    assert main(["predict", "--model", str(models["cls"]), "--input", str(bad)]) == 2
    assert f"{bad}: line 2: invalid JSON" in capsys.readouterr().err
    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"question": "who ?"}\n', encoding="utf-8")
    assert main(["predict", "--model", str(models["qa"]), "--input", str(missing)]) == 2
    assert f"{missing}: line 1: missing field 'context'" in capsys.readouterr().err
    plain = tmp_path / "q.txt"
    plain.write_text("who ?\n", encoding="utf-8")
    assert main(["predict", "--model", str(models["qa"]), "--input", str(plain)]) == 2
    assert "question-answering reads JSON lines" in capsys.readouterr().err
    assert main(["predict", "--model", str(models["cls"]), "--text", "x", "--output", str(tmp_path)]) == 2
    assert f"--output {tmp_path}: is a directory" in capsys.readouterr().err
    assert main(["predict", "--model", str(models["cls"])]) == 2
    assert "--text TEXT (repeatable) or as --input FILE" in capsys.readouterr().err
    assert main(["predict", "--model", str(models["cls"]), "--text", "x", "--aggregation", "first"]) == 2
    assert "--aggregation: for token-classification; this is text-classification" in capsys.readouterr().err
    assert main(["predict", "--model", str(models["cls"]), "--task", "sst2", "--input", str(plain)]) == 2
    assert "predicting a task file needs --output" in capsys.readouterr().err
    # A task file that is raw text: the error says how to answer raw text instead.
    binary = save_hf("BertForSequenceClassification", tmp_path / "binary", ["negative", "positive"])
    capsys.readouterr()  # transformers' progress output
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("a charming film\n", encoding="utf-8")
    assert main(["predict", "--model", str(binary), "--task", "sst2", "--input", str(sentences), "--output",
                 str(tmp_path / "p.tsv")]) == 2
    err = capsys.readouterr().err
    assert f"{sentences}: line 1" in err and "leave --task out" in err and err.count("\n") == 1
    assert not (tmp_path / "p.tsv").exists()
    assert main(["predict", "--model", str(binary), "--input", str(sentences)]) == 0
    assert json.loads(capsys.readouterr().out)["labels"][0]["label"] in ("negative", "positive")
    existing = tmp_path / "keep.jsonl"
    existing.write_text("kept\n", encoding="utf-8")
    assert main(["predict", "--model", str(models["qa"]), "--input", str(missing), "--output", str(existing)]) == 2
    assert existing.read_text(encoding="utf-8") == "kept\n"  # a failed run leaves the output as it was
    with pytest.raises(DataError):
        from bertology.cli.predict import _check_input

        _check_input(str(tmp_path / "nothing.txt"))


@pytest.mark.parametrize("family", ["gpt2", "t5"])
def test_generation_is_what_the_generate_command_prints(family, tmp_path, capsys):
    from framing_helpers import tokenizer
    from transformer_helpers import tiny_config

    from bertology.model import HeadSpec, Pretrained
    from bertology.model.transformer import DecoderModel, Seq2SeqModel

    tok = tokenizer(family)
    if family == "gpt2":
        eos = tok.token_to_id("<|endoftext|>")
        model = DecoderModel(tiny_config(vocab_size=tok.vocab_size, max_position_embeddings=64, eos_token_id=eos,
                                         pad_token_id=eos, initializer_range=0.3), [HeadSpec("lm", "tied_lm")])
    else:
        model = Seq2SeqModel(tiny_config(vocab_size=tok.vocab_size, positions="relative", norm="rmsnorm", bias=False,
                                         pad_token_id=tok.pad_id, eos_token_id=tok.token_to_id("</s>"),
                                         decoder_start_token_id=tok.pad_id, initializer_range=0.3),
                             [HeadSpec("lm", "tied_lm")])
    model.init_weights(torch.Generator().manual_seed(0))
    Pretrained(model.eval(), tok).save(tmp_path / "model")
    texts = ["the cat sat on the", "a dog ran in the park with", "the"]
    generator = pipeline(model=tmp_path / "model", max_new_tokens=6, batch_size=2)
    assert generator.task == "text-generation"
    got = [answer["generated_text"] for answer in generator(texts)]
    assert main(["generate", *texts, "--model", str(tmp_path / "model"), "--max-new-tokens", "6"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert [text.replace("\r", "\\r").replace("\n", "\\n") for text in got] == printed
    if family == "gpt2":
        assert all(text.startswith(prompt) for text, prompt in zip(got, texts))
