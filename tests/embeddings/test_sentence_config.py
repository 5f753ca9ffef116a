"""`embed` on a sentence-transformers directory follows its own files (pooling, max_seq_length with truncation,
Normalize, prompts, do_lower_case), so that it gives what `SentenceTransformer.encode` gives."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bertology.embeddings import embed, read_sentence_config
from bertology.errors import ConfigError
from bertology.model import Pretrained, load

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = "the bank of the river was steep and muddy after rain while children played near old boats".split()
SHORT = ["A cat sat on the mat.", "", "Paris is the capital of France."]


def long_text(seed: int = 0, words: int = 420) -> str:
    return " ".join(np.random.default_rng(seed).choice(WORDS, words))


def st_copy(minilm_path: Path, target: Path, *, pooling: dict | None = None, prompts: dict | None = None,
            modules: list | None = None, settings: dict | None = None) -> Path:
    """A copy of the MiniLM directory (its weights linked, not copied) with some of its files rewritten."""
    shutil.copytree(minilm_path, target, ignore=shutil.ignore_patterns("*.safetensors"))
    (target / "model.safetensors").symlink_to(minilm_path / "model.safetensors")
    if pooling is not None:
        file = target / "1_Pooling" / "config.json"
        file.write_text(json.dumps({**json.loads(file.read_text()), **pooling}))
    if prompts is not None:
        (target / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    if modules is not None:
        (target / "modules.json").write_text(json.dumps(modules))
    if settings is not None:
        file = target / "sentence_bert_config.json"
        file.write_text(json.dumps({**json.loads(file.read_text()), **settings}))
    return target


@pytest.fixture(scope="module")
def minilm(minilm_path) -> Pretrained:
    return load(minilm_path)


def direct_mean(model: Pretrained, text: str, limit: int | None = None, skip: int = 0) -> np.ndarray:
    """The mean of the last layer over a text's framed tokens ([CLS] ... [SEP]), the content cut at `limit`
    tokens and the first `skip` rows left out, computed in float64 from the model's own forward."""
    ids = model.tokenizer.encode(text, add_special_tokens=False).ids[:limit]
    framed = [model.tokenizer.token_to_id("[CLS]"), *ids, model.tokenizer.token_to_id("[SEP]")]
    with torch.inference_mode():
        out = model.model(torch.tensor([framed]), torch.ones(1, len(framed), dtype=torch.long),
                          output_hidden_states=True)
    hidden = out.hidden_states[-1][0].double().numpy()
    return hidden[skip:].mean(0)


def test_minilm_settings_are_read(minilm_path):
    settings = read_sentence_config(minilm_path)
    assert (settings.sentence, settings.max_length, settings.normalize, settings.lower_case, settings.prompts,
            settings.default_prompt, settings.include_prompt) == ("mean", 256, True, False, {}, None, True)


def test_defaults_truncate_at_max_seq_length_and_normalise(minilm):
    texts = [*SHORT, long_text()]
    got = embed(minilm, texts, levels=("sentence",)).sentences
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    for i, text in enumerate(texts):
        expected = direct_mean(minilm, text, limit=254)  # 256 positions, two of them specials
        expected /= np.linalg.norm(expected)
        np.testing.assert_allclose(got[i], expected, atol=2e-6)
    assert len(minilm.tokenizer.encode(texts[-1], add_special_tokens=False).ids) > 400
    # Windows stay an explicit option: the whole text, its direction different from the truncated one's.
    windows = embed(minilm, texts[-1:], levels=("sentence",), long_texts="windows").sentences[0]
    assert float(windows @ got[-1]) < 0.999
    plain = embed(minilm, texts, levels=("sentence",), model_settings=False)
    assert plain.window_length == 512 and not np.allclose(np.linalg.norm(plain.sentences, axis=1), 1.0)
    unnormalised = embed(minilm, texts[:1], levels=("sentence",), normalize=False).sentences[0]
    np.testing.assert_allclose(unnormalised / np.linalg.norm(unnormalised), got[0], atol=1e-6)
    np.testing.assert_allclose(unnormalised, direct_mean(minilm, texts[0]), atol=2e-5)


