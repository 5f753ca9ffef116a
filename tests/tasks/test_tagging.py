"""CoNLL-2003 NER as a fine-tuning task: encoding (first or all subwords, long sentences in chunks), the tag set,
conlleval's file format, end-to-end fine-tuning on a tiny synthetic file (transformers loads the result), predict
and evaluate, and a read-only check on the real eng.testa."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertology.cli.main import main
from bertology.errors import DataError
from bertology.model import EncoderModel, load
from bertology.recipes.finetune import FinetuneConfig, finetune
from bertology.tasks.lookup import get_task
from bertology.tasks.metrics import evaluate_files
from bertology.tasks.tagging import IGNORE, TaggingTask, chunk_words, encode_chunks, encode_tagged
from bertology.tokenization import load_tokenizer
from finetune_helpers import save_tiny_model

# Entity words decide their type and their place: a head word starts an entity (B-), a tail word continues it (I-).
HEAD_WORDS = {"LOC": ["paris", "berlin"], "PER": ["maria", "peter"], "ORG": ["acme", "ibm"],
              "MISC": ["english", "olympic"]}
TAIL_WORDS = {"LOC": ["city", "town"], "PER": ["smith", "jones"], "ORG": ["corp", "inc"], "MISC": ["games", "cup"]}
FILL = ["the", "in", "said", "met", "of", "and", "a", "visit", "on", "today"]
WORDS = [w for words in (*HEAD_WORDS.values(), *TAIL_WORDS.values()) for w in words] + FILL


def synthetic_sentence(rng: np.random.Generator) -> list[tuple[str, str]]:
    """(word, IOB1 tag) rows: fillers and entities of one or two words, as CoNLL-2003 writes them (I- only)."""
    rows = []
    for _ in range(int(rng.integers(1, 4))):
        rows += [(str(w), "O") for w in rng.choice(FILL, int(rng.integers(1, 4)))]
        kind = str(rng.choice(list(HEAD_WORDS)))
        rows.append((str(rng.choice(HEAD_WORDS[kind])), "I-" + kind))
        if rng.random() < 0.5:
            rows.append((str(rng.choice(TAIL_WORDS[kind])), "I-" + kind))
    return rows


def write_conll(path, sentences, docs_every=10):
    lines = []
    for i, rows in enumerate(sentences):
        if docs_every and i % docs_every == 0:
            lines.append("-DOCSTART- -X- O O\n\n")
        lines.append("".join(f"{w} NN I-NP {t}\n" for w, t in rows) + "\n")
    path.write_text("".join(lines), encoding="utf-8")


@pytest.fixture(scope="module")
def conll(tmp_path_factory):
    root = tmp_path_factory.mktemp("conll")
    for name, count, seed in (("eng.train", 240, 0), ("eng.testa", 60, 1)):
        rng = np.random.default_rng(seed)
        write_conll(root / name, [synthetic_sentence(rng) for _ in range(count)])
    return root


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("base") / "model", WORDS, vocab_size=300)


@pytest.fixture
def subword_tokenizer(tmp_path):
    """A hand-made WordPiece vocabulary: 'yorker' is 'york ##er', 'newyorkers' is 'new ##york ##er ##s'."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "new", "york", "##york", "##er", "##s", "the", "met",
             "a"]
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return load_tokenizer(tmp_path / "tok", model_type="bert")


def test_label_set_and_files():
    task = get_task("conll2003")
    assert task.label_names() == ("O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER")
    assert task.metrics == ("f1", "precision", "recall")
    assert str(task.path("data", "train")).endswith("data/eng.train")
    assert str(task.path("data", "dev")).endswith("data/eng.testa")


def test_an_unknown_tag_names_the_file_and_the_sentence(tmp_path):
    path = tmp_path / "bad.conll"
    write_conll(path, [[("the", "O")], [("a", "O"), ("acme", "I-COMPANY")]], docs_every=0)
    with pytest.raises(DataError, match=r"bad.conll: sentence 1, word 2 \('acme'\): tag 'B-COMPANY' is not one of O, "):
        get_task("conll2003").read(path)


