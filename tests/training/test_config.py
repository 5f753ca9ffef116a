"""Run configs: presets load, overrides apply, typos and wrong types are errors naming the key's path."""

from __future__ import annotations

import json

import pytest

from bertology.cli.main import main
from bertology.errors import ConfigError
from bertology.training.config import PretrainConfig, apply_overrides, load_config



def test_overrides_and_yaml_numbers(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("optim:\n  lr: 1e-4\n  betas: [0.9, 0.98]\nrun:\n  output_dir: out\n")
    config = load_config(path, ["optim.lr=3e-4", "optim.total_steps=7", "data.masking.whole_word=true",
                                "data.corpus=a.txt", "speed.bf16=null"])
    assert config.optim.lr == 3e-4 and config.optim.betas == (0.9, 0.98) and config.optim.total_steps == 7
    assert config.data.masking.whole_word is True and config.data.corpus == ["a.txt"]
    assert config.objectives == {"mlm": {}, "nsp": {}}  # NSP by default for nsp instances
    assert load_config(path, ["data.instances.kind=full-sentences"]).objectives == {"mlm": {}}
    round_trip = PretrainConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert round_trip == config


def test_json_config(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"optim": {"total_steps": 3}, "objectives": {"mlm": {"weight": 2}}}))
    config = load_config(path)
    assert config.optim.total_steps == 3 and config.objectives == {"mlm": {"weight": 2.0}}


@pytest.mark.parametrize("overrides,message", [
    (["optim.lerning_rate=1e-4"], "optim.lerning_rate: unknown key; did you mean lr?"),
    (["optim.learning_rate=1e-4"], "optim.learning_rate: unknown key; did you mean lr?"),
    (["optimm.lr=1"], "optimm: unknown section; did you mean optim?"),
    (["data.masking.whole_wrd=true"], "data.masking.whole_wrd: unknown key; did you mean whole_word?"),
    (["model.hidden_sise=64"], "model.hidden_sise: unknown key; did you mean hidden_size?"),
    (["objectives.mlm.wieght=2"], "objectives.mlm.wieght: unknown key; did you mean weight?"),
    (["objectives.sbo={}"], "objectives.sbo: unknown objective"),
    (["optim.lr=fast"], "optim.lr: expected float, got str 'fast'"),
    (["optim.total_steps=1.5"], "optim.total_steps: expected int, got float 1.5"),
    (["run.progress=3"], "run.progress: expected bool"),
    (["data.instances.kind=pairs"], "data.instances.kind: expected one of"),
    (["optim.betas=[0.9]"], "optim.betas: expected a list of 2 values"),
    (["data.masking.mlm_probability=1.5"], "data.masking.mlm_probability: must be in (0, 1)"),
    (["optim.total_steps=0"], "optim.total_steps: must be >= 1"),
    (["objectives.nsp={}", "data.instances.kind=full-sentences"], "objectives.nsp: next-sentence prediction needs"),
    (["optim=3"], "optim: expected a mapping"),
    (["optim.lr"], "expected KEY.PATH=VALUE"),
])
def test_bad_config_names_the_key(overrides, message):
    with pytest.raises(ConfigError) as error:
        load_config(None, overrides)
    assert message in str(error.value)


def test_config_file_errors_name_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("optim:\n  lerning_rate: 1e-4\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: optim.lerning_rate: unknown key; did you mean lr\?"):
        load_config(path)
    broken = tmp_path / "broken.yaml"
    broken.write_text("optim:\n  lr: [1\n")
    with pytest.raises(ConfigError, match=r"broken.yaml: line \d+ column \d+: invalid YAML"):
        load_config(broken)
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")


