"""Run configs: presets load, overrides apply, typos and wrong types are errors naming the key's path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertology.cli.main import main
from bertology.errors import ConfigError
from bertology.training.config import PretrainConfig, apply_overrides, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_presets_load(name):
    config = load_config(CONFIGS / name)
    assert config.optim.total_steps >= 1 and config.objectives and "mlm" in config.objectives


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
    (["data.masking.mlm_probability=1.5"], "data.masking.mlm_probability: must be in [0, 1]"),
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