def test_first_subword_and_all_subword_labels(tmp_path, subword_tokenizer):
    path = tmp_path / "s.conll"
    write_conll(path, [[("the", "O"), ("newyorkers", "I-MISC"), ("yorker", "I-MISC"), ("met", "O"),
                        ("york", "I-LOC")]], docs_every=0)
    sentences = get_task("conll2003").read(path)
    # BIO: B-MISC I-MISC O B-LOC.  Tokens: [CLS] the new ##york ##er ##s york ##er met york [SEP]
    labels = get_task("conll2003").labels
    o, b_misc, i_misc, b_loc = (labels.index(t) for t in ("O", "B-MISC", "I-MISC", "B-LOC"))
    first = encode_tagged(subword_tokenizer, sentences, labels, 32, shuffle=False)
    every = encode_tagged(subword_tokenizer, sentences, labels, 32, label_all_subwords=True, shuffle=False)
    batch, batch_all = next(first.batches(0, 1, drop_last=False)), next(every.batches(0, 1, drop_last=False))
    tokens = [subword_tokenizer.id_to_token(i) for i in batch.input_ids[0].tolist()]
    assert tokens == ["[CLS]", "the", "new", "##york", "##er", "##s", "york", "##er", "met", "york", "[SEP]"]
    x = IGNORE
    assert batch.labels[0].tolist() == [x, o, b_misc, x, x, x, i_misc, x, o, b_loc, x]
    assert batch_all.labels[0].tolist() == [x, o, b_misc, i_misc, i_misc, i_misc, i_misc, i_misc, o, b_loc, x]
    assert first.chunks[0].starts.tolist() == [1, 2, 6, 8, 9]
    assert first.chunks[0].ends.tolist() == [1, 5, 7, 8, 9]


def test_chunk_words():
    assert chunk_words([1, 2, 3, 1], 3) == [(0, 2), (2, 3), (3, 4)]
    assert chunk_words([5, 1], 3) == [(0, 1), (1, 2)]  # a word larger than a chunk stands alone
    assert chunk_words([1, 1, 1, 1], 3, breakable=[True, True, True, False]) == [(0, 2), (2, 4)]
    assert chunk_words([1, 1, 1, 1], 2, breakable=[True, False, False, True]) == [(0, 2), (2, 4)]  # forced


def test_long_sentences_are_chunked_and_keep_every_word(tmp_path, subword_tokenizer, model_dir):
    words = ["the", "newyorkers", "met", "a", "yorker"] * 9 + ["unknownword"]  # 46 words, 82 subwords
    chunks = encode_chunks(subword_tokenizer, [words, ["the"]], 12)
    assert all(len(c.ids) <= 12 for c in chunks)
    assert [c.sentence for c in chunks].count(0) > 1
    covered = [c.first_word + k for c in chunks if c.sentence == 0 for k in range(c.num_words)]
    assert covered == list(range(len(words)))
    for c in chunks:
        assert c.ids[0] == subword_tokenizer.cls_id and c.ids[-1] == subword_tokenizer.sep_id
    # A word longer than a chunk keeps its first subwords: it is still predicted.
    (long,) = encode_chunks(subword_tokenizer, [["newyorkers"]], 4)
    assert long.ids == [subword_tokenizer.cls_id, subword_tokenizer.token_to_id("new"),
                        subword_tokenizer.token_to_id("##york"), subword_tokenizer.sep_id]
    assert long.starts.tolist() == [1]
    # Predictions come back per word, in the sentence's order, whatever the chunking.
    path = tmp_path / "long.conll"
    write_conll(path, [[(w, "O") for w in ["the", "paris", "met", "maria", "a"] * 12], [("acme", "I-ORG")]],
                docs_every=0)
    task, pretrained = get_task("conll2003"), load(model_dir)
    head = task.heads(pretrained.model.config)
    model = EncoderModel(pretrained.model.config, head)
    model.init_weights(torch.Generator().manual_seed(1))
    sentences = task.read(path)
    short = task.encode(pretrained.tokenizer, sentences, 16, train=False)
    assert len(short) > len(sentences)
    predictions = task.predict(model, short, sentences, 4)
    assert [len(p) for p in predictions] == [60, 1]
    whole = task.predict(model, task.encode(pretrained.tokenizer, sentences, 64, train=False), sentences, 4)
    assert [len(p) for p in whole] == [60, 1]


