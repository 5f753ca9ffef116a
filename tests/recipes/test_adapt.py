"""Domain- and task-adaptive pretraining (docs/ADAPTATION.md): masked-LM pretraining continued from a model
directory without an MLM head, vocabulary extension, a task's training text as the corpus, then fine-tuning."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bertology.data.corpus import read_documents
from bertology.errors import ConfigError, DataError, TokenizerError
from bertology.model import load_model
from bertology.recipes.finetune import FinetuneConfig, finetune
from bertology.recipes.pretrain import build_model, build_tokenizer, pretrain
from bertology.tokenization import load_tokenizer, train_tokenizer
from bertology.tokenization.extend import old_pieces
from bertology.tokenization.training import MAX_VOCAB_SIZE
from bertology.training.config import PretrainConfig, load_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from finetune_helpers import cue_sentence, save_tiny_model  # noqa: E402
from pretrain_helpers import WORDS, assert_resume_is_bitwise, write_corpus  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[2]
# The base model knows a few of the corpus's words; the domain corpus (pretrain_helpers.WORDS) has many it lacks.
BASE_WORDS = "the cat dog bird sat ran over under house tree".split()


@pytest.fixture
def base(tmp_path) -> Path:
    """A tiny random BERT saved as transformers' BertModel: no masked-LM head."""
    directory = save_tiny_model(tmp_path / "base", [" ".join(BASE_WORDS)] * 5, vocab_size=60)
    assert json.loads((directory / "config.json").read_text())["architectures"] == ["BertModel"]
    return directory


def adapt_config(tmp_path: Path, init_from: Path, corpus: Path, run: str = "run", **tokenizer) -> dict:
    return {"model": {"init_from": str(init_from)}, "tokenizer": tokenizer,
            "data": {"corpus": [str(corpus)], "instances": {"kind": "doc-sentences", "max_seq_length": 32}},
            "optim": {"batch_size": 4, "total_steps": 2, "lr": 1e-3, "warmup_steps": 1},
            "run": {"seed": 0, "output_dir": str(tmp_path / run), "log_every": 1, "progress": False,
                    "checkpoint_every": 0},
            "speed": {"threads": 1, "prefetch": 0}}


def hf_agrees(model_dir: Path, texts: list[str]) -> None:
    """transformers' masked-LM class (BertForMaskedLM, RobertaForMaskedLM) and tokenizer load ``model_dir`` to the
    same ids and the same logits at every position as bertology's; the decoder is tied to the word embeddings."""
    transformers = pytest.importorskip("transformers")
    ours = load_model(model_dir).eval()
    tokenizer = load_tokenizer(model_dir)
    theirs = transformers.AutoModelForMaskedLM.from_pretrained(model_dir).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    assert theirs.get_output_embeddings().weight.data_ptr() == theirs.get_input_embeddings().weight.data_ptr()
    batch = tokenizer.encode_batch(texts)
    hf = hf_tokenizer(texts, padding=True, return_tensors="pt")
    assert hf["input_ids"].tolist() == batch.input_ids.tolist()
    with torch.no_grad():
        expected = theirs(**hf).logits
        got = ours(batch.input_ids, batch.attention_mask, batch.token_type_ids).head_logits["mlm"]
    real = batch.attention_mask.bool()
    # float32 logits of a 2-layer, 32-wide model: rounding differences of a few ulps of values ~1 (both sum the same
    # products in other orders).
    torch.testing.assert_close(got[real], expected[real], rtol=1e-4, atol=1e-5)


