"""Fine-tuning on an ELMo model is not implemented yet: the command says so, naming the model, before any work."""

from __future__ import annotations

import pytest
import torch

from bertology.errors import ConfigError
from bertology.model import save_model
from bertology.model.elmo import ElmoModel, tiny_config
from bertology.recipes.finetune import FinetuneConfig, finetune
from bertology.tokenization.words import SPECIALS, WordVocabulary


def test_finetune_refuses_an_elmo_model_by_name(tmp_path):
    model = ElmoModel(tiny_config(projection_dim=8, cell_size=16))
    model.init_weights(torch.Generator().manual_seed(0))
    save_model(model, tmp_path / "elmo")
    WordVocabulary([*SPECIALS, "good"]).save(tmp_path / "elmo")
    (tmp_path / "glue" / "SST-2").mkdir(parents=True)
    for split in ("train", "dev"):
        (tmp_path / "glue" / "SST-2" / f"{split}.tsv").write_text("sentence\tlabel\ngood \t1\nbad \t0\n")
    config = FinetuneConfig.from_dict({"model": str(tmp_path / "elmo"),
                                       "task": {"name": "sst2", "data": str(tmp_path / "glue")},
                                       "run": {"output_dir": str(tmp_path / "run"), "progress": False},
                                       "speed": {"threads": 1, "prefetch": 0}})
    with pytest.raises(ConfigError, match=r"elmo is an ELMo model; fine-tuning on ELMo's features is not"):
        finetune(config)