def test_written_predictions_are_conlleval_input(tmp_path):
    path = tmp_path / "dev.conll"
    write_conll(path, [[("paris", "I-LOC"), ("city", "I-LOC"), ("said", "O")], [("acme", "I-ORG")],
                       [("peter", "I-PER")]], docs_every=2)
    task = get_task("conll2003")
    sentences = task.read(path)
    predictions = [["B-LOC", "I-LOC", "O"], ["B-PER"], ["B-PER"]]
    task.write(tmp_path / "pred", predictions, sentences)
    assert (tmp_path / "pred").read_text() == (
        "-DOCSTART- -X- O O O O\n\n"
        "paris NN I-NP I-LOC B-LOC B-LOC\ncity NN I-NP I-LOC I-LOC I-LOC\nsaid NN I-NP O O O\n\n"
        "acme NN I-NP I-ORG B-ORG B-PER\n\n"
        "-DOCSTART- -X- O O O O\n\n"
        "peter NN I-NP I-PER B-PER B-PER\n\n")
    official = task.evaluate(tmp_path / "pred", path)
    scores = task.scores(predictions, sentences)
    assert official["f1"] == pytest.approx(scores["f1"]) == pytest.approx(200 / 3)
    assert official["tokens"] == 5 + 2  # conlleval counts the -DOCSTART- lines as tokens


def test_a_file_of_words_only_is_read_untagged_and_written_with_one_tag_per_word(tmp_path):
    task = get_task("conll2003")
    path = tmp_path / "words.txt"
    path.write_text("-DOCSTART-\n\nParis\ncity\n\n\nAcme\n", encoding="utf-8")
    sentences = task.read_input(path)
    assert [s.words for s in sentences] == [["Paris", "city"], ["Acme"]] and all(s.tags is None for s in sentences)
    task.write(tmp_path / "pred", [["B-LOC", "I-LOC"], ["B-ORG"]], sentences)
    assert (tmp_path / "pred").read_text() == "-DOCSTART- O\n\nParis B-LOC\ncity I-LOC\n\nAcme B-ORG\n\n"
    with pytest.raises(DataError, match=r"words.txt: no sentences"):
        task.read_input(_write(tmp_path / "words.txt", "\n\n"))
    with pytest.raises(DataError, match=r"words.txt: line 3: expected 1 columns .* got 2"):
        task.read_input(_write(tmp_path / "words.txt", "Paris\n\nAcme I-ORG\n"))
    # Two or more columns: a tagged file, read as training files are (the last column holds the tags).
    sentences = task.read_input(_write(tmp_path / "tagged.txt", "Acme I-ORG\ncorp I-ORG\n"))
    assert sentences[0].tags == ["B-ORG", "I-ORG"]
    with pytest.raises(DataError, match=r"tagged.txt: line 1: invalid tag 'NNP'"):
        task.read_input(_write(tmp_path / "tagged.txt", "Acme NNP\n"))
    # Training still needs tags: read() refuses a file of words only.
    with pytest.raises(DataError, match="has no tags"):
        task.read(_write(tmp_path / "words.txt", "Paris\n"))


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def _config(conll, model_dir, out, epochs=4):
    return FinetuneConfig.from_dict({
        "model": str(model_dir), "task": {"name": "conll2003", "data": str(conll), "epochs": epochs},
        "optim": {"batch_size": 16, "lr": 3e-3, "warmup_ratio": 0.1},
        "run": {"output_dir": str(out), "log_every": 5, "progress": False},
        "speed": {"threads": 1, "prefetch": 0}})


