"""The conversion engine: each weight transform round-trips bit-exactly, a family registered only here (GPT-2-like
names, a fused transposed query/key/value, a reshaped and a split-in-two projection, a tied decoder) loads a
checkpoint written by hand and saves it back identically, and bad families and bad checkpoints are clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertology.errors import CheckpointError, ConfigError
from bertology.model import TransformerConfig, EncoderModel, HeadSpec, load_model, save_model
from bertology.model import checkpoint, convert
from bertology.model.convert import (
    CheckpointFamily,
    ConfigKey,
    Head,
    Merge,
    Reshape,
    Split,
    Tie,
    Transpose,
    WeightEntry,
    linear,
    register_family,
    renamed_keys,
)

H, HEADS_N, INNER, VOCAB, POSITIONS = 16, 4, 24, 50, 32


def seeded(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --- the transforms on their own ---------------------------------------------------------------------------------


def test_split_of_a_fused_transposed_qkv_round_trips_bit_exactly():
    fused = seeded(H, 3 * H)  # GPT-2's Conv1D c_attn: [in, 3 x out]
    split = Split(dim=0, transpose=True)
    q, k, v = split.load([fused], [torch.Size((H, H))] * 3)
    assert torch.equal(q, fused[:, :H].T) and torch.equal(k, fused[:, H:2 * H].T) and torch.equal(v, fused[:, 2 * H:].T)
    (back,) = split.save([q, k, v], None)
    assert torch.equal(back, fused) and back.is_contiguous()


def test_split_takes_the_parts_widths_from_our_shapes():
    fused = seeded(H + 2 * 4, H)  # a query H wide and narrower keys and values (grouped heads)
    q, k, v = Split(dim=0).load([fused], [torch.Size((H, H)), torch.Size((4, H)), torch.Size((4, H))])
    assert (q.shape, k.shape, v.shape) == ((H, H), (4, H), (4, H))
    assert torch.equal(Split(dim=0).save([q, k, v], None)[0], fused)
    with pytest.raises(ValueError, match="dimension 0 is 24, the parts need 48"):
        Split(dim=0).load([fused], [torch.Size((H, H))] * 3)


def test_merge_reshape_and_transpose_round_trip_bit_exactly():
    a, b = seeded(12, H, seed=1), seeded(12, H, seed=2)
    (merged,) = Merge(dim=0).load([a, b], [torch.Size((24, H))])
    assert torch.equal(merged, torch.cat([a, b]))
    first, second = Merge(dim=0).save([merged], None)
    assert torch.equal(first, a) and torch.equal(second, b)

    config = TransformerConfig(hidden_size=H, num_heads=HEADS_N)
    stored = seeded(H, HEADS_N, H // HEADS_N, seed=3)  # [hidden, heads, head_dim]
    reshape = Reshape(("hidden_size", "num_heads", "head_dim"))
    (ours,) = reshape.load([stored], [torch.Size((H, H))])
    assert ours.shape == (H, H) and torch.equal(reshape.save([ours], config)[0], stored)

    weight = seeded(H, INNER, seed=4)
    (ours,) = Transpose().load([weight], [torch.Size((INNER, H))])
    assert torch.equal(ours, weight.T) and torch.equal(Transpose().save([ours], None)[0], weight)


def test_entries_with_the_wrong_number_of_names_are_refused():
    with pytest.raises(ConfigError, match="a split maps one key to two or more parameters"):
        WeightEntry(("encoder.layers.{i}.query.weight",), ("h.{i}.c_attn.weight",), Split())
    with pytest.raises(ConfigError, match="a merge maps two or more keys to one parameter"):
        WeightEntry(("a.weight", "b.weight"), ("c.weight",), Merge())
    with pytest.raises(ConfigError, match=r"Merge\(parts=2\) but 3 keys"):
        WeightEntry(("a.weight",), ("b.weight", "c.weight", "d.weight"), Merge())
    with pytest.raises(ConfigError, match="a rename maps one parameter to one key"):
        WeightEntry(("a.weight", "b.weight"), ("c.weight", "d.weight"))


# --- a family registered only here ------------------------------------------------------------------------------------

LAYER = "h.{i}."
TOY = CheckpointFamily(
    model_type="toy-gpt",
    class_stem="ToyGPT",
    prefix="transformer",
    family="bert",  # the TransformerConfig family its checkpoints build
    config_keys=renamed_keys({"vocab_size": "vocab_size", "hidden_size": "n_embd", "num_layers": "n_layer",
                              "num_heads": "n_head", "intermediate_size": "n_inner",
                              "hidden_act": "activation_function", "max_position_embeddings": "n_positions",
                              "layer_norm_eps": "layer_norm_epsilon", "pad_token_id": "pad_token_id"}),
    fixed={"type_vocab_size": 0, "pooler": False},
    weights=(
        *linear("encoder.embeddings.word", "wte", ("weight",)),
        *linear("encoder.embeddings.position", "wpe", ("weight",)),
        *linear("encoder.embeddings.norm", "ln_e"),
        WeightEntry(tuple(f"encoder.layers.{{i}}.{p}.weight" for p in ("query", "key", "value")),
                    (LAYER + "attn.c_attn.weight",), Split(dim=0, transpose=True)),
        WeightEntry(tuple(f"encoder.layers.{{i}}.{p}.bias" for p in ("query", "key", "value")),
                    (LAYER + "attn.c_attn.bias",), Split(dim=0)),
        WeightEntry(("encoder.layers.{i}.attn_out.weight",), (LAYER + "attn.c_proj.weight",),
                    Reshape(("hidden_size", "num_heads", "head_dim"))),
        *linear("encoder.layers.{i}.attn_out", LAYER + "attn.c_proj", ("bias",)),
        *linear("encoder.layers.{i}.attn_norm", LAYER + "ln_1"),
        *(WeightEntry((f"encoder.layers.{{i}}.ffn_in.{p}",), (LAYER + f"mlp.up_a.{p}", LAYER + f"mlp.up_b.{p}"),
                      Merge(dim=0)) for p in ("weight", "bias")),
        *linear("encoder.layers.{i}.ffn_out", LAYER + "mlp.c_proj", ("weight",), transform=Transpose()),
        *linear("encoder.layers.{i}.ffn_out", LAYER + "mlp.c_proj", ("bias",)),
        *linear("encoder.layers.{i}.ffn_norm", LAYER + "ln_2"),
    ),
    heads={"mlm": Head("masked_lm", "gelu", {"dense": "lm_head.dense", "norm": "lm_head.ln", "bias": "lm_head.bias",
                                             "tied": "lm_head.decoder"})},
    architectures={"Model": (), "LMHeadModel": ("mlm",)},
)
TOY_CONFIG = {"model_type": "toy-gpt", "architectures": ["ToyGPTLMHeadModel"], "vocab_size": VOCAB, "n_embd": H,
              "n_layer": 2, "n_head": HEADS_N, "n_inner": INNER, "activation_function": "gelu",
              "n_positions": POSITIONS, "layer_norm_epsilon": 1e-5, "pad_token_id": 0}


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setattr(convert, "REGISTRY", dict(convert.registry()))  # registered for this test only
    return register_family(TOY)


def toy_model() -> EncoderModel:
    config = TransformerConfig(vocab_size=VOCAB, hidden_size=H, num_layers=2, num_heads=HEADS_N, intermediate_size=INNER,
                           max_position_embeddings=POSITIONS, layer_norm_eps=1e-5, type_vocab_size=0, pooler=False)
    model = EncoderModel(config, [HeadSpec("mlm", "masked_lm")])
    model.init_weights(torch.Generator().manual_seed(0))
    with torch.no_grad():  # biases start at zero: random ones test their mapping too
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.add_(seeded(*p.shape, seed=len(name)) * 0.1)
    return model.eval()


def by_hand(model: EncoderModel) -> dict[str, torch.Tensor]:
    """The toy checkpoint's weights, written without the engine."""
    s = {k: v.clone() for k, v in model.state_dict().items()}
    out = {"transformer.wte.weight": s["encoder.embeddings.word.weight"],
           "transformer.wpe.weight": s["encoder.embeddings.position.weight"],
           "transformer.ln_e.weight": s["encoder.embeddings.norm.weight"],
           "transformer.ln_e.bias": s["encoder.embeddings.norm.bias"],
           "lm_head.dense.weight": s["heads.mlm.dense.weight"], "lm_head.dense.bias": s["heads.mlm.dense.bias"],
           "lm_head.ln.weight": s["heads.mlm.norm.weight"], "lm_head.ln.bias": s["heads.mlm.norm.bias"],
           "lm_head.bias": s["heads.mlm.bias"], "lm_head.decoder.weight": s["encoder.embeddings.word.weight"].clone()}
    for i in range(2):
        ours, theirs = f"encoder.layers.{i}.", f"transformer.h.{i}."
        qkv = [s[ours + p + ".weight"] for p in ("query", "key", "value")]
        out[theirs + "attn.c_attn.weight"] = torch.cat(qkv, dim=0).T.contiguous()
        out[theirs + "attn.c_attn.bias"] = torch.cat([s[ours + p + ".bias"] for p in ("query", "key", "value")])
        out[theirs + "attn.c_proj.weight"] = s[ours + "attn_out.weight"].reshape(H, HEADS_N, H // HEADS_N)
        out[theirs + "attn.c_proj.bias"] = s[ours + "attn_out.bias"]
        for name in ("weight", "bias"):
            out[theirs + f"ln_1.{name}"] = s[ours + f"attn_norm.{name}"]
            out[theirs + f"ln_2.{name}"] = s[ours + f"ffn_norm.{name}"]
            out[theirs + f"mlp.up_a.{name}"] = s[ours + f"ffn_in.{name}"][: INNER // 2].clone()
            out[theirs + f"mlp.up_b.{name}"] = s[ours + f"ffn_in.{name}"][INNER // 2:].clone()
        out[theirs + "mlp.c_proj.weight"] = s[ours + "ffn_out.weight"].T.contiguous()
        out[theirs + "mlp.c_proj.bias"] = s[ours + "ffn_out.bias"]
    return out


def write_toy(directory, weights, config=None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config or TOY_CONFIG))
    save_file({k: v.contiguous() for k, v in weights.items()}, directory / "model.safetensors")


def forward(model: EncoderModel):
    ids = torch.randint(1, VOCAB, (2, 7), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        return model(ids, torch.ones_like(ids))


def test_a_family_registered_in_the_test_loads_a_hand_written_checkpoint_and_saves_it_back(toy, tmp_path):
    model = toy_model()
    written = by_hand(model)
    write_toy(tmp_path / "hand", written)
    loaded = load_model(tmp_path / "hand")
    assert loaded.config.family == "bert" and [s.name for s in loaded.head_specs] == ["mlm"]
    assert loaded.head_specs[0].activation == "gelu"
    assert set(loaded.state_dict()) == set(model.state_dict())
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    a, b = forward(model), forward(loaded)
    assert torch.equal(a.last_hidden_state, b.last_hidden_state) and torch.equal(a.logits, b.logits)

    save_model(loaded, tmp_path / "saved")  # written with the table it was read with
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert config["model_type"] == "toy-gpt" and config["architectures"] == ["ToyGPTLMHeadModel"]
    assert (config["n_embd"], config["n_layer"], config["n_inner"]) == (H, 2, INNER)
    saved = load_file(tmp_path / "saved" / "model.safetensors")
    assert set(saved) == set(written) - {"lm_head.decoder.weight"}  # the tied decoder is not stored twice
    for key, tensor in saved.items():
        assert torch.equal(tensor, written[key]), key
    again = load_model(tmp_path / "saved")
    assert torch.equal(forward(again).logits, a.logits)


def test_the_engine_round_trips_the_toy_state_dict_in_memory(toy):
    model = toy_model()
    stored = convert.from_state_dict(model, TOY)
    written = by_hand(model)
    assert set(stored) == set(written) - {"lm_head.decoder.weight"}
    assert all(torch.equal(stored[k], written[k]) for k in stored)
    back = convert.to_state_dict(model, stored, prefixed=True, source="memory", family=TOY)
    assert set(back) == set(model.state_dict())
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())


def test_toy_checkpoint_errors_name_the_directory_and_the_keys(toy, tmp_path):
    model = toy_model()
    weights = by_hand(model)
    weights.pop("transformer.h.1.attn.c_attn.weight")
    weights["transformer.h.0.attn.c_attn.weight"] = seeded(H, 2 * H)
    weights["transformer.h.0.mlp.up_b.weight"] = seeded(INNER, H)
    weights["lm_head.decoder.weight"] = seeded(VOCAB, H)
    weights["transformer.h.0.attn.rotary.inv_freq"] = seeded(4)
    write_toy(tmp_path / "m", weights)
    with pytest.raises(CheckpointError) as caught:
        load_model(tmp_path / "m")
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'm'}: weights do not fit a toy-gpt model")
    assert "missing keys: transformer.h.1.attn.c_attn.weight |" in message
    assert "unexpected keys: transformer.h.0.attn.rotary.inv_freq |" in message
    assert ("transformer.h.0.attn.c_attn.weight (split to encoder.layers.0.query.weight, "
            "encoder.layers.0.key.weight, encoder.layers.0.value.weight): checkpoint (16, 32), model (16, 16), "
            "(16, 16), (16, 16)") in message
    assert ("transformer.h.0.mlp.up_a.weight, transformer.h.0.mlp.up_b.weight (merge to "
            "encoder.layers.0.ffn_in.weight): checkpoint (12, 16), (24, 16), model (24, 16)") in message
    assert "lm_head.decoder.weight: differs from encoder.embeddings.word.weight" in message
    assert "\n" not in message


def test_a_config_of_a_registered_family_cannot_carry_another_familys_keys(toy, tmp_path):
    write_toy(tmp_path / "m", by_hand(toy_model()), {**TOY_CONFIG, "num_hidden_layers": 2})
    with pytest.raises(ConfigError, match=r"config\.json: key 'num_hidden_layers' is a bert config key, not a "
                                          r"toy-gpt one: the file mixes two families' fields"):
        load_model(tmp_path / "m")
    tolerant = CheckpointFamily(**{**{f: getattr(TOY, f) for f in TOY.__dataclass_fields__},
                                   "tolerated": frozenset({"num_hidden_layers"})})
    register_family(tolerant, replace=True)
    assert load_model(tmp_path / "m").config.num_layers == 2


# --- registering families ---------------------------------------------------------------------------------------


def test_registering_families(toy):
    assert register_family(TOY) is TOY  # the same table again is harmless
    other = CheckpointFamily(**{**{f: getattr(TOY, f) for f in TOY.__dataclass_fields__}, "class_stem": "Other"})
    with pytest.raises(ConfigError, match="model_type 'toy-gpt' is registered already with another table"):
        register_family(other)
    register_family(other, replace=True)
    assert convert.checkpoint_family("toy-gpt").class_stem == "Other"
    assert list(convert.registry())[:6] == ["bert", "roberta", "xlm-roberta", "electra", "albert", "distilbert"]
    # the views other modules read see the registered family
    assert checkpoint.HEADS["toy-gpt"]["mlm"][:2] == ("masked_lm", "gelu")
    assert checkpoint.FAMILY_FIXED["toy-gpt"] == {"type_vocab_size": 0, "pooler": False}
    assert checkpoint.HEADS["bert"]["nsp"] == ("pooled", None, {"out": "cls.seq_relationship"})
    assert checkpoint.FAMILY_FIXED["roberta"] == {"positions_after_padding": True}
    with pytest.raises(ConfigError, match="expects a CheckpointFamily, got dict"):
        register_family({"model_type": "x"})  # type: ignore[arg-type]


def toy_with(**changes) -> CheckpointFamily:
    return CheckpointFamily(**{**{f: getattr(TOY, f) for f in TOY.__dataclass_fields__}, **changes})


def test_bad_family_tables_are_refused_with_the_key():
    with pytest.raises(ConfigError, match=r"checkpoint family 'toy-gpt': architectures\['ForPreTraining'\] names "
                                          r"head 'nsp', which the family does not declare \(heads: mlm\)"):
        toy_with(architectures={"Model": (), "ForPreTraining": ("mlm", "nsp")})
    with pytest.raises(ConfigError, match="architectures has no 'Model' entry"):
        toy_with(architectures={"LMHeadModel": ("mlm",)})
    with pytest.raises(ConfigError, match=r"config_keys: 'n_ctx' maps to 'context', which is not a field of TransformerConfig"):
        toy_with(config_keys=(ConfigKey("context", "n_ctx"),))
    with pytest.raises(ConfigError, match=r"fixed: 'rotary' is not a field of TransformerConfig"):
        toy_with(fixed={"rotary": True})
    with pytest.raises(ConfigError, match="model_type must be a non-empty string"):
        toy_with(model_type="")


def test_tie_pairs_each_key_with_a_parameter():
    with pytest.raises(ConfigError, match="a tie pairs each key with one parameter"):
        WeightEntry(("encoder.embeddings.word.weight",), ("a.weight", "b.weight"), Tie())


def test_a_table_naming_a_parameter_the_model_lacks_is_an_error(toy):
    model = toy_model()
    rotary = toy_with(weights=TOY.weights + linear("encoder.rotary", "rotary", ("weight",)))
    with pytest.raises(CheckpointError, match="the toy-gpt checkpoint table names parameters the model does not "
                                              "have: encoder.rotary.weight"):
        convert.from_state_dict(model, rotary)
    with pytest.raises(CheckpointError, match="names parameters the model does not have: encoder.rotary.weight"):
        convert.to_state_dict(model, by_hand(model), prefixed=True, source="memory", family=rotary)


def test_a_model_type_that_is_not_a_string_names_the_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": ["bert"]}))
    with pytest.raises(CheckpointError, match=r"config\.json: model_type: unknown model_type \['bert'\]"):
        load_model(tmp_path)
