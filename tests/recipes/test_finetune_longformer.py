"""Fine-tuning a Longformer made from a short model: the family's classifier (global attention on the first token,
as transformers defaults it), saved in transformers' layout with the same logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertology.cli.main import main
from bertology.model import LongformerModel, load
from bertology.recipes.finetune import FinetuneConfig, finetune
from finetune_helpers import BAD, FILL, GOOD, cue_sentence, save_tiny_model


def test_a_converted_longformer_fine_tunes_on_sst2(tmp_path):
    rng = np.random.default_rng(0)
    (tmp_path / "glue" / "SST-2").mkdir(parents=True)
    for split, n in (("train", 192), ("dev", 48)):
        rows = [(cue_sentence(rng, label), label) for label in rng.integers(0, 2, n)]
        (tmp_path / "glue" / "SST-2" / f"{split}.tsv").write_text(
            "sentence\tlabel\n" + "".join(f"{s} \t{label}\n" for s, label in rows), encoding="utf-8")
    short = save_tiny_model(tmp_path / "short", GOOD + BAD + FILL, vocab_size=40)
    assert main(["longformer", "convert", "--model", str(short), "--max-length", "128", "--window", "4",
                 "--out", str(tmp_path / "long")]) == 0
    config = FinetuneConfig.from_dict({
        "model": str(tmp_path / "long"), "task": {"name": "sst2", "data": str(tmp_path / "glue"), "epochs": 8},
        "optim": {"batch_size": 16, "lr": 3e-3, "warmup_ratio": 0.1},
        "run": {"output_dir": str(tmp_path / "run"), "log_every": 6, "progress": False},
        "speed": {"threads": 1, "prefetch": 0}})
    result = finetune(config)
    assert result.best["value"] > 80  # the cue word decides the label
    ours = load(tmp_path / "run" / "model")
    assert isinstance(ours.model, LongformerModel)
    transformers = pytest.importorskip("transformers")
    hf = transformers.LongformerForSequenceClassification.from_pretrained(tmp_path / "run" / "model").eval()
    ids = torch.tensor([ours.tokenizer.encode("the film was very great and the plot was nice").ids])
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids).logits, ours.model(ids).logits, atol=1e-5, rtol=1e-5)