def test_finetune_predict_evaluate_and_transformers(conll, model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    result = finetune(_config(conll, model_dir, out))
    assert result.best["value"] > 90 and result.dev_metrics["f1"] == pytest.approx(result.best["value"])
    assert result.dev_metrics == evaluate_files("conll", out / "dev_predictions.conll")
    # The model is transformers' BertForTokenClassification with the tag names.
    saved = json.loads((out / "model" / "config.json").read_text())
    assert saved["architectures"] == ["BertForTokenClassification"]
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForTokenClassification.from_pretrained(out / "model").eval()
    assert hf.config.id2label == dict(enumerate(get_task("conll2003").label_names()))
    ours = load(out / "model")
    ids = torch.tensor([ours.tokenizer.encode_words(["maria", "smith", "met", "ibm", "corp"]).ids])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours.model(ids).logits, atol=1e-5, rtol=1e-5)
    # bertology predict writes what the run wrote; bertology evaluate scores it as dev_metrics.json says.
    predictions = tmp_path / "pred.conll"
    assert main(["predict", "--model", str(out / "model"), "--task", "conll2003", "--input",
                 str(conll / "eng.testa"), "--output", str(predictions)]) == 0
    assert predictions.read_text() == (out / "dev_predictions.conll").read_text()
    capsys.readouterr()
    assert main(["evaluate", "--task", "conll", "--predictions", str(predictions)]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads((out / "dev_metrics.json").read_text())
    # New text: the words alone (one a line, a blank line after each sentence), with and without the document
    # lines; one predicted tag per word, the same tags as for the tagged file.
    tagged = [line.split() for line in predictions.read_text().splitlines()]
    expected = "".join(f"{row[0]} {row[-1]}\n" if row else "\n" for row in tagged)
    lines = (conll / "eng.testa").read_text().splitlines()
    bare = [line for line in lines if not line.startswith("-DOCSTART-")]
    for name, keep, want in (("words.txt", lines, expected),
                             ("bare.txt", bare, expected.replace("-DOCSTART- O\n\n", ""))):
        words = tmp_path / name
        words.write_text("".join(f"{line.split()[0]}\n" if line.strip() else "\n" for line in keep),
                         encoding="utf-8")
        assert main(["predict", "--model", str(out / "model"), "--task", "conll2003", "--input", str(words),
                     "--output", str(tmp_path / f"{name}.tags")]) == 0
        assert (tmp_path / f"{name}.tags").read_text() == want
    assert "60 predictions written" in capsys.readouterr().err


def test_label_all_subwords_trains_too(conll, model_dir, tmp_path):
    task = TaggingTask(label_all_subwords=True)
    pretrained = load(model_dir)
    sentences = task.read(conll / "eng.train", limit=20)
    encoded = task.encode(pretrained.tokenizer, sentences, 64, train=True)
    batch = next(encoded.batches(0, 4))
    assert batch.labels is not None and batch.labels.shape == batch.input_ids.shape


def test_real_eng_testa_keeps_every_word(data_dir, minilm_path):
    """Every word of eng.testa gets a prediction slot (its first subword) under a WordPiece tokenizer, also when
    sentences are cut into chunks of 32 tokens."""
    path = data_dir / "conll2003" / "eng.testa"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    task = get_task("conll2003")
    sentences = task.read(path)
    tokenizer = load_tokenizer(minilm_path)
    assert tokenizer.kind == "wordpiece"
    for max_length in (128, 32):
        encoded = task.encode(tokenizer, sentences, max_length, train=False)
        assert int(encoded.lengths.max()) <= max_length
        slots = [np.zeros(len(s), dtype=int) for s in sentences]
        for chunk in encoded.chunks:
            slots[chunk.sentence][chunk.first_word:chunk.first_word + chunk.num_words] += 1
            assert (np.diff(chunk.starts) > 0).all() and chunk.starts.max() < len(chunk.ids) - 1
        assert all((s == 1).all() for s in slots)
    assert sum(len(s) for s in sentences) == 51362 and sentences.docstart == ["-DOCSTART-", "-X-", "O", "O"]