def test_cli_reports_a_typo(tmp_path, capsys):
    path = tmp_path / "typo.yaml"
    path.write_text("run:\n  ouput_dir: x\n")
    assert main(["pretrain", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "run.ouput_dir: unknown key; did you mean output_dir?" in err


def test_overrides_do_not_touch_the_input():
    raw = {"optim": {"lr": 1.0}}
    assert apply_overrides(raw, ["optim.lr=2"]) == {"optim": {"lr": 2}} and raw == {"optim": {"lr": 1.0}}


# ------------------------------------------------------------------------------------ config file reliability
def test_duplicate_yaml_keys_name_the_key_and_both_lines(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("optim:\n  lr: 1e-4\n  batch_size: 8\n  lr: 3e-4\n")
    with pytest.raises(ConfigError, match=r"x.yaml: optim.lr is given twice \(lines 2 and 4\)"):
        load_config(path)
    path.write_text("optim:\n  lr: 1e-4\nrun:\n  seed: 1\noptim:\n  batch_size: 8\n")
    with pytest.raises(ConfigError, match=r"x.yaml: optim is given twice \(lines 1 and 5\)"):
        load_config(path)
    path.write_text("data:\n  masking:\n    whole_word: true\n    dynamic: true\n    whole_word: false\n")
    with pytest.raises(ConfigError, match=r"data.masking.whole_word is given twice \(lines 3 and 5\)"):
        load_config(path)
    path.write_text("objectives:\n  mlm: {weight: 1.0, weight: 2.0}\n")
    with pytest.raises(ConfigError, match=r"objectives.mlm.weight is given twice \(lines 2 and 2\)"):
        load_config(path)


def test_duplicate_json_keys_name_the_key(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"optim": {"lr": 0.001, "total_steps": 3, "lr": 0.002}}')
    with pytest.raises(ConfigError, match="x.json: optim.lr is given twice"):
        load_config(path)
    path.write_text('{"run": {}, "run": {}}')
    with pytest.raises(ConfigError, match="x.json: run is given twice"):
        load_config(path)


def test_duplicate_key_in_a_set_value():
    with pytest.raises(ConfigError, match="whole_word is given twice"):
        load_config(None, ["data.masking={whole_word: true, whole_word: false}"])


def test_same_key_in_different_sections_is_fine(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("tokenizer:\n  vocab_size: 100\nmodel:\n  vocab_size: null\n")
    assert load_config(path).tokenizer.vocab_size == 100


def test_config_file_not_utf8_names_the_byte(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("run:\n  output_dir: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ConfigError) as error:
        load_config(path)
    message = str(error.value)
    assert "latin1.yaml: not UTF-8 text: byte 22 (line 2)" in message and "\n" not in message
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps({"optim": {"total_steps": 2}}).encode())
    assert load_config(bom).optim.total_steps == 2


NON_FINITE_KEYS = ["optim.lr", "optim.clip_norm", "optim.eps", "optim.weight_decay", "optim.warmup_ratio",
                   "optim.min_lr_ratio", "data.masking.mlm_probability", "data.masking.mask_token_prob",
                   "data.masking.random_token_prob", "data.instances.short_seq_prob", "data.heldout_documents",
                   "objectives.mlm.weight", "model.hidden_dropout", "model.layer_norm_eps"]


@pytest.mark.parametrize("key", NON_FINITE_KEYS)
@pytest.mark.parametrize("text", [".nan", ".inf", "-.inf", ".NaN", "1e999"])
def test_non_finite_numbers_are_refused(key, text):
    with pytest.raises(ConfigError, match=f"^{key}: must be a finite number"):
        load_config(None, [f"{key}={text}"])


def test_non_finite_numbers_in_files(tmp_path):
    path = tmp_path / "nan.yaml"
    path.write_text("optim:\n  lr: .inf\n")
    with pytest.raises(ConfigError, match="nan.yaml: optim.lr: must be a finite number, got inf"):
        load_config(path)
    path = tmp_path / "nan.json"
    path.write_text('{"optim": {"clip_norm": NaN}}')
    with pytest.raises(ConfigError, match="nan.json: optim.clip_norm: must be a finite number, got nan"):
        load_config(path)


def test_non_finite_numbers_in_python_construction():
    from bertology.data import MaskingConfig
    from bertology.training.config import DataConfig, OptimConfig

    with pytest.raises(ConfigError, match="optim.lr: must be a finite number"):
        OptimConfig(lr=float("nan"))
    with pytest.raises(ConfigError, match=r"optim.betas\[1\]: must be a finite number"):
        OptimConfig(betas=(0.9, float("inf")))
    with pytest.raises(ConfigError, match="MaskingConfig.mask_token_prob: must be a finite number"):
        MaskingConfig(mask_token_prob=float("nan"))
    with pytest.raises(ConfigError, match="data.heldout_documents: must be a finite number"):
        DataConfig(heldout_documents=float("nan"))


def test_huge_integer_for_a_float():
    with pytest.raises(ConfigError, match="optim.lr: must be a finite number, got an integer of 400 digits"):
        load_config(None, ["optim.lr=" + "1" * 400])


@pytest.mark.parametrize("setting,message", [
    ("optim.batch_size=0", "optim.batch_size: must be >= 1"),
    ("optim.grad_accumulation=0", "optim.grad_accumulation: must be >= 1"),
    ("optim.total_steps=-3", "optim.total_steps: must be >= 1"),
    ("optim.lr=0", "optim.lr: must be > 0"),
    ("optim.lr=-1e-4", "optim.lr: must be > 0"),
    ("optim.betas=[0.9, 1.0]", r"optim.betas: each must be in \[0, 1\)"),
    ("optim.betas=[-0.1, 0.9]", r"optim.betas: each must be in \[0, 1\)"),
    ("optim.eps=0", "optim.eps: must be > 0"),
    ("optim.weight_decay=-0.01", "optim.weight_decay: must be >= 0"),
    ("optim.warmup_steps=-1", "optim.warmup_steps: must be >= 0"),
    ("optim.warmup_ratio=1.5", r"optim.warmup_ratio: must be in \[0, 1\]"),
    ("optim.min_lr_ratio=-0.5", r"optim.min_lr_ratio: must be in \[0, 1\]"),
    ("optim.clip_norm=0", "optim.clip_norm: must be > 0 or null"),
    ("run.seed=-1", r"run.seed: must be in \[0, 2\*\*63\)"),
    (f"run.seed={2**63}", r"run.seed: must be in \[0, 2\*\*63\)"),
    ("run.log_every=-1", "run.log_every: must be >= 0"),
    ("run.eval_every=-1", "run.eval_every: must be >= 0"),
    ("run.checkpoint_every=-1", "run.checkpoint_every: must be >= 0"),
    ("run.keep_last=0", "run.keep_last: must be >= 1"),
    ("run.eval_batches=0", "run.eval_batches: must be >= 1 or null"),
    ("run.output_dir=' '", "run.output_dir: must not be empty"),
    ("speed.threads=0", "speed.threads: must be >= 1 or null"),
    ("speed.prefetch=-1", "speed.prefetch: must be >= 0"),
    ("speed.device=''", "speed.device: must not be empty"),
    ("data.heldout_documents=-1", "data.heldout_documents: must be >= 0"),
    ("data.heldout_documents=1.0", r"data.heldout_documents: a fraction must be in \[0, 1\)"),
    ("data.heldout_documents=-0.1", r"data.heldout_documents: a fraction must be in \[0, 1\)"),
    ("data.shard_size_tokens=0", "data.shard_size_tokens: must be >= 1"),
    ("data.bucket_window=-1", "data.bucket_window: must be >= 0"),
    ("data.encoding=utf-99", "data.encoding: unknown text encoding 'utf-99'"),
    ("data.text_field=''", "data.text_field: must not be empty"),
    ("data.corpus=['a.txt', '']", "data.corpus: an empty path"),
    ("data.instances.max_seq_length=5", "data.instances.max_seq_length: must be >= 6"),
    ("data.instances.short_seq_prob=1.5", r"data.instances.short_seq_prob: must be in \[0, 1\]"),
    ("data.instances.short_seq_prob=-0.1", r"data.instances.short_seq_prob: must be in \[0, 1\]"),
    ("data.instances.dupe_factor=0", "data.instances.dupe_factor: must be >= 1"),
    ("data.masking.mlm_probability=-0.1", r"data.masking.mlm_probability: must be in \(0, 1\)"),
    ("data.masking.mask_token_prob=1.1", r"data.masking.mask_token_prob: must be in \[0, 1\]"),
    ("data.masking.random_token_prob=-1", r"data.masking.random_token_prob: must be in \[0, 1\]"),
    ("data.masking.random_token_prob=0.5", r"data.masking: mask_token_prob \+ random_token_prob must be <= 1"),
    ("data.masking.max_predictions=0", "data.masking.max_predictions: must be >= 1 or None"),
    ("tokenizer.vocab_size=7", "tokenizer.vocab_size: must be >= 8"),
    ("tokenizer.min_frequency=-1", "tokenizer.min_frequency: must be >= 0"),
    ("objectives.mlm.weight=-1", "objectives.mlm.weight: must be >= 0"),
])
def test_out_of_range_settings(setting, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        load_config(None, [setting])


@pytest.mark.parametrize("setting", [
    "optim.warmup_steps=0", "optim.weight_decay=0", "optim.min_lr_ratio=1", "optim.clip_norm=null",
    "run.seed=0", "run.eval_batches=null", "speed.prefetch=0", "data.heldout_documents=0.5",
    "data.heldout_documents=3", "data.bucket_window=0", "data.instances.max_seq_length=6",
    "data.instances.short_seq_prob=0", "data.masking.mlm_probability=0.99", "tokenizer.min_frequency=0",
])
def test_boundary_settings_are_accepted(setting):
    load_config(None, [setting])


# ------------------------------------------------------------------------------------ one schema per concept
def test_model_section_is_the_architectures_config_fields():
    from bertology.training.config import ModelConfig

    config = load_config(None, ["model.preset=mini", "model.hidden_size=320", "model.hidden_act=relu",
                                "model.family=electra", "model.embedding_size=null"])
    assert config.model.preset == "mini" and config.model.family == "electra" and config.model.kind == "encoder"
    assert config.model.settings == {"hidden_size": 320, "hidden_act": "relu", "family": "electra"}
    # The section is {architecture, preset, init_from} and the settings given, written flat.
    assert config.to_dict()["model"] == {"architecture": None, "preset": "mini", "init_from": None,
                                         "hidden_size": 320, "hidden_act": "relu", "family": "electra"}
    decoder = load_config(None, ["model.architecture=decoder", "model.family=gpt2", "model.hidden_size=64",
                                 "model.gated_ffn=true", "data.instances.kind=packed-documents"])
    assert decoder.model.kind == "decoder" and decoder.model.settings == {"family": "gpt2", "hidden_size": 64,
                                                                          "gated_ffn": True}
    assert decoder.objectives == {"clm": {}}  # a decoder's default objective
    assert ModelConfig(preset="mini", settings={"hidden_size": 320}) == load_config(
        None, ["model.preset=mini", "model.hidden_size=320"]).model
    xlnet = load_config(None, ["model.architecture=xlnet", "model.mem_len=64", "tokenizer.style=xlnet",
                               "tokenizer.kind=unigram", "data.instances.kind=full-sentences"])
    assert xlnet.model.settings == {"mem_len": 64} and xlnet.objectives == {"plm": {}}


def test_every_architecture_field_is_accepted_and_checked():
    """Each field of each registered architecture's config class is a key of the model section, checked against
    its type; the same key under another architecture that lacks it is an error naming the architecture."""
    import dataclasses

    from bertology.config import schema_fields
    from bertology.model.registry import registered
    from bertology.training.config import ModelConfig

    for name in ("encoder", "decoder", "seq2seq", "xlnet", "elmo"):
        fields = schema_fields(registered(name).config_class)
        assert "extra" not in fields and "num_layers" in fields
        values = {f.name: getattr(registered(name).config_class(), f.name)
                  for f in dataclasses.fields(registered(name).config_class) if f.name in fields}
        values["family"] = {"decoder": "gpt2", "seq2seq": "t5"}.get(name, values["family"])
        assert ModelConfig(architecture=name, settings=values).settings == {k: v for k, v in values.items()
                                                                             if v is not None}
    with pytest.raises(ConfigError, match="^model.mem_len: unknown key for the encoder architecture .*a field of "
                                          "xlnet models: set model.architecture"):
        load_config(None, ["model.mem_len=4"])
    with pytest.raises(ConfigError, match="^model.cell_size: unknown key for the decoder architecture .*a field of "
                                          "elmo models"):
        load_config(None, ["model.architecture=decoder", "model.family=gpt2", "model.cell_size=2",
                           "data.instances.kind=packed-documents"])
    # The encoders, decoders and encoder-decoders share one config class: each takes its every field.
    assert load_config(None, ["model.gated_ffn=true"]).model.settings == {"gated_ffn": True}


@pytest.mark.parametrize("setting,message", [
    ("model.hidden_size=1.5", "model.hidden_size: expected int, got float 1.5"),
    ("model.positions_after_padding=1", "model.positions_after_padding: expected bool"),
    ("model.family=bartt", "model.family: unknown family 'bartt'; did you mean bart?"),
    ("model.family=gpt2", "model.family: the encoder architecture builds .*: gpt2 is a family of the decoder "
                          r"architecture \(model: \{architecture: decoder, family: gpt2"),
    ("model.architecture=decodr", "model.architecture: unknown architecture 'decodr'; did you mean decoder?"),
    ("model.gated_ffn=1", "model.gated_ffn: expected bool, got int 1"),
    ("model.relative_attention_num_buckets=true", "model.relative_attention_num_buckets: expected int, got bool"),
    ("model.preset=minii", "model.preset: unknown preset 'minii'; did you mean mini?"),
    ("model.extra={}", "model.extra: unknown key"),
    ("model.num_hidden_layers=4", "model.num_hidden_layers: unknown key; did you mean num_layers?"),
])
def test_model_section_errors(setting, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        load_config(None, [setting])


@pytest.mark.parametrize("settings,message", [
    (["model.architecture=seq2seq", "model.family=t5", "model.relative_attention_num_buckets=true"],
     "model.relative_attention_num_buckets: expected int, got bool"),
    (["model.architecture=decoder", "model.family=t5"], "model.family: the decoder architecture builds gpt2"),
    (["model.architecture=elmo", "model.family=bert"], "model.family: elmo models are of the family 'elmo'"),
])
def test_model_section_errors_of_other_architectures(settings, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        load_config(None, settings)


@pytest.mark.parametrize("section,key", [
    ({"family": "gpt2", "preset": "tiny"}, "family"),
    ({"preset": "tiny", "elmo": {"projection_dim": 128}}, "elmo"),
    ({"preset": "tiny", "mem_len": 256}, "mem_len"),
    ({"overrides": {"hidden_size": 64}}, "overrides"),
])
def test_a_model_section_of_the_old_shape_says_the_new_one(tmp_path, section, key):
    """Before the registry resolved it, the section had a family (choosing the schema), an ``elmo`` mapping and
    XLNet keys taken by the tokenizer's style; each of those is an error that shows the section's shape now."""
    import yaml

    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({"model": section}), encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{path}: model\.{key}: .*architecture") as error:
        load_config(path)
    assert "KeyError" not in str(error.value)


def test_model_config_python_construction_checks_settings():
    from bertology.training.config import ModelConfig

    with pytest.raises(ConfigError, match="model.hidden_sise: unknown key; did you mean hidden_size?"):
        ModelConfig(settings={"hidden_sise": 64})
    with pytest.raises(ConfigError, match="model.num_layers: expected int, got str"):
        ModelConfig(settings={"num_layers": "4"})
    assert ModelConfig(settings={"num_layers": 4, "hidden_size": None}).settings == {"num_layers": 4}
    # With init_from and no architecture, the checkpoint's config class checks them (in the recipe).
    assert ModelConfig(init_from="somewhere", settings={"mem_len": 4}).settings == {"mem_len": 4}


def test_instances_section_is_instance_config():
    from bertology.data import InstanceConfig

    config = load_config(None, ["data.instances.kind=segment-pair", "data.instances.max_seq_length=64"])
    assert isinstance(config.data.instances, InstanceConfig) and config.data.instances.nsp is False
    assert config.objectives == {"mlm": {}}
    with pytest.raises(ConfigError, match="data.instances.seed: not set in a config file; the seed is run.seed"):
        load_config(None, ["data.instances.seed=3"])
    with pytest.raises(ConfigError, match="data.instances.nsp: not set in a config file"):
        load_config(None, ["data.instances.nsp=true"])


def test_to_dict_keeps_the_recorded_shape():
    """The trainer records to_dict() in checkpoints and compares it on resume: same sections and keys."""
    data = PretrainConfig().to_dict()
    assert list(data) == ["model", "tokenizer", "data", "objectives", "optim", "run", "speed"]
    assert data["data"]["instances"] == {"kind": "nsp", "max_seq_length": 128, "short_seq_prob": 0.1,
                                         "dupe_factor": 1}
    assert data["objectives"] == {"mlm": {}, "nsp": {}}
    assert data["optim"]["betas"] == [0.9, 0.999]
    assert data["model"] == {"architecture": None, "preset": "tiny", "init_from": None}
    assert json.loads(json.dumps(data)) == data


def test_objectives_are_checked_once_against_their_classes():
    from bertology.objectives import MaskedLM, NextSentence

    config = load_config(None, ["objectives={mlm: {weight: 2}, nsp: null}"])
    assert config.objectives == {"mlm": {"weight": 2.0}, "nsp": {}}
    objectives = config.build_objectives()
    assert [type(o) for o in objectives] == [MaskedLM, NextSentence] and objectives[0].weight == 2.0
    assert config.build_objectives()[0] is not objectives[0]  # fresh instances (the recipe sets activation)
    for key in ("name", "activation"):
        with pytest.raises(ConfigError, match=f"objectives.mlm.{key}: unknown key"):
            load_config(None, [f"objectives.mlm.{key}=x"])
    with pytest.raises(ConfigError, match="objectives.mlm.weight: expected float, got str 'heavy'"):
        PretrainConfig(objectives={"mlm": {"weight": "heavy"}})
    with pytest.raises(ConfigError, match="objectives.mln: unknown objective; did you mean mlm?"):
        PretrainConfig(objectives={"mln": {}})
    with pytest.raises(ConfigError, match="objectives: at least one objective is needed"):
        load_config(None, ["objectives={}"])


def test_set_keeps_working_and_refuses_nan():
    config = load_config(None, ["optim.lr=2e-4", "data.masking.selection=bernoulli", "model.num_layers=3"])
    assert config.optim.lr == 2e-4 and config.data.masking.selection == "bernoulli"
    assert config.model.settings == {"num_layers": 3}
    with pytest.raises(ConfigError, match="optim.lr: must be a finite number, got nan"):
        load_config(None, ["optim.lr=.nan"])
    with pytest.raises(ConfigError, match="optim.lr: expected float, got str 'nan'"):
        load_config(None, ["optim.lr=nan"])
