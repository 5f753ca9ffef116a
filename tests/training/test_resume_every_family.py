"""Every pretraining family, with the tokenizer kind it is trained with, resumes after a SIGKILL to the same bits.

Each run trains its own tokenizer and prepares its own shards from the corpus (as a shipped config does), so the
resumed process reads the tokenizer back from ``<output_dir>/tokenizer`` and checks it against the shards'
fingerprint: the case that used to stop every T5 and XLNet resume with "shards were made with a different
tokenizer" (a Unigram model's scores read back rounded in the last digit). A run is killed by its own SIGKILL
(``BERTOLOGY_FAULT=step:5``: after step 5's update, before anything of it is logged or saved; the last checkpoint
is step 4) and resumed (in the test's process, as ``--resume`` does); its final weights, its metrics rows, its
tokenizer and its shards must be those of an uninterrupted run, bit for bit (the tokenizer was trained in the
killed process, the uninterrupted run's in the test's: Unigram training too is the same in every process)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from bertology.training import read_metrics
from pretrain_helpers import write_corpus

TOTAL_STEPS = 6
KILL_AT = "step:5"
VOLATILE = {"tokens_per_s"}  # timing: differs between any two runs
PROCESS_TIMEOUT = 300
TRANSFORMER = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64,
               "max_position_embeddings": 64}
NOISE = {"text_infilling": {"rate": 0.3, "poisson_lambda": 3.0}, "sentence_permutation": {"rate": 1.0}}

# family -> (model, tokenizer, data, objectives) sections: each family as its shipped config trains it, tiny.
FAMILIES: dict[str, tuple[dict, dict, dict, dict]] = {
    "bert": ({}, {"kind": "wordpiece"}, {"instances": {"kind": "nsp"}}, {"mlm": {}, "nsp": {}}),
    "roberta": ({"family": "roberta"}, {"kind": "bpe"}, {"instances": {"kind": "full-sentences"}}, {"mlm": {}}),
    "gpt2": ({"architecture": "decoder", "family": "gpt2"}, {"kind": "bpe", "style": "gpt2"},
             {"instances": {"kind": "packed-documents"}}, {"clm": {}}),
    "xlm-roberta": ({"family": "xlm-roberta"}, {"kind": "unigram"}, {"instances": {"kind": "full-sentences"}},
                    {"mlm": {}}),
    "t5": ({"architecture": "seq2seq", "family": "t5"}, {"kind": "unigram", "style": "t5"},
           {"instances": {"kind": "doc-sentences"}, "span_corruption": {}}, {"denoise": {}}),
    # Relative positions: XLNet has no position table to size.
    "xlnet": ({"architecture": "xlnet", "max_position_embeddings": None},
              {"kind": "unigram", "style": "xlnet"},
              {"instances": {"kind": "doc-sentences"}}, {"plm": {"k": 4}}),
    "bart": ({"architecture": "seq2seq", "family": "bart"}, {"kind": "bpe"},
             {"instances": {"kind": "doc-sentences"}, "noise": NOISE}, {"denoise": {}}),
    "electra": ({"family": "electra"}, {"kind": "wordpiece"},
                {"instances": {"kind": "full-sentences"},
                 "masking": {"mask_token_prob": 0.85, "random_token_prob": 0.0}},
                {"electra": {"generator_size": 0.5}}),
    "albert": ({"family": "albert", "embedding_size": 16, "num_layer_groups": 1, "inner_group_size": 1},
               {"kind": "unigram", "style": "bert"}, {"instances": {"kind": "sop"}}, {"mlm": {}, "sop": {}}),
    "modernbert": ({"architecture": "encoder", "family": "modernbert", "attention_window": [None, 8],
                    "rotary_theta": 160000.0, "rotary_theta_local": 10000.0}, {"kind": "wordpiece"},
                   {"instances": {"kind": "full-sentences"}, "masking": {"mlm_probability": 0.3}}, {"mlm": {}}),
    # DeBERTa-v3 from scratch: the family's run defaults (both terms over log buckets, no absolute positions)
    "deberta-v2": ({"family": "deberta-v2", "position_buckets": 8}, {"kind": "unigram", "style": "deberta"},
                   {"instances": {"kind": "full-sentences"}}, {"mlm": {}}),
    "elmo": ({"architecture": "elmo", "preset": "tiny", "projection_dim": 16, "cell_size": 32,
              "filters": [[1, 8], [2, 8]], "char_embedding_dim": 4, "max_characters_per_token": 12},
             {"kind": "word", "min_frequency": 1}, {"instances": {"kind": "word-stream", "max_seq_length": 6}},
             {"bilm": {}}),
}
TOKENIZER_KIND = {family: sections[1]["kind"] for family, sections in FAMILIES.items()}


def run_config(family: str, corpus: Path) -> dict[str, Any]:
    model, tokenizer, data, objectives = FAMILIES[family]
    model = dict(model) if family == "elmo" else {"preset": None, **TRANSFORMER, **model}
    model = {key: value for key, value in model.items() if value is not None}
    return {
        "model": model,
        "tokenizer": {"vocab_size": 120, "min_frequency": 1, **tokenizer},
        "data": {"corpus": [str(corpus)], "format": "bert", "heldout_documents": 3,
                 **data, "instances": {"max_seq_length": 32, **data["instances"]}},
        "objectives": objectives,
        "optim": {"batch_size": 4, "total_steps": TOTAL_STEPS, "lr": 1e-3, "warmup_steps": 2},
        "run": {"seed": 0, "log_every": 1, "eval_every": 3, "eval_batches": 1, "checkpoint_every": 2,
                "keep_last": 2, "progress": False},
        "speed": {"threads": 1, "prefetch": 0},
    }


def killed_run(config: Path, out: Path) -> subprocess.CompletedProcess:
    """``bertology pretrain`` in another process, which kills itself at ``KILL_AT``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTOLOGY_FAULT")}
    env.update(BERTOLOGY_FAULT=KILL_AT, PYTHONHASHSEED="7")  # another process, another hash order
    argv = [sys.executable, "-m", "bertology.cli.main", "pretrain", "--config", str(config),
            "--set", f"run.output_dir={out}"]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=PROCESS_TIMEOUT)


