"""Every family's parameter names (state-dict keys) are the ones its checkpoint tables, LoRA targets and saved models
address: a tiny model of each family and architecture has exactly the keys recorded in state_dict_keys.json (recorded
before the encoders and decoders became one stack; `python tests/model/test_state_dict_keys.py` writes the file
again, for a deliberate change)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch

RECORD = Path(__file__).with_name("state_dict_keys.json")
# Tiny sizes for every config class; keys a class lacks are left out.
TINY = dict(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=24,
            max_position_embeddings=40, embedding_size=8, mem_len=4, eos_token_id=2, decoder_start_token_id=0)


def family_keys() -> dict[str, list[str]]:
    """For each registered checkpoint family and architecture: the sorted state-dict keys of a tiny model."""
    from bertology.model.checkpoint import registry
    from bertology.model.heads import HeadSpec
    from bertology.model.registry import model_class

    out: dict[str, list[str]] = {}
    for name, family in sorted(registry().items()):
        fields = {f.name for f in dataclasses.fields(family.config_class)}
        values = {**getattr(family, "defaults", {}), **family.fixed}
        values.update({k: v for k, v in TINY.items() if k in fields
                       and (k != "embedding_size" or family.family in ("albert", "electra"))})
        values.pop("family", None)
        if family.family == "albert":
            values.update(num_layer_groups=1)
        if "attention_window" in fields and family.family == "longformer":
            values.update(attention_window=4)
        config = family.config_class(family=family.family, **values)
        for suffix, heads in sorted(family.architectures.items()):
            specs = tuple(HeadSpec(name=h, kind=family.heads[h].kind, num_labels=3,  # type: ignore[arg-type]
                                   activation=family.heads[h].activation or config.hidden_act) for h in heads)
            torch.manual_seed(0)
            model = model_class(family.model_for(suffix))(config, specs)
            out[f"{name}:{suffix}"] = sorted(model.state_dict())
    return out


def test_every_family_keeps_its_parameter_names():
    recorded = json.loads(RECORD.read_text())
    current = family_keys()
    assert sorted(current) == sorted(recorded)
    for model, keys in recorded.items():
        assert current[model] == keys, model


if __name__ == "__main__":
    RECORD.write_text(json.dumps(family_keys(), indent=1, sort_keys=True) + "\n")
    sys.exit(0)