def test_continuing_from_a_model_without_an_mlm_head_builds_the_family_head_tied_to_the_embeddings(tmp_path, base):
    corpus = write_corpus(tmp_path / "domain.txt")
    config = PretrainConfig.from_dict(adapt_config(tmp_path, base, corpus))
    tokenizer = build_tokenizer(config)  # keep: the model directory's own tokenizer
    assert tokenizer.backend.get_vocab() == load_tokenizer(base).backend.get_vocab()
    torch.manual_seed(123)
    model = build_model(config, tokenizer, config.build_objectives())
    pretrained = load_model(base)
    for name, value in pretrained.state_dict().items():  # the body is the checkpoint's
        torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=0)
    head = model.heads["mlm"]
    vocab = tokenizer.vocab_size
    # BERT's initialisation: normal(0, initializer_range) weights, zero biases, LayerNorm (1, 0); the decoder is the
    # word-embedding matrix (no parameter of its own).
    assert not any(vocab in p.shape for name, p in head.named_parameters() if name != "bias")
    assert torch.equal(head.bias, torch.zeros(vocab))
    assert torch.equal(head.norm.weight, torch.ones(32)) and torch.equal(head.norm.bias, torch.zeros(32))
    std = float(head.dense.weight.detach().std())
    assert abs(std - 0.02) < 0.02 * 5 / np.sqrt(32 * 32)  # 1,024 draws: the sample std within 5 standard errors
    assert torch.equal(head.dense.bias, torch.zeros(32))
    ids = torch.tensor([[tokenizer.cls_id, 5, 6, tokenizer.sep_id]])
    out = model.eval()(ids, torch.ones_like(ids), torch.zeros_like(ids))
    transformed = head.norm(head.act(head.dense(out.last_hidden_state)))
    torch.testing.assert_close(out.head_logits["mlm"], transformed @ model.word_embeddings.weight.T + head.bias)
    # The same head from the same seed in every run: it is seeded by run.seed, not by torch's global generator.
    torch.manual_seed(7)
    again = build_model(config, tokenizer, config.build_objectives())
    assert torch.equal(again.heads["mlm"].dense.weight, head.dense.weight)


def test_dapt_continues_a_headless_model_and_saves_the_transformers_layout(tmp_path, base):
    corpus = write_corpus(tmp_path / "domain.txt")
    result = pretrain(PretrainConfig.from_dict(adapt_config(tmp_path, base, corpus)))
    assert result.steps == 2 and np.isfinite(result.metrics["mlm_loss"])
    saved = json.loads((result.model_dir / "config.json").read_text())
    assert saved["architectures"] == ["BertForMaskedLM"] and saved["vocab_size"] == load_tokenizer(base).vocab_size
    hf_agrees(result.model_dir, ["the cat sat under the tree .", "a dog ran over the house"])


def test_extend_adds_the_domains_frequent_entries_initialised_from_their_old_pieces(tmp_path, base):
    corpus = write_corpus(tmp_path / "domain.txt")
    raw = adapt_config(tmp_path, base, corpus, adapt="extend", extend_size=6, vocab_size=200, min_frequency=1)
    config = PretrainConfig.from_dict(raw)
    old = load_tokenizer(base)
    tokenizer = build_tokenizer(config)
    assert tokenizer.vocab_size == old.vocab_size + 6
    for index in range(old.vocab_size):  # every old id kept
        assert tokenizer.id_to_token(index) == old.id_to_token(index)
    added = [tokenizer.id_to_token(i) for i in range(old.vocab_size, tokenizer.vocab_size)]
    # The most frequent entries of a domain tokenizer trained on the corpus, absent from the old vocabulary:
    # counted here by hand from the corpus's words (every corpus word is a whole entry of the domain vocabulary).
    counts: dict[str, int] = {}
    for document in read_documents(corpus):
        for sentence in document:
            for word in sentence.replace(".", " . ").split():
                counts[word] = counts.get(word, 0) + 1
    new = sorted((w for w in counts if old.token_to_id(w) is None), key=lambda w: (-counts[w], w))
    assert added == new[:6]
    # The extended tokenizer matches them as whole words.
    assert tokenizer.encode(added[1]).ids[1:-1] == [old.vocab_size + 1]
    pretrained = load_model(base)
    model = build_model(config, tokenizer, config.build_objectives())
    weight = model.word_embeddings.weight
    torch.testing.assert_close(weight[:old.vocab_size], pretrained.word_embeddings.weight, rtol=0, atol=0)
    for offset, entry in enumerate(added):
        # The old pieces as the old tokenizer splits the word (its own encoding, without specials).
        pieces = old.encode(entry).ids[1:-1]
        assert old_pieces(old, entry) == pieces
        expected = pretrained.word_embeddings.weight[pieces].double().mean(0).float()
        torch.testing.assert_close(weight[old.vocab_size + offset], expected, rtol=1e-6, atol=1e-7)
    assert model.heads["mlm"].bias.shape == (tokenizer.vocab_size,)
    assert model.config.vocab_size == tokenizer.vocab_size