def in_process(raw: dict[str, Any], out: Path, resume: bool = False) -> None:
    from bertology.recipes.pretrain import pretrain
    from bertology.training.config import PretrainConfig

    pretrain(PretrainConfig.from_dict({**raw, "run": {**raw["run"], "output_dir": str(out)}}), resume=resume)


def rows(out: Path) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in VOLATILE} for row in read_metrics(out / "metrics.jsonl")]


def assert_same_run(ours: Path, theirs: Path) -> None:
    files = sorted(str(path.relative_to(ours)) for path in (ours / "tokenizer").iterdir())
    assert files == sorted(str(path.relative_to(theirs)) for path in (theirs / "tokenizer").iterdir())
    assert files  # tokenizer.json and HF's files; ELMo's words.txt
    if (theirs / "shards").is_dir():  # ELMo's word streams have none
        files.append("shards/metadata.json")  # the shards' counts and the tokenizer's fingerprint
    for name in files:
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
    mine = load_file(ours / "model" / "model.safetensors")
    reference = load_file(theirs / "model" / "model.safetensors")
    assert mine.keys() == reference.keys()
    differing = [key for key in mine if not torch.equal(mine[key], reference[key])]
    assert not differing, f"{len(differing)} tensors differ from the uninterrupted run's, e.g. {differing[:3]}"
    assert rows(ours) == rows(theirs)
    assert [r["step"] for r in rows(ours) if r["kind"] == "train"] == list(range(1, TOTAL_STEPS + 1))


SLOW = {"roberta", "bart", "electra"}  # their tokenizer kind and code paths are covered by the others by default


@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.slow) if f in SLOW else f for f in FAMILIES])
def test_a_run_killed_mid_way_resumes_to_the_uninterrupted_runs_bits(family, tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt", documents=16)
    raw = run_config(family, corpus)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(raw), encoding="utf-8")
    killed = killed_run(config, tmp_path / "killed")
    assert killed.returncode == -signal.SIGKILL, f"exit {killed.returncode}: {killed.stderr[-2000:]}"
    assert not (tmp_path / "killed" / "model").exists()
    steps = [r["step"] for r in read_metrics(tmp_path / "killed" / "metrics.jsonl") if r["kind"] == "train"]
    assert steps == [1, 2, 3, 4]  # killed after step 5's update, before its row
    in_process(raw, tmp_path / "killed", resume=True)  # reads the tokenizer the killed process trained and saved
    in_process(raw, tmp_path / "reference")  # uninterrupted, in this process: its own tokenizer and shards
    assert_same_run(tmp_path / "killed", tmp_path / "reference")


def test_every_tokenizer_kind_and_every_pretraining_family_is_covered():
    from bertology.model.run_configs import architecture_families
    from bertology.tokenization._pipeline import KINDS
    from bertology.training.config import architectures

    assert set(TOKENIZER_KIND.values()) == {*KINDS, "word"}
    unigram_styles = {sections[1].get("style", "roberta") for sections in FAMILIES.values()
                      if sections[1]["kind"] == "unigram"}
    assert unigram_styles == {"roberta", "t5", "xlnet", "bert", "deberta"}
    # Every architecture a run config builds, and each of its families: DistilBERT is distilled from a teacher
    # model, not pretrained from a corpus alone.
    buildable = [name for name, entry in architectures().items() if entry.run_config is not None]
    assert set(buildable) == {"encoder", "decoder", "seq2seq", "xlnet", "elmo"}
    families = {family for name in buildable for family in architecture_families(name)} | {"elmo"}
    assert families - {"distilbert"} <= set(FAMILIES)
