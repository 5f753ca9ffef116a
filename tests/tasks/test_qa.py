"""SQuAD v1.1 as a fine-tuning task: split paths, windows (stride, labels, question truncation, offsets back to
text), the max-context rule, n-best spans, the objective, fine-tuning end to end on a tiny synthetic SQuAD file
(transformers loading the model, predict/evaluate on the command line), and the shared file read and encoded."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertology.cli.main import main
from bertology.errors import ConfigError, DataError
from bertology.model import EncoderModel, Pretrained, load, preset
from bertology.objectives.base import Passes
from bertology.recipes.finetune import FinetuneConfig, finetune, predict_file
from bertology.tasks.lookup import get_task
from bertology.tasks.examples import Answer, QAExample
from bertology.tasks.metrics import evaluate_files
from bertology.tasks.qa import (
    PairFrame,
    QAWindows,
    SpanExtraction,
    SquadTask,
    answer_tokens,
    best_span,
    parse_split,
    qa_head,
    question_spans,
    span_text,
    split_path,
    squad_json,
    window_step,
)
from bertology.tasks.readers import read_squad, split_squad_by_article
from bertology.tokenization import train_tokenizer
from bertology.training import read_metrics
from finetune_helpers import key_squad

WORDS = ("the river city old man walked near green hills and a small house stood by road what is key word door "
         "cat sat on mat café naïve red blue").split()
CITIES = ["Paris", "London", "Rome", "Berlin", "Madrid", "Oslo", "Vienna", "Zürich"]


@pytest.fixture(scope="module")
def tokenizer():
    lines = [" ".join(WORDS + [c.lower() for c in CITIES])] * 3
    return train_tokenizer(iter(lines), "wordpiece", 400, show_progress=False, min_frequency=1)


def _example(context: str, answer: str, question: str = "what is the key", qid: str = "q", title: str = "t",
             occurrence: int = 0) -> QAExample:
    start = -1
    for _ in range(occurrence + 1):
        start = context.index(answer, start + 1)
    return QAExample(qid, question, context, [Answer(answer, start)], title)


def _window_tokens(tokenizer, windows: QAWindows, w: int) -> list[str]:
    ids = windows.flat_ids[windows.offsets[w]:windows.offsets[w + 1]]
    return [tokenizer.id_to_token(int(i)) for i in ids]


# ---------------------------------------------------------------------------------------------- files, splits
def _squad_file(path, articles):
    """articles: {title: [(context, [(qid, question, answer_text)])]}"""
    data = []
    for title, paragraphs in articles.items():
        data.append({"title": title, "paragraphs": [
            {"context": context, "qas": [{"id": qid, "question": question,
                                          "answers": [{"text": answer, "answer_start": context.index(answer)}]}
                                         for qid, question, answer in qas]}
            for context, qas in paragraphs]})
    path.write_text(json.dumps({"version": "1.1", "data": data}, ensure_ascii=False), encoding="utf-8")
    return path


def test_split_paths_read_the_split_of_one_file_and_a_plain_path_reads_all(tmp_path):
    articles = {f"article {a}": [(f"the key is red {a} {p}", [(f"{a}-{p}", "what is the key", "red")])
                                 for p in range(2)] for a in range(8)}
    (tmp_path / "data").mkdir()
    file = _squad_file(tmp_path / "data" / "squad.json", articles)
    task = get_task("squad")
    assert isinstance(task, SquadTask) and task.metrics == ("f1", "exact_match")
    # a folder with one file, or the file itself: the file with the split after '#'
    assert task.path(str(tmp_path / "data"), "dev") == split_path(file, "dev") == tmp_path / "data" / "squad.json#dev"
    assert task.path(str(file), "train") == tmp_path / "data" / "squad.json#train"
    assert parse_split(task.path(str(file), "train")) == (file, "train")
    assert parse_split(file) == (file, None)
    train, dev = task.read(task.path(str(file), "train")), task.read(task.path(str(file), "dev"))
    expected = split_squad_by_article(read_squad(file), dev_fraction=0.25, seed=0)
    assert (train, dev) == expected
    assert len({e.title for e in dev}) == 2 and not {e.title for e in dev} & {e.title for e in train}
    assert task.read(file) == read_squad(file)  # a plain path: every question
    assert task.read(task.path(str(file), "dev"), limit=3) == dev[:3]
    assert read_squad_roundtrip(dev, tmp_path / "gold.json") == dev
    # the official pair of files is read as it is
    for name in ("train-v1.1.json", "dev-v1.1.json"):
        (tmp_path / "official").mkdir(exist_ok=True)
        (tmp_path / "official" / name).write_bytes(file.read_bytes())
    assert task.path(str(tmp_path / "official"), "dev") == tmp_path / "official" / "dev-v1.1.json"
    with pytest.raises(ConfigError, match=r"task.data: .*missing does not exist"):
        task.path(str(tmp_path / "missing"), "dev")
    (tmp_path / "data" / "other.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"holds 2 .json files; expected train-v1.1.json and dev-v1.1.json"):
        task.path(str(tmp_path / "data"), "dev")
    one = _squad_file(tmp_path / "one.json", {"only": articles["article 0"]})
    with pytest.raises(DataError, match=r"one.json: cannot split 1 article\(s\) into train and dev by article"):
        task.read(split_path(one, "dev"))


def read_squad_roundtrip(examples, path):
    path.write_text(json.dumps(squad_json(examples)), encoding="utf-8")
    return read_squad(path)


# ---------------------------------------------------------------------------------------------------- windows
def test_stride_is_the_step_between_window_starts(tokenizer):
    context = " ".join(["the"] * 20)
    example = _example(context + " red", "red")
    # max_length 12: [CLS] what is [SEP] ... [SEP] -> capacity 12 - 3 - 2 = 7 context tokens per window
    windows = QAWindows.encode(tokenizer, [example], 12, max_query_length=2, doc_stride=3)
    assert window_step(7, 3) == 3
    assert windows.start.tolist() == [0, 3, 6, 9, 12, 15]  # window k starts at k * stride
    assert windows.stop.tolist() == [7, 10, 13, 16, 19, 21]  # overlap 7 - 3 = 4 tokens; the last ends at the end
    assert all(len(_window_tokens(tokenizer, windows, w)) <= 12 for w in range(len(windows)))
    # the step is capped at half a window: doc_stride 128 on 7-token windows steps by 3
    capped = QAWindows.encode(tokenizer, [example], 12, max_query_length=2, doc_stride=128)
    assert window_step(7, 128) == 3 and capped.start.tolist() == windows.start.tolist()
    assert window_step(1, 128) == 1 and window_step(370, 128) == 128  # BERT's 384/128: the cap does not bind


def test_windows_frame_question_and_context_as_the_tokenizer_frames_a_pair(tokenizer):
    example = _example("the cat sat on the mat near a red house", "red")
    windows = QAWindows.encode(tokenizer, [example], 64)
    assert len(windows) == 1
    pair = tokenizer.encode(example.question, example.context)
    assert windows.flat_ids.tolist() == pair.ids and windows.flat_types.tolist() == pair.type_ids
    assert _window_tokens(tokenizer, windows, 0)[:6] == ["[CLS]", "what", "is", "the", "key", "[SEP]"]
    roberta = train_tokenizer(iter([" ".join(WORDS)] * 3), "bpe", 300, show_progress=False, min_frequency=1)
    frame = PairFrame.of(roberta)
    assert frame.specials == 4 and frame.middle == (roberta.sep_id, roberta.sep_id)
    windows = QAWindows.encode(roberta, [example], 64)
    pair = roberta.encode(example.question, example.context)
    assert windows.flat_ids.tolist() == pair.ids and windows.flat_types.tolist() == pair.type_ids
    start, end = windows.labels[0].tolist()
    assert roberta.decode(windows.flat_ids[start:end + 1].tolist()).strip() == "red"


def test_labels_point_at_the_answer_inside_a_window_and_at_cls_outside(tokenizer):
    words = ["the"] * 12
    words[9] = "red"  # content token 9
    example = _example(" ".join(words), "red")
    windows = QAWindows.encode(tokenizer, [example], 12, max_query_length=2, doc_stride=3)
    # capacity 7, windows [0,7) [3,10) [6,12); the question "what is" -> content starts at position 4
    assert windows.start.tolist() == [0, 3, 6] and windows.content.tolist() == [4, 4, 4]
    assert windows.labels.tolist() == [[0, 0], [4 + 6, 4 + 6], [4 + 3, 4 + 3]]
    for w in (1, 2):
        assert _window_tokens(tokenizer, windows, w)[windows.labels[w, 0]] == "red"
    # an answer of three tokens is inside a window only when all three are
    example = _example(" ".join(["the"] * 5 + ["cat", "sat", "on"] + ["the"] * 4), "cat sat on")
    windows = QAWindows.encode(tokenizer, [example], 12, max_query_length=2, doc_stride=3)
    assert windows.answer_span.tolist() == [[5, 7]]
    assert [(s, e) for s, e in zip(windows.start.tolist(), windows.stop.tolist())] == [(0, 7), (3, 10), (6, 12)]
    assert windows.labels.tolist() == [[0, 0], [4 + 2, 4 + 4], [0, 0]]  # [0,7) cuts it; [6,12) misses its start
    assert windows.windows_holding(0, example.answers[0].start, example.answers[0].end) == [1]


def test_the_question_is_cut_to_max_query_length(tokenizer):
    example = _example("the red house", "red", question="what is the key word door cat sat")
    windows = QAWindows.encode(tokenizer, [example], 32, max_query_length=3)
    assert _window_tokens(tokenizer, windows, 0) == ["[CLS]", "what", "is", "the", "[SEP]", "the", "red", "house",
                                                     "[SEP]"]
    assert windows.labels.tolist() == [[6, 6]]
    with pytest.raises(ConfigError, match=r"task.max_length: 6 tokens leave no room for the context of question "
                                          r"'q' after its 3 question tokens and 3 special tokens"):
        QAWindows.encode(tokenizer, [example], 6, max_query_length=3)


def test_offsets_give_back_the_original_text_with_accents_and_whitespace(tokenizer):
    context = "The  Cat\tsat on\n the MAT,  near Café   Naïve\u00a0red"
    encoding = tokenizer.encode(context, add_special_tokens=False)
    assert "cafe" in encoding.tokens  # lower-cased, accents stripped by the normaliser
    offsets = np.asarray(encoding.offsets)
    for answer in ("Cat\tsat on\n the", "MAT", "Café   Naïve", "Naïve\u00a0red", "Café", "The  Cat"):
        start = context.index(answer)
        span = answer_tokens(offsets, start, start + len(answer))
        assert span is not None and span_text(context, offsets, span) == answer
    # an answer starting or ending inside whitespace maps to the tokens it covers
    start = context.index(" Cat")
    assert span_text(context, offsets, answer_tokens(offsets, start, start + 5)) == "Cat"
    assert answer_tokens(offsets, 3, 5) is None  # only spaces
    assert span_text(context, offsets, None) == ""
    # windows label the same tokens and the text comes back through them
    example = _example(context, "Café   Naïve")
    windows = QAWindows.encode(tokenizer, [example], 10, max_query_length=2, doc_stride=2)
    labelled = [w for w in range(len(windows)) if windows.labels[w, 0] > 0]
    assert labelled
    for w in labelled:
        first = int(windows.start[w] + windows.labels[w, 0] - windows.content[w])
        last = int(windows.start[w] + windows.labels[w, 1] - windows.content[w])
        assert span_text(context, windows.context_offsets[0], (first, last)) == "Café   Naïve"


# ------------------------------------------------------------------------------------ n-best and max context
def test_best_span_takes_n_best_candidates_and_the_length_limit():
    start = np.array([0.0, 9.0, 1.0, 3.0, 0.5], dtype=np.float32)
    end = np.array([0.0, 0.0, 1.0, 7.5, 8.0], dtype=np.float32)
    assert best_span(start, end, n_best=5, max_answer_length=30) == (17.0, 1, 4)
    assert best_span(start, end, n_best=5, max_answer_length=4) == (17.0, 1, 4)
    assert best_span(start, end, n_best=5, max_answer_length=3) == (16.5, 1, 3)  # 1..4 has 4 positions
    assert best_span(start, end, n_best=5, max_answer_length=1) == (10.5, 3, 3)
    # only the n best starts and ends are candidates: start 1, end 4 -> too long, nothing else to try
    assert best_span(start, end, n_best=1, max_answer_length=3) is None
    assert best_span(start, end, n_best=2, max_answer_length=3) == (16.5, 1, 3)  # ends 4 and 3
    # end before start is never taken
    assert best_span(np.array([0, 5.0]), np.array([5.0, 0]), n_best=2, max_answer_length=30) == (5.0, 1, 1)
    # starts can be ruled out (the max-context rule)
    assert best_span(start, end, n_best=5, max_answer_length=30,
                     allowed_starts=np.array([True, False, True, True, True])) == (11.0, 3, 4)


def test_a_start_counts_only_in_the_window_where_it_has_the_most_context(tokenizer):
    example = _example(" ".join(["the"] * 12), "the")
    windows = QAWindows.encode(tokenizer, [example], 12, max_query_length=2, doc_stride=3)
    # windows [0,7) [3,10) [6,12): token 6 is max-context in [3,10) (3 left, 3 right), not in [0,7) or [6,12)
    assert [(int(a), int(b)) for a, b in zip(windows.start, windows.stop)] == [(0, 7), (3, 10), (6, 12)]

    def logits_with(at: dict[tuple[int, int], tuple[float, float]]) -> np.ndarray:
        logits = np.full((int(windows.offsets[-1]), 2), -5.0, dtype=np.float32)
        for (w, token), value in at.items():
            logits[windows.offsets[w] + windows.content[w] + token - windows.start[w]] = value
        return logits

    # every other position scores -5. Token 6 scores 10 in window 0 (one token of right context there) but 3 in
    # window 1 (its max-context window): only window 1's start counts
    spans = question_spans(windows, logits_with({(0, 6): (10.0, 10.0), (1, 6): (3.0, 3.0), (1, 7): (0.0, 2.0)}))
    assert spans == [(6, 6)]
    # token 11 scores 10 in window 2; token 2 of window 0 (max context there: 2 left, 4 right) scores 4 and 4
    spans = question_spans(windows, logits_with({(2, 11): (10.0, 10.0), (0, 2): (4.0, 4.0)}))
    assert spans == [(11, 11)]  # token 11 is only in window 2: its own max-context window
    # the best valid span is taken over all windows; spans may end in another window's max-context tokens
    spans = question_spans(windows, logits_with({(1, 5): (6.0, 0.0), (1, 9): (0.0, 6.0), (0, 5): (9.0, 9.0)}))
    assert spans == [(5, 9)]  # start 5 is max-context in window 1; window 0's high score at 5 is ignored
    assert question_spans(windows, logits_with({}), max_answer_length=1) == [(0, 0)]  # ties: earliest window, start


# ----------------------------------------------------------------------------------------------- the objective
def test_the_objective_is_the_mean_of_start_and_end_cross_entropy_over_real_positions(tokenizer):
    examples = [_example("the cat sat on the red mat", "red", qid="a"),
                _example("the red cat", "red", qid="b")]
    windows = QAWindows.encode(tokenizer, examples, 32)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=1, hidden_size=16, num_heads=2,
                    intermediate_size=32, max_position_embeddings=32)
    head = qa_head(config)
    assert (head.name, head.kind, head.num_labels) == ("qa", "token", 2)
    model = EncoderModel(config, [head])
    model.init_weights(torch.Generator().manual_seed(0))
    model.eval()
    objective = SpanExtraction(head)
    batch = next(windows.batches(0, 2, drop_last=False))
    out = objective(Passes(model, batch, objective.reads(batch)), batch)
    logits = model(batch.input_ids, batch.attention_mask, batch.token_type_ids).logits
    expected = 0.0
    for row in range(2):
        n = int(batch.attention_mask[row].sum())
        for k in range(2):
            expected += torch.nn.functional.cross_entropy(logits[row, :n, k][None], batch.labels[row, k][None]) / 2
    torch.testing.assert_close(out.loss_sum, expected)
    assert int(out.stats["qa_units"]) == 2 and objective.units(batch) == 2
    with pytest.raises(ConfigError, match="span extraction needs a head with 2 outputs"):
        SpanExtraction(type(head)("qa", "token", num_labels=3))


# ------------------------------------------------------------------------------------------------ end to end
FILL = "the river city old man walked near green hills and a small house stood by road".split()


def _synthetic_squad(path, seed=0, articles=12, paragraphs=10):
    """The answer is the city after 'key is' (cities occur nowhere else) in 40 to 110 filler words."""
    return key_squad(path, FILL, CITIES, (40, 110), articles, paragraphs, seed)


@pytest.fixture(scope="module")
def squad_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("squad")
    _synthetic_squad(root / "tiny-squad.json")
    return root


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("base")
    config = preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=2, hidden_size=32, num_heads=2,
                    intermediate_size=64, max_position_embeddings=128)
    model = EncoderModel(config)
    model.init_weights(torch.Generator().manual_seed(0))
    Pretrained(model, tokenizer).save(root / "model")
    return root / "model"


def test_finetune_learns_the_synthetic_squad_and_predict_and_evaluate_agree(squad_dir, model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    config = FinetuneConfig.from_dict({
        "model": str(model_dir), "task": {"name": "squad", "data": str(squad_dir), "epochs": 8, "max_length": 96},
        "optim": {"batch_size": 16, "lr": 3e-3, "warmup_ratio": 0.1},
        "run": {"output_dir": str(out), "log_every": 10, "progress": False},
        "speed": {"threads": 1, "prefetch": 0}})
    result = finetune(config)
    evals = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "eval"]
    assert {"dev_f1", "dev_exact_match", "qa_loss"} <= set(evals[-1])
    assert result.best["metric"] == "f1" and result.best["value"] > 80, result.best
    # dev_metrics.json: the written predictions scored against the dev split's gold, written beside them
    gold = out / "dev_gold.json"
    dev = get_task("squad").read(split_path(squad_dir / "tiny-squad.json", "dev"))
    assert read_squad(gold) == dev and len({e.title for e in dev}) == 3
    predictions = json.loads((out / "dev_predictions.json").read_text(encoding="utf-8"))
    assert list(predictions) == [e.id for e in dev]
    assert result.dev_metrics == evaluate_files("squad", out / "dev_predictions.json", gold=gold)
    assert result.dev_metrics["f1"] == pytest.approx(result.best["value"])
    # transformers loads the model as *ForQuestionAnswering with the same start and end logits
    saved = json.loads((out / "model" / "config.json").read_text())
    assert saved["architectures"] == ["BertForQuestionAnswering"]
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForQuestionAnswering.from_pretrained(out / "model").eval()
    ours = load(out / "model")
    encoding = ours.tokenizer.encode("what is the key", dev[0].context)
    ids, types = torch.tensor([encoding.ids]), torch.tensor([encoding.type_ids])
    with torch.no_grad():
        theirs = hf(input_ids=ids, token_type_ids=types)
        logits = ours.model(ids, token_type_ids=types).logits
    torch.testing.assert_close(torch.stack([theirs.start_logits, theirs.end_logits], -1), logits,
                               atol=1e-5, rtol=1e-5)
    # `bertology predict` on the dev gold, scored by `bertology evaluate`, is dev_metrics.json
    written = tmp_path / "pred.json"
    assert main(["predict", "--model", str(out / "model"), "--task", "squad", "--input", str(gold),
                 "--output", str(written), "--max-length", "96"]) == 0
    assert json.loads(written.read_text(encoding="utf-8")) == predictions
    capsys.readouterr()
    assert main(["evaluate", "--task", "squad", "--gold", str(gold), "--predictions", str(written)]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads((out / "dev_metrics.json").read_text())
    # any SQuAD file: every question predicted (here the whole file, train articles included)
    everything = tmp_path / "all.json"
    count = predict_file(out / "model", "squad", squad_dir / "tiny-squad.json", everything, max_length=96)
    assert count == 120 and len(json.loads(everything.read_text(encoding="utf-8"))) == 120


# ------------------------------------------------------------------------------------------------ shared data
def test_every_answer_of_the_shared_file_lies_in_a_window(data_dir, minilm_path):
    from bertology.tokenization import load_tokenizer

    path = data_dir / "squad" / "squad-v1.1-dev-part-a.json"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    task = get_task("squad")
    examples = task.read(path)
    tokenizer = load_tokenizer(minilm_path)  # BERT uncased WordPiece
    windows = task.encode(tokenizer, examples, 384, train=False)
    assert windows.num_questions == len(examples) == 5397
    assert int(windows.lengths.max()) <= 384
    outside = [(e.id, a.text) for q, e in enumerate(examples) for a in e.answers
               if not windows.windows_holding(q, a.start, a.end)]
    assert outside == []
    short = task.encode(tokenizer, examples, 128, train=False)  # the recipe's default length: more, shorter windows
    assert len(short) > 2 * len(windows)
    assert all(short.windows_holding(q, a.start, a.end) for q, e in enumerate(examples) for a in e.answers)
    # first answers labelled in at least one window each, CLS elsewhere
    labelled = np.zeros(len(examples), dtype=bool)
    labelled[windows.question[(windows.labels[:, 0] > 0).numpy()]] = True
    assert labelled.all()
    # the token span's text is the answer, except where an answer ends inside a word piece ('gold' in 'golden')
    differ = 0
    for q, e in enumerate(examples):
        for a in e.answers:
            span = answer_tokens(windows.context_offsets[q], a.start, a.end)
            differ += span_text(e.context, windows.context_offsets[q], span) != a.text
    assert differ == 44  # of 18,368 answers
    train, dev = (task.read(task.path(str(data_dir / "squad"), split)) for split in ("train", "dev"))
    assert (len(train), len(dev), len({e.title for e in dev})) == (4376, 1021, 6)