def test_extend_vocabulary_grows_the_embeddings_and_the_mlm_bias():
    from bertology.model import EncoderModel, HeadSpec, preset
    from bertology.model.vocabulary import extend_vocabulary

    config = preset("tiny", vocab_size=20, num_layers=1, hidden_size=16, num_heads=2, intermediate_size=32,
                    max_position_embeddings=16)
    model = EncoderModel(config, [HeadSpec("mlm", "masked_lm", activation="gelu")])
    model.init_weights(torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.heads["mlm"].bias.normal_(generator=torch.Generator().manual_seed(1))
    weight, bias = model.word_embeddings.weight.clone(), model.heads["mlm"].bias.clone()
    extend_vocabulary(model, [[3, 4, 5], [7]])
    assert model.config.vocab_size == 22 and model.word_embeddings.num_embeddings == 22
    torch.testing.assert_close(model.word_embeddings.weight[:20], weight, rtol=0, atol=0)
    torch.testing.assert_close(model.word_embeddings.weight[20], weight[3:6].mean(0))
    torch.testing.assert_close(model.word_embeddings.weight[21], weight[7], rtol=0, atol=0)
    torch.testing.assert_close(model.heads["mlm"].bias[20], bias[3:6].mean())
    torch.testing.assert_close(model.heads["mlm"].bias[21], bias[7], rtol=0, atol=0)
    # The grown model runs on the new ids and trains them (the decoder is the tied, grown matrix).
    ids = torch.tensor([[2, 20, 21, 3]])
    logits = model(ids, torch.ones_like(ids), torch.zeros_like(ids)).head_logits["mlm"]
    assert logits.shape == (1, 4, 22)
    logits[0, 1, 21].backward()
    assert model.word_embeddings.weight.grad[21].abs().sum() > 0
    with pytest.raises(ConfigError, match=r"new id 22 needs old pieces among 0..21, got \[22\]"):
        extend_vocabulary(model, [[22]])
    untied = EncoderModel(config, [HeadSpec("lm", "lm")])
    with pytest.raises(ConfigError, match="the lm head 'lm' has weights over the vocabulary that are not grown"):
        extend_vocabulary(untied, [[3]])


def test_an_extended_run_resumes_bitwise(tmp_path, base):
    corpus = write_corpus(tmp_path / "domain.txt")

    def make_raw(output_dir: Path) -> dict:
        raw = adapt_config(tmp_path, base, corpus, run=output_dir.name, adapt="extend", extend_size=4,
                           vocab_size=200, min_frequency=1)
        raw["optim"]["total_steps"] = 4
        raw["run"].update(checkpoint_every=1, keep_last=2)
        return raw

    assert_resume_is_bitwise(make_raw, tmp_path, crash_at=2)


def test_old_pieces_of_a_wordpiece_continuation(tmp_path):
    old = train_tokenizer(iter(["electro magnet ##ic electrode"] * 3), "wordpiece", 60, show_progress=False,
                          min_frequency=1)
    vocab = old.backend.get_vocab()
    pieces = old_pieces(old, "##trode")
    assert all(old.id_to_token(i).startswith("##") for i in pieces)  # the inside of a word, as WordPiece splits it
    assert "".join(old.id_to_token(i)[2:] for i in pieces) == "trode"
    assert old_pieces(old, "electrode") == old.encode("electrode").ids[1:-1]
    assert old_pieces(old, "\u2603") == [vocab["[UNK]"]]  # nothing to split it into


def test_an_extended_model_loads_in_transformers_with_the_same_outputs(tmp_path, base):
    corpus = write_corpus(tmp_path / "domain.txt")
    raw = adapt_config(tmp_path, base, corpus, adapt="extend", extend_size=8, vocab_size=200, min_frequency=1)
    result = pretrain(PretrainConfig.from_dict(raw))
    tokenizer = load_tokenizer(result.model_dir)
    assert tokenizer.vocab_size == load_tokenizer(base).vocab_size + 8
    assert json.loads((result.model_dir / "config.json").read_text())["vocab_size"] == tokenizer.vocab_size
    hf_agrees(result.model_dir, ["the river near the green garden .", "quick blue water under a dark window"])
    # Fine-tuning starts from the extended model and its tokenizer.
    tuned = finetune_briefly(result.model_dir, write_sst2(tmp_path / "glue"), tmp_path / "finetuned")
    assert tuned.steps == 4
    assert load_model(tuned.model_dir).config.vocab_size == tokenizer.vocab_size
    assert load_tokenizer(tuned.model_dir).backend.get_vocab() == tokenizer.backend.get_vocab()


def test_a_byte_level_bpe_vocabulary_extended_through_its_merges(tmp_path):
    """A RoBERTa-style model: each new entry comes with the merge that makes it, appended after the old merges."""
    base_corpus = tmp_path / "base.txt"
    base_corpus.write_text("\n".join(" ".join(WORDS[i:i + 6]) for i in range(12)) + "\n")
    common = {"optim": {"batch_size": 2, "total_steps": 1}, "speed": {"threads": 1, "prefetch": 0}}
    first = pretrain(PretrainConfig.from_dict({
        "model": {"family": "roberta", "preset": None, "hidden_size": 32, "num_layers": 1, "num_heads": 2,
                  "intermediate_size": 64, "max_position_embeddings": 80},
        "tokenizer": {"adapt": "new", "kind": "bpe", "vocab_size": 300, "min_frequency": 1},
        "data": {"corpus": [str(base_corpus)], "instances": {"kind": "doc-sentences", "max_seq_length": 32}},
        "run": {"output_dir": str(tmp_path / "base"), "progress": False, "checkpoint_every": 0}, **common}))
    old = load_tokenizer(first.model_dir)
    corpus = write_corpus(tmp_path / "domain.txt")
    raw = adapt_config(tmp_path, first.model_dir, corpus, adapt="extend", kind="bpe", extend_size=10,
                       vocab_size=400, min_frequency=1)
    result = pretrain(PretrainConfig.from_dict(raw))
    new = load_tokenizer(result.model_dir)
    assert new.vocab_size == old.vocab_size + 10
    merges = (result.model_dir / "merges.txt").read_text().splitlines()
    assert merges[:-10] == (first.model_dir / "merges.txt").read_text().splitlines()
    for merge, index in zip(merges[-10:], range(old.vocab_size, new.vocab_size)):
        assert merge.replace(" ", "") == new.id_to_token(index)  # the merge making the new entry
        # ... from parts the old vocabulary or an earlier new entry has.
        assert all(old.token_to_id(part) is not None or new.token_to_id(part) < index for part in merge.split(" "))
    text = corpus.read_text().splitlines()
    assert any(i >= old.vocab_size for line in text for i in new.encode(line).ids)  # the new entries are used
    hf_agrees(result.model_dir, text[:2])


def write_sst2(directory: Path) -> Path:
    """SST-2-format train.tsv (64 rows) and dev.tsv (16) of cue sentences under ``directory``/SST-2."""
    rng = np.random.default_rng(0)
    glue = directory / "SST-2"
    glue.mkdir(parents=True)
    for split, n in (("train", 64), ("dev", 16)):
        rows = [(cue_sentence(rng, label), label) for label in rng.integers(0, 2, n)]
        (glue / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s} \t{y}\n" for s, y in rows))
    return glue


def finetune_briefly(model_dir: Path, glue: Path, output_dir: Path):
    return finetune(FinetuneConfig.from_dict({
        "model": str(model_dir), "task": {"name": "sst2", "data": str(glue.parent), "epochs": 1},
        "optim": {"batch_size": 16, "lr": 1e-3},
        "run": {"output_dir": str(output_dir), "progress": False}, "speed": {"threads": 1, "prefetch": 0}}))


def test_tapt_reads_a_glue_tasks_training_text_and_finetune_starts_from_the_result(tmp_path, base):
    glue = write_sst2(tmp_path / "glue")
    sentences = [line.split("\t")[0] for line in (glue / "train.tsv").read_text().splitlines()[1:]]
    # The directory gives its train.tsv only; each example is one document of one sentence, labels left out.
    assert [d for d in read_documents(glue, "glue", task="sst2")] == [[s] for s in sentences]
    raw = adapt_config(tmp_path, base, glue, run="tapt")
    raw["data"].update(format="glue", task="sst2", heldout_documents=4)
    result = pretrain(PretrainConfig.from_dict(raw))
    assert result.steps == 2
    metadata = json.loads((tmp_path / "tapt" / "shards" / "metadata.json").read_text())
    assert metadata["sources"][0]["task"] == "sst2"
    assert metadata["sources"][0]["files"] == [str(glue / "train.tsv")]
    tuned = finetune_briefly(result.model_dir, glue, tmp_path / "finetuned")
    assert tuned.steps == 4 and 0.0 <= tuned.dev_metrics["accuracy"] <= 100.0  # per cent
    adapted = load_model(result.model_dir)
    tuned_model = load_model(tuned.model_dir)
    assert not torch.equal(tuned_model.word_embeddings.weight, adapted.word_embeddings.weight)  # it trained
    assert tuned_model.config.vocab_size == adapted.config.vocab_size


def test_continuing_all_minilm_l6_v2(tmp_path, minilm_path):
    """The sentence encoder has no masked-LM head: one step of MLM gives a BertForMaskedLM that transformers loads
    to the same outputs."""
    corpus = write_corpus(tmp_path / "domain.txt", documents=8)
    raw = adapt_config(tmp_path, minilm_path, corpus)
    raw["optim"].update(total_steps=1, batch_size=2, lr=1e-5)
    result = pretrain(PretrainConfig.from_dict(raw))
    assert result.steps == 1
    assert json.loads((result.model_dir / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    hf_agrees(result.model_dir, ["the quick dog ran over the river ."])


def test_shipped_adaptation_configs():
    dapt = load_config(ROOT / "configs" / "adapt-dapt.yaml")
    assert dapt.tokenizer.adapt == "extend" and dapt.tokenizer.extend_size == 500 and dapt.model.init_from
    tapt = load_config(ROOT / "configs" / "adapt-tapt.yaml")
    assert tapt.tokenizer.adapt == "keep" and tapt.data.format == "glue" and tapt.data.task == "sst2"


# --- bad input ------------------------------------------------------------------------------------------------------


def test_an_init_model_whose_vocabulary_does_not_match_the_tokenizer(tmp_path, base):
    corpus = write_corpus(tmp_path / "domain.txt")
    other = tmp_path / "other-tokenizer"
    train_tokenizer([str(corpus)], "wordpiece", 90, show_progress=False, min_frequency=1).save(other)
    raw = adapt_config(tmp_path, base, corpus, path=str(other))
    with pytest.raises(TokenizerError, match=rf"model.init_from {base}: the tokenizer does not match the model: "
                                             r"vocab_size 58 != tokenizer vocabulary \d+"):
        pretrain(PretrainConfig.from_dict(raw))
    # Extending from a tokenizer that is not the model's: the same error, before anything is trained.
    raw = adapt_config(tmp_path, base, corpus, run="extend", path=str(other), adapt="extend", extend_size=4,
                       vocab_size=200, min_frequency=1)
    with pytest.raises(TokenizerError, match=rf"model.init_from {base}: the tokenizer does not match the model"):
        pretrain(PretrainConfig.from_dict(raw))


def test_an_extension_past_the_id_range(tmp_path, base):
    corpus = write_corpus(tmp_path / "domain.txt")
    size = MAX_VOCAB_SIZE - 58 + 1
    raw = adapt_config(tmp_path, base, corpus, adapt="extend", extend_size=size, vocab_size=200)
    with pytest.raises(TokenizerError, match=rf"extending its 58 entries by {size} would give ids up to "
                                             rf"{MAX_VOCAB_SIZE}, past the id range of {MAX_VOCAB_SIZE} entries"):
        pretrain(PretrainConfig.from_dict(raw))
    assert not (tmp_path / "run" / "tokenizer").exists()


def test_an_init_directory_that_does_not_exist(tmp_path):
    corpus = write_corpus(tmp_path / "domain.txt")
    missing = tmp_path / "no-such-model"
    with pytest.raises(ConfigError, match=rf"model.init_from: {missing} does not exist"):
        pretrain(PretrainConfig.from_dict(adapt_config(tmp_path, missing, corpus)))
    assert not (tmp_path / "run" / "shards").exists()  # refused before any work


def test_an_init_directory_without_a_tokenizer(tmp_path, base):
    from bertology.model import save_model

    bare = tmp_path / "bare"
    save_model(load_model(base), bare)  # the weights alone
    corpus = write_corpus(tmp_path / "domain.txt")
    with pytest.raises(TokenizerError, match=rf"model.init_from: {bare}: no tokenizer files .* or give "
                                             r"tokenizer.path"):
        pretrain(PretrainConfig.from_dict(adapt_config(tmp_path, bare, corpus)))
    # With tokenizer.path the same directory continues.
    assert pretrain(PretrainConfig.from_dict(adapt_config(tmp_path, bare, corpus, run="with-path",
                                                          path=str(base)))).steps == 2


def test_extending_with_another_kind_or_with_nothing_new(tmp_path, base):
    corpus = write_corpus(tmp_path / "domain.txt")
    raw = adapt_config(tmp_path, base, corpus, adapt="extend", extend_size=4, kind="bpe", vocab_size=200)
    with pytest.raises(ConfigError, match=r"tokenizer.kind: bpe entries cannot extend tokenizer .*, a wordpiece "
                                          r"tokenizer; set tokenizer.kind: wordpiece"):
        pretrain(PretrainConfig.from_dict(raw))
    # The model's own training text: the domain tokenizer learnt from it is the model's, nothing is new.
    same = tmp_path / "same.txt"
    same.write_text("\n".join([" ".join(BASE_WORDS)] * 5) + "\n")
    raw = adapt_config(tmp_path, base, same, run="same", adapt="extend", extend_size=4, vocab_size=60,
                       min_frequency=1)
    with pytest.raises(DataError, match=r"has no entry that tokenizer .* lacks; nothing to extend it with"):
        pretrain(PretrainConfig.from_dict(raw))


@pytest.mark.parametrize("tokenizer, model, match", [
    ({"adapt": "extend", "extend_size": 4}, {}, "tokenizer.adapt: extend grows the vocabulary of model.init_from"),
    ({"adapt": "extend"}, {"init_from": "x"}, "tokenizer.extend_size: adapt extend adds this many entries"),
    ({"extend_size": 4}, {}, "tokenizer.extend_size: read with adapt extend only"),
    ({"adapt": "new"}, {"init_from": "x"}, "tokenizer.adapt: new is a fresh vocabulary"),
    ({"adapt": "new", "path": "x"}, {}, "tokenizer.path: adapt new trains a fresh vocabulary"),
    ({"adapt": "extend", "extend_size": 4, "kind": "unigram"}, {"init_from": "x"}, "tokenizer.kind: adapt extend"),
    ({"adapt": "grow"}, {}, "tokenizer.adapt"),
])
def test_adaptation_config_errors(tokenizer, model, match):
    raw = {"model": model, "tokenizer": tokenizer, "data": {"corpus": ["c.txt"]}}
    with pytest.raises(ConfigError, match=match):
        PretrainConfig.from_dict(raw)


def test_a_new_vocabulary_is_pretraining_from_scratch_with_a_trained_tokenizer(tmp_path):
    corpus = write_corpus(tmp_path / "domain.txt")
    raw = {"model": {"preset": None, "hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64,
                     "max_position_embeddings": 64},
           "tokenizer": {"adapt": "new", "vocab_size": 300, "min_frequency": 1},
           "data": {"corpus": [str(corpus)], "instances": {"kind": "doc-sentences", "max_seq_length": 32}},
           "optim": {"batch_size": 4, "total_steps": 1}, "run": {"output_dir": str(tmp_path / "run"),
                                                                  "progress": False, "checkpoint_every": 0},
           "speed": {"threads": 1, "prefetch": 0}}
    result = pretrain(PretrainConfig.from_dict(raw))
    trained = load_tokenizer(tmp_path / "run" / "tokenizer")
    assert set(WORDS) <= set(trained.backend.get_vocab())  # the corpus's own vocabulary
    assert load_model(result.model_dir).config.vocab_size == trained.vocab_size

