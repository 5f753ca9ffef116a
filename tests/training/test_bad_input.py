"""Bad input surfaces as a clear bertology error: an empty corpus, single-sentence documents under NSP,
a tokenizer that does not fit the model or the shards."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertology.cli.main import main
from bertology.errors import ConfigError, DataError, TokenizerError
from bertology.recipes.pretrain import pretrain
from bertology.tokenization import train_tokenizer
from pretrain_helpers import build, tiny_config, write_corpus


def _config_without_shards(assets, tmp_path: Path, corpus: Path, **sections) -> dict:
    raw = tiny_config(assets, tmp_path / "run", **sections)
    raw["data"].pop("shards")
    raw["data"]["corpus"] = [str(corpus)]
    return raw


def test_empty_corpus(assets, tmp_path):
    corpus = tmp_path / "empty.txt"
    corpus.write_text("\n\n\n")
    with pytest.raises(DataError, match="empty corpus"):
        pretrain(build(_config_without_shards(assets, tmp_path, corpus)))


def test_one_sentence_documents_under_nsp(assets, tmp_path, capsys):
    corpus = write_corpus(tmp_path / "single.txt", documents=10, sentences=(1, 1))
    raw = _config_without_shards(assets, tmp_path, corpus)
    with pytest.raises(DataError, match="every document has one sentence; NSP needs two"):
        pretrain(build(raw))
    # Through the command line: exit status 2 and the same message.
    config = tmp_path / "single.json"
    import json

    raw["run"]["output_dir"] = str(tmp_path / "cli-run")
    config.write_text(json.dumps(raw))
    assert main(["pretrain", "--config", str(config)]) == 2
    assert "NSP needs two" in capsys.readouterr().err
    # Without NSP the same corpus trains.
    raw["run"]["output_dir"] = str(tmp_path / "mlm-only")
    raw["data"]["instances"]["kind"] = "doc-sentences"
    raw["optim"]["total_steps"] = 1
    assert pretrain(build(raw)).steps == 1


def test_model_vocab_size_must_match_the_tokenizer(assets, tmp_path):
    raw = tiny_config(assets, tmp_path / "run", model={"vocab_size": 30522})
    with pytest.raises(TokenizerError, match="model.vocab_size is 30522 but the tokenizer's is"):
        pretrain(build(raw))


def test_init_from_a_model_with_another_vocabulary(assets, tmp_path):
    first = tiny_config(assets, tmp_path / "first", optim={"total_steps": 1})
    pretrain(build(first))
    other = tmp_path / "other-tokenizer"
    train_tokenizer([str(assets["corpus"])], "wordpiece", 90, show_progress=False, min_frequency=1).save(other)
    raw = tiny_config(assets, tmp_path / "second", model={"init_from": str(tmp_path / "first" / "model")},
                      tokenizer={"path": str(other)})
    raw["data"]["shards"] = str(tmp_path / "other-shards")
    raw["data"]["corpus"] = [str(assets["corpus"])]
    with pytest.raises(TokenizerError, match=r"the tokenizer does not match the model: vocab_size \d+ != tokenizer"):
        pretrain(build(raw))


def test_shards_made_with_another_tokenizer(assets, tmp_path):
    other = tmp_path / "other-tokenizer"
    train_tokenizer([str(assets["corpus"])], "wordpiece", 90, show_progress=False, min_frequency=1).save(other)
    raw = tiny_config(assets, tmp_path / "run", tokenizer={"path": str(other)})
    with pytest.raises(TokenizerError, match="shards were made with a different tokenizer"):
        pretrain(build(raw))


def test_init_from_continues_a_pretrained_model(assets, tmp_path):
    first = tiny_config(assets, tmp_path / "first", optim={"total_steps": 1})
    pretrain(build(first))
    second = tiny_config(assets, tmp_path / "second", model={"init_from": str(tmp_path / "first" / "model")},
                         optim={"total_steps": 1})
    assert pretrain(build(second)).steps == 1


def test_sequence_longer_than_the_positions(assets, tmp_path):
    raw = tiny_config(assets, tmp_path / "run", data={"instances": {"max_seq_length": 128}})
    with pytest.raises(ConfigError, match="max_seq_length: 128 needs 128 positions, but the model has 64"):
        pretrain(build(raw))


def test_batch_larger_than_the_data(assets, tmp_path):
    raw = tiny_config(assets, tmp_path / "run", optim={"batch_size": 4096})
    with pytest.raises(ConfigError, match="optim.batch_size: 4096"):
        pretrain(build(raw))