def test_a_default_prompt_left_out_of_the_pooling(minilm_path, tmp_path):
    directory = st_copy(minilm_path, tmp_path / "st", pooling={"include_prompt": False},
                        prompts={"prompts": {"query": "query: ", "passage": "passage: "},
                                 "default_prompt_name": "query"})
    model = load(directory)
    text = "Where is the river bank?"
    result = embed(model, [text])
    skip = 1 + len(model.tokenizer.encode("query: ", add_special_tokens=False).ids)  # [CLS] and the prompt
    expected = direct_mean(model, "query: " + text, skip=skip)
    np.testing.assert_allclose(result.sentences[0], expected / np.linalg.norm(expected), atol=2e-6)
    # Token and word offsets index the text as given, without the prompt's tokens.
    assert [text[a:b] for a, b in zip(result.words.start, result.words.end)] == \
        ["Where", "is", "the", "river", "bank", "?"]
    assert result.tokens.strings[0] == "where" and result.texts == [text]
    other = embed(model, [text], prompt_name="passage", levels=("sentence",)).sentences[0]
    expected = direct_mean(model, "passage: " + text, skip=1 + 2)
    np.testing.assert_allclose(other, expected / np.linalg.norm(expected), atol=2e-6)
    given = embed(model, [text], prompt="", levels=("sentence",)).sentences[0]
    expected = direct_mean(model, text)
    np.testing.assert_allclose(given, expected / np.linalg.norm(expected), atol=2e-6)
    with pytest.raises(ConfigError, match=r"prompt_name: 'doc' is not a prompt of .*config_sentence_transformers"
                                          r"\.json \(it has passage, query\)"):
        embed(model, [text], prompt_name="doc")
    with pytest.raises(ConfigError, match="give one of them, not both"):
        embed(model, [text], prompt="x", prompt_name="query")


def test_cls_and_max_pooling_and_lower_case(minilm_path, tmp_path):
    cls_dir = st_copy(minilm_path, tmp_path / "cls", pooling={"pooling_mode_mean_tokens": False,
                                                              "pooling_mode_cls_token": True},
                      modules=[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                               {"idx": 1, "name": "1", "path": "1_Pooling",
                                "type": "sentence_transformers.models.Pooling"}])
    model = load(cls_dir)
    result = embed(model, SHORT, levels=("sentence",))
    assert result.sentence == "cls"
    np.testing.assert_allclose(result.sentences, embed(model, SHORT, sentence="cls", model_settings=False,
                                                       levels=("sentence",)).sentences, atol=1e-6)
    assert not np.allclose(np.linalg.norm(result.sentences, axis=1), 1.0)  # no Normalize module here
    max_dir = st_copy(minilm_path, tmp_path / "max", pooling={"pooling_mode": "max"},
                      settings={"do_lower_case": True})
    model = load(max_dir)
    result = embed(model, ["Paris IS Big"], levels=("sentence", "word"))
    ids = model.tokenizer.encode("paris is big", add_special_tokens=True).ids
    with torch.inference_mode():
        hidden = model.model(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long),
                             output_hidden_states=True).hidden_states[-1][0].numpy()
    expected = hidden.max(0)
    np.testing.assert_allclose(result.sentences[0], expected / np.linalg.norm(expected), atol=2e-6)
    assert result.words.strings == ["Paris", "IS", "Big"]


def test_directory_errors(minilm_path, tmp_path):
    dense = st_copy(minilm_path, tmp_path / "dense", modules=[
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}])
    with pytest.raises(ConfigError, match=r"modules\.json: module '2' of type 'sentence_transformers\.models\.Dense' "
                                          r"is not supported"):
        read_sentence_config(dense)
    prompts = st_copy(minilm_path, tmp_path / "prompts", prompts={"prompts": {"q": "q: "},
                                                                   "default_prompt_name": "query"})
    with pytest.raises(ConfigError, match=r"config_sentence_transformers\.json: default_prompt_name 'query' is not "
                                          r"one of its prompts \(q\)"):
        read_sentence_config(prompts)
    weighted = st_copy(minilm_path, tmp_path / "weighted", pooling={"pooling_mode_mean_tokens": False,
                                                                    "pooling_mode_weightedmean_tokens": True})
    with pytest.raises(ConfigError, match=r"1_Pooling/config\.json: pooling weightedmean is not supported"):
        read_sentence_config(weighted)
    both = st_copy(minilm_path, tmp_path / "both", pooling={"pooling_mode": ["mean", "max"]})
    with pytest.raises(ConfigError, match=r"pooling mean \+ max is not supported"):
        read_sentence_config(both)
    length = st_copy(minilm_path, tmp_path / "length", settings={"max_seq_length": "long"})
    with pytest.raises(ConfigError, match=r"sentence_bert_config\.json: max_seq_length must be an integer"):
        read_sentence_config(length)
    flag = st_copy(minilm_path, tmp_path / "flag", pooling={"include_prompt": "no"})
    with pytest.raises(ConfigError, match=r"include_prompt must be true or false"):
        read_sentence_config(flag)


