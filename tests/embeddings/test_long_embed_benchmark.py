"""benchmarks/long.py --embed on a tiny random RoBERTa: a text the short model reads in one window, inside the
Longformer's window, gets the same vectors from one forward; a longer one is read in several windows by the short
model and in one by the Longformer, every content token compared."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from bertology.model import Pretrained, load
from bertology.model.longformer import longformer_from

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "long.py"


def test_embed_comparison_rows(tmp_path):
    torch.manual_seed(0)
    spec = importlib.util.spec_from_file_location("long_benchmark", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    words = "the cat sat on a mat while old men walked by the green river and talked of long ago".split()
    generator = torch.Generator().manual_seed(0)
    text = "\n".join(" ".join(words[i] for i in torch.randint(len(words), (12,), generator=generator).tolist())
                     for _ in range(200))
    bench.tiny_roberta(tmp_path / "short", text)
    short = load(tmp_path / "short")
    assert short.model.config.max_length == 128
    model, _ = longformer_from(short.model, 512, 256, sep_token_id=short.tokenizer.sep_id)
    long = Pretrained(model, short.tokenizer)
    same = bench.embed_comparison(short, long, text, 128, repeats=1)
    assert same["windows"] == 1 and same["content_tokens"] == 126
    assert same["cosine_min"] > 0.9999 and same["sentence_cosine"] > 0.9999
    longer = bench.embed_comparison(short, long, text, 400, repeats=1)
    assert longer["content_tokens"] == 398 and longer["windows"] > 3
    assert -1 <= longer["cosine_min"] <= longer["cosine_p5"] <= longer["cosine_mean"] < 0.9999
    assert longer["windows_seconds"] > 0 and longer["one_forward_seconds"] > 0
