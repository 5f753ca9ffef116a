"""The glue corpus format: a GLUE task's training text as a pretraining corpus (task-adaptive pretraining), read
by the GLUE reader, in a run config (data.format glue, data.task) and on the command line (--format glue --task)."""

from __future__ import annotations

import pytest

from bertology.cli.main import main
from bertology.data.corpus import read_documents
from bertology.data.shards import TokenizedCorpus
from bertology.errors import ConfigError, DataError
from bertology.tokenization import load_tokenizer, train_tokenizer
from bertology.training.config import PretrainConfig


def test_a_glue_directory_gives_its_training_texts(tmp_path):
    glue = tmp_path / "MRPC"
    glue.mkdir()
    header = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    (glue / "train.tsv").write_text(header + "1\t1\t2\tA first text .\tIts pair .\n0\t3\t4\tAnother .\tOne more .\n",
                                    encoding="utf-8")
    (glue / "dev.tsv").write_text(header + "1\t5\t6\tNot read .\tNor this .\n", encoding="utf-8")
    # One document an example, its texts one sentence each; the dev split and the labels are not read.
    assert list(read_documents(glue, "glue", task="mrpc")) == [["A first text .", "Its pair ."],
                                                               ["Another .", "One more ."]]


def test_glue_format_errors(tmp_path):
    with pytest.raises(ConfigError, match="data.task: the glue format reads a GLUE task's train.tsv"):
        PretrainConfig.from_dict({"data": {"corpus": ["x"], "format": "glue"}})
    with pytest.raises(ConfigError, match="data.task: unknown GLUE task 'sst3'"):
        PretrainConfig.from_dict({"data": {"corpus": ["x"], "format": "glue", "task": "sst3"}})
    with pytest.raises(ConfigError, match="data.task: read by data.format glue only"):
        PretrainConfig.from_dict({"data": {"corpus": ["x"], "task": "sst2"}})
    bad = tmp_path / "train.tsv"
    bad.write_text("sentence\tlabel\na fine film \t1\nno label here\n")
    with pytest.raises(DataError, match=rf"{bad}.*line 3"):
        list(read_documents(bad, "glue", task="sst2"))
    with pytest.raises(DataError, match="name the task"):
        read_documents(bad, "glue")


def test_data_prepare_reads_a_glue_task_on_the_command_line(tmp_path, capsys):
    glue = tmp_path / "SST-2"
    glue.mkdir()
    (glue / "train.tsv").write_text("sentence\tlabel\nthe cat sat \t1\nthe dog ran over the tree \t0\n")
    (glue / "dev.tsv").write_text("sentence\tlabel\nthe house \t1\n")
    base = tmp_path / "tokenizer"
    train_tokenizer(iter(["the cat sat the dog ran over the tree house"]), "wordpiece", 60, show_progress=False,
                    min_frequency=1).save(base)
    out = tmp_path / "shards"
    assert main(["data", "prepare", "--tokenizer", str(base), "--out", str(out), "--format", "glue", "--task",
                 "sst2", str(glue)]) == 0
    corpus = TokenizedCorpus(out, load_tokenizer(base))
    assert corpus.metadata["sources"][0]["files"] == [str(glue / "train.tsv")]  # not dev.tsv
    assert corpus.metadata["num_documents"] == 2
    capsys.readouterr()
    assert main(["data", "prepare", "--tokenizer", str(base), "--out", str(tmp_path / "other"), "--task", "sst2",
                 str(glue / "train.tsv")]) == 2
    assert "--task sst2: read by the glue format only" in capsys.readouterr().err
