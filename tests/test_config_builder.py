"""bertology.config: one validator for mappings and Python construction, file readers that refuse ambiguity."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal

import pytest

from bertology.config import (
    ALLOW_NONFINITE,
    decode_text,
    derived,
    from_mapping,
    load_json,
    load_yaml,
    to_mapping,
    validate,
)
from bertology.data import InstanceConfig, MaskingConfig
from bertology.errors import ConfigError


@dataclass
class Inner:
    rate: float = 0.5
    mode: Literal["a", "b"] = "a"

    def __post_init__(self) -> None:
        validate(self, "Inner")


@dataclass
class Outer:
    count: int = 1
    ratio: float = 0.1
    wild: float = field(default=0.0, metadata=ALLOW_NONFINITE)
    flag: bool = False
    pair: tuple[float, float] = (0.0, 1.0)
    names: list[str] = field(default_factory=list)
    inner: Inner = field(default_factory=Inner)
    token: int = derived(0, "set by the code")

    def __post_init__(self) -> None:
        validate(self, "outer")


WRONG = [
    ("count", True, "outer.count: expected int, got bool True"),
    ("count", 1.0, "outer.count: expected int, got float 1.0"),
    ("ratio", "fast", "outer.ratio: expected float, got str 'fast'"),
    ("ratio", False, "outer.ratio: expected float, got bool False"),
    ("ratio", math.nan, "outer.ratio: must be a finite number, got nan"),
    ("ratio", -math.inf, "outer.ratio: must be a finite number, got -inf"),
    ("flag", 1, "outer.flag: expected bool, got int 1"),
    ("pair", [1.0], "outer.pair: expected a list of 2 values"),
    ("pair", [1.0, math.nan], r"outer.pair\[1\]: must be a finite number"),
    ("names", [1], r"outer.names\[0\]: expected str, got int 1"),
]


@pytest.mark.parametrize("key,value,message", WRONG)
def test_mapping_and_python_construction_agree(key, value, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        from_mapping(Outer, {key: value}, "outer")
    with pytest.raises(ConfigError, match=f"^{message}"):
        Outer(**{key: value})


def test_nested_literal_and_paths():
    with pytest.raises(ConfigError, match="^outer.inner.mode: expected one of 'a', 'b', got str 'c'"):
        from_mapping(Outer, {"inner": {"mode": "c"}}, "outer")
    with pytest.raises(ConfigError, match="^Inner.mode: expected one of 'a', 'b', got str 'c'"):
        Inner(mode="c")
    with pytest.raises(ConfigError, match="^outer.inner: expected Inner"):
        Outer(inner={"mode": "a"})


def test_opt_in_non_finite_and_normalisation():
    assert math.isinf(from_mapping(Outer, {"wild": math.inf}, "outer").wild)
    built = Outer(ratio=1, pair=[0, 1])
    assert type(built.ratio) is float and built.pair == (0.0, 1.0)
    # Only in config text: YAML 1.1's "1e-4" string is a float, and one string is a list of one.
    assert from_mapping(Outer, {"ratio": "1e-4", "names": "x"}, "outer") == Outer(ratio=1e-4, names=["x"])
    with pytest.raises(ConfigError, match="outer.ratio: expected float, got str"):
        Outer(ratio="1e-4")


def test_derived_fields():
    with pytest.raises(ConfigError, match="^outer.token: not set in a config file; set by the code"):
        from_mapping(Outer, {"token": 3}, "outer")
    assert Outer(token=3).token == 3
    assert "token" not in to_mapping(Outer(token=3))
    assert from_mapping(Outer, to_mapping(Outer(count=4, names=["a"])), "outer") == Outer(count=4, names=["a"])


@pytest.mark.parametrize("cls", [MaskingConfig, InstanceConfig])
def test_data_configs_round_trip(cls):
    config = cls()
    again = from_mapping(cls, to_mapping(config), "x")
    assert again == config
    assert set(to_mapping(config)) == {f.name for f in dataclasses.fields(cls) if "derived" not in f.metadata}


def test_yaml_duplicates_and_errors():
    with pytest.raises(ConfigError, match=r"^f.yaml: a.b is given twice \(lines 2 and 3\)$"):
        load_yaml("a:\n  b: 1\n  b: 2\n", "f.yaml")
    with pytest.raises(ConfigError, match=r"^f.yaml: xs\[1\].k is given twice \(lines 3 and 3\)$"):
        load_yaml("xs:\n- {k: 1}\n- {k: 1, k: 2}\n", "f.yaml")
    assert load_yaml("a: &x {b: 1}\nc: *x\n", "f.yaml") == {"a": {"b": 1}, "c": {"b": 1}}
    assert load_yaml("base: &b {x: 1}\nd:\n  <<: *b\n  y: 2\n", "f.yaml")["d"] == {"x": 1, "y": 2}
    with pytest.raises(ConfigError, match=r"^f.yaml: line \d+ column \d+: invalid YAML"):
        load_yaml("a: [1\n", "f.yaml")
    assert load_yaml("[1", "--set", invalid_as_text=True) == "[1"


def test_json_duplicates():
    with pytest.raises(ConfigError, match=r"^f.json: a\[0\].b is given twice$"):
        load_json('{"a": [{"b": 1, "b": 2}]}', "f.json")
    assert load_json('{"a": {"b": 1}, "c": [1, {"d": null}]}', "f.json") == {"a": {"b": 1}, "c": [1, {"d": None}]}
    with pytest.raises(ConfigError, match=r"^f.json: line 1 column \d+: invalid JSON"):
        load_json('{"a": ', "f.json")


def test_decode_text():
    assert decode_text("é".encode(), "f") == "é"
    assert decode_text(b"\xef\xbb\xbfa: 1", "f") == "a: 1"
    with pytest.raises(ConfigError, match=r"^f.yaml: not UTF-8 text: byte 4 \(line 2\) is 0xff"):
        decode_text(b"a:\n \xff", "f.yaml")


@dataclass
class Terms:
    terms: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        validate(self, "terms")


def test_a_tuple_of_any_length():
    """``tuple[X, ...]`` (DeBERTa's pos_att_type) takes a list of any length from a config file, and one string
    as a list of one; each entry is checked."""
    assert from_mapping(Terms, {"terms": ["p2c", "c2p"]}, "model").terms == ("p2c", "c2p")
    assert from_mapping(Terms, {"terms": []}, "model").terms == ()
    assert from_mapping(Terms, {"terms": "c2p"}, "model").terms == ("c2p",)
    with pytest.raises(ConfigError, match=r"model.terms\[1\]: expected str, got int 2"):
        from_mapping(Terms, {"terms": ["c2p", 2]}, "model")
    with pytest.raises(ConfigError, match=r"model.terms: expected a list, got int 3"):
        from_mapping(Terms, {"terms": 3}, "model")
