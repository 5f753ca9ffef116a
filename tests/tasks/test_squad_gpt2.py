"""SQuAD v1.1 extractive on GPT-2 (transformers' GPT2ForQuestionAnswering): a pair framed with no special token
(question tokens, then the context's), windows without the answer labelled at their first token, a short
fine-tuning run on real questions of the shared data, and transformers reading the saved model with the same start
and end logits."""

from __future__ import annotations

import json

import pytest
import torch

from bertology.model import load
from bertology.recipes.finetune import FinetuneConfig, finetune
from bertology.tasks.lookup import get_task
from bertology.tasks.qa import PairFrame, QAWindows, write_squad_json
from finetune_helpers import save_family_model

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def questions(data_dir):
    path = data_dir / "squad" / "squad-v1.1-dev-part-a.json"
    if not path.is_file():
        pytest.skip(f"SQuAD data not found at {path}")
    return get_task("squad").read(path, 12)


@pytest.fixture(scope="module")
def gpt2(questions, tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    texts = [f"{e.question} {e.context}" for e in questions] * 2
    yield save_family_model(tmp_path_factory.mktemp("gpt2"), "gpt2", texts, positions=160)
    torch.set_num_threads(threads)


def test_a_pair_without_specials_points_windows_without_the_answer_at_their_first_token(questions, gpt2):
    tokenizer = load(gpt2).tokenizer
    frame = PairFrame.of(tokenizer)
    assert frame.specials == 0 and frame.null == 0
    example = questions[0]
    windows = QAWindows.encode(tokenizer, [example], 48, max_query_length=16, doc_stride=8)
    question = tokenizer.encode(example.question, add_special_tokens=False).ids[:16]
    first = windows.flat_ids[int(windows.offsets[0]):int(windows.offsets[1])].tolist()
    assert first[:len(question)] == question  # the question, then the context at once
    labels = windows.labels.tolist()
    inside = [w for w, (start, end) in enumerate(labels) if start > 0]
    assert inside and len(inside) < len(labels)  # some windows hold the answer, the others point at position 0
    assert all(labels[w] == [0, 0] for w in range(len(labels)) if w not in inside)
    w = inside[0]
    ids = windows.flat_ids[int(windows.offsets[w]):int(windows.offsets[w + 1])].tolist()
    start, end = labels[w]
    assert tokenizer.decode(ids[start:end + 1]).strip().lower() == example.answers[0].text.lower()


def test_gpt2_fine_tunes_extractively_and_transformers_reads_the_same_logits(questions, gpt2, tmp_path):
    folder = tmp_path / "squad"
    folder.mkdir()
    write_squad_json(folder / "train-v1.1.json", questions[:8])
    write_squad_json(folder / "dev-v1.1.json", questions[8:])
    out = tmp_path / "run"
    result = finetune(FinetuneConfig.from_dict({
        "model": str(gpt2), "task": {"name": "squad", "data": str(folder), "max_length": 96, "epochs": 1},
        "optim": {"batch_size": 8, "lr": 1e-3}, "run": {"output_dir": str(out), "progress": False},
        "speed": {"threads": 1, "prefetch": 0}}))
    assert result.steps > 0 and set(result.dev_metrics) == {"f1", "exact_match"}
    assert list(json.loads((out / "dev_predictions.json").read_text())) == [e.id for e in questions[8:]]
    saved = json.loads((out / "model" / "config.json").read_text())
    assert saved["architectures"] == ["GPT2ForQuestionAnswering"]
    hf = transformers.AutoModelForQuestionAnswering.from_pretrained(out / "model").eval()
    ours = load(out / "model")
    rows = [ours.tokenizer.encode(q.question, q.context[:80]).ids for q in questions[8:]]
    width = max(map(len, rows))
    ids = torch.tensor([row + [ours.tokenizer.pad_id] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    with torch.no_grad():
        logits = ours.model(ids, mask).head_logits["qa"]
        theirs = hf(input_ids=ids, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(logits[..., 0][real], theirs.start_logits[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[..., 1][real], theirs.end_logits[real], atol=1e-5, rtol=1e-5)


def test_a_gpt2_tokenizer_naming_no_padding_token_still_pads_task_batches(questions, gpt2):
    """transformers' GPT-2 tokenizer files name no pad token: task batches pad with id 0 (the mask hides it)."""
    import dataclasses

    from bertology.tasks.sequence import EncodedExamples
    from bertology.tokenization import Tokenizer

    named = load(gpt2).tokenizer
    bare = Tokenizer(named.backend, style="gpt2", specials=dataclasses.replace(named.specials, pad=None))
    assert bare.pad_id is None and bare.fill_id == 0
    windows = QAWindows.encode(bare, questions[:3], 48, max_query_length=16, doc_stride=8)
    sentences = EncodedExamples.from_texts(bare, ["the cat", "a much longer text than that"], max_length=16,
                                           shuffle=False)
    for encoded in (windows, sentences):
        batch = next(encoded.batches(0, 8, drop_last=False))
        assert batch.input_ids.dtype == torch.long and (batch.attention_mask == 0).any()
        assert (batch.input_ids[batch.attention_mask == 0] == 0).all()