def test_embed_option_errors(minilm):
    with pytest.raises(ConfigError, match='long_texts: unknown \'all\'; expected "windows" or "truncate"'):
        embed(minilm, SHORT, long_texts="all")
    with pytest.raises(ConfigError, match="normalize must be True or False"):
        embed(minilm, SHORT, normalize="yes")
    inner = Pretrained(model=minilm.model, tokenizer=minilm.tokenizer)  # built in memory: no directory
    with pytest.raises(ConfigError, match="not a sentence-transformers directory with named prompts"):
        embed(inner, SHORT, prompt_name="query")


@pytest.fixture(scope="module")
def sentence_transformers():
    return pytest.importorskip("sentence_transformers", reason="sentence-transformers is not installed")


@pytest.mark.slow
def test_embed_equals_sentence_transformers_encode(minilm, minilm_path, sentence_transformers):
    reference = sentence_transformers.SentenceTransformer(str(minilm_path), device="cpu")
    texts = [*SHORT, long_text(0), long_text(1, 600), "a long text " * 150]
    expected = reference.encode(texts, convert_to_numpy=True)
    got = embed(minilm, texts, levels=("sentence",)).sentences
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert np.all((got * expected).sum(1) > 1 - 1e-6)


@pytest.mark.slow
def test_prompts_and_pooling_equal_sentence_transformers(minilm_path, tmp_path, sentence_transformers):
    texts = ["Where is the river bank?", long_text(2), ""]
    cases = {
        "prompt excluded": dict(pooling={"include_prompt": False},
                                prompts={"prompts": {"query": "query: "}, "default_prompt_name": "query"}),
        "prompt included": dict(prompts={"prompts": {"query": "Represent this: "}, "default_prompt_name": "query"}),
        "max": dict(pooling={"pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": True}),
        "cls": dict(pooling={"pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True},
                    settings={"max_seq_length": 128}),
    }
    for name, changes in cases.items():
        directory = st_copy(minilm_path, tmp_path / name.replace(" ", "-"), **changes)
        reference = sentence_transformers.SentenceTransformer(str(directory), device="cpu")
        expected = reference.encode(texts, convert_to_numpy=True)
        got = embed(load(directory), texts, levels=("sentence",)).sentences
        np.testing.assert_allclose(got, expected, atol=1e-6, err_msg=name)


def test_the_embed_command_follows_the_directory(minilm, minilm_path, tmp_path):
    from bertology.cli.main import main

    source = tmp_path / "in.txt"
    source.write_text(f"A cat sat on the mat.\n{long_text()}\n", encoding="utf-8")
    texts = ["A cat sat on the mat.", long_text()]
    assert main(["embed", "--model", str(minilm_path), "--input", str(source), "--output",
                 str(tmp_path / "st.npy")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "st.npy"), embed(minilm, texts, levels=("sentence",)).sentences,
                               atol=1e-6)
    assert main(["embed", "--model", str(minilm_path), "--input", str(source), "--output",
                 str(tmp_path / "windows.npy"), "--long-texts", "windows", "--no-normalize"]) == 0
    expected = embed(minilm, texts, levels=("sentence",), model_settings=False).sentences
    np.testing.assert_allclose(np.load(tmp_path / "windows.npy"), expected, atol=1e-5)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("x\n", encoding="utf-8")
    assert main(["embed", "--model", str(minilm_path), "--input", str(tmp_path / "corpus"), "--output",
                 str(tmp_path / "vectors"), "--normalize"]) == 2
    assert not (tmp_path / "vectors").exists()
