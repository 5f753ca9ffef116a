"""Run directories with symbolic links in them: a `checkpoints` or `model` link that leaves the run directory is
refused before any work (one line naming the link and its target), `--overwrite` never deletes through a link (a
link inside the run is removed itself), nothing is written outside `--out`; and `pretrain` prints its result as one
JSON object on stdout."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))  # tests/training/pretrain_helpers.py

from pretrain_helpers import make_assets, tiny_config  # noqa: E402

from bertology.cli.main import main  # noqa: E402
from bertology.errors import ConfigError  # noqa: E402
from bertology.io import files_into, link_out_of, remove_output  # noqa: E402
from finetune_helpers import save_tiny_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("assets"))


def pretrain(tmp_path, assets, out: Path, *flags: str) -> list[str]:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(tiny_config(assets, out, optim={"total_steps": 4}, run={"eval_every": 0})))
    return ["pretrain", "--config", str(config), *flags]


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_pretrain_prints_its_result_as_one_json_object_on_stdout(tmp_path, assets, capsys):
    out = tmp_path / "run"
    assert main(pretrain(tmp_path, assets, out)) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)  # stdout holds the result only
    assert result["steps"] == 4 and result["model"] == str(out / "model") and (out / "model").is_dir()
    assert result["output_dir"] == str(out) and isinstance(result["metrics"], dict) and result["metrics"]
    assert all(value is None or isinstance(value, (int, float)) for value in result["metrics"].values())
    assert "trained 4 steps" in captured.err  # the human summary stays on stderr


@pytest.mark.parametrize("name", ["checkpoints", "model"])
@pytest.mark.parametrize("flag", ["--overwrite", "--resume"])
def test_a_link_out_of_the_run_directory_is_refused_and_nothing_is_written_through_it(name, flag, tmp_path, assets,
                                                                                     capsys):
    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("not bertology's")
    (out / "metrics.jsonl").write_text("{}\n")  # an earlier run's output
    os.symlink(elsewhere, out / name)
    assert main(pretrain(tmp_path, assets, out, flag)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{out / name} is a link to {elsewhere}, outside that directory" in err
    assert tree(elsewhere) == {"keep.txt": b"not bertology's"} and (out / name).is_symlink()


def test_overwrite_removes_a_link_inside_the_run_not_what_it_points_to(tmp_path, assets, capsys):
    out = tmp_path / "run"
    (out / "mine").mkdir(parents=True)
    (out / "mine" / "keep.txt").write_text("kept")
    (out / "metrics.jsonl").write_text("{}\n")
    os.symlink(out / "mine", out / "checkpoints")
    assert main(pretrain(tmp_path, assets, out, "--overwrite")) == 0
    capsys.readouterr()
    assert tree(out / "mine") == {"keep.txt": b"kept"}
    assert (out / "checkpoints").is_dir() and not (out / "checkpoints").is_symlink()


def test_finetune_overwrite_refuses_a_model_link_out_of_the_run(tmp_path, capsys):
    model = save_tiny_model(tmp_path / "base", ["the film was good", "the film was bad"] * 5)
    glue = tmp_path / "glue" / "SST-2"
    glue.mkdir(parents=True)
    for split in ("train", "dev"):
        (glue / f"{split}.tsv").write_text("sentence\tlabel\n" + "the film was good\t1\nthe film was bad\t0\n" * 4)
    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (elsewhere / "config.json").write_text("{}")
    (out / "best.json").write_text("{}")
    os.symlink(elsewhere, out / "model")
    argv = ["finetune", "--task", "sst2", "--model", str(model), "--out", str(out), "--data", str(glue.parent),
            "--max-steps", "1", "--overwrite", "--set", "optim.batch_size=4"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out / 'model'} is a link to {elsewhere}, outside that directory" in err
    assert tree(elsewhere) == {"config.json": b"{}"}
    os.unlink(out / "model")  # without the link the run goes, and prints its result on stdout
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["steps"] == 1 and result["model"] == str(out / "model") and "accuracy" in result["dev_metrics"]
    assert tree(elsewhere) == {"config.json": b"{}"}


def test_files_into_never_writes_through_a_link_out_of_the_directory(tmp_path):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    os.symlink(elsewhere, out / "figures")
    os.symlink(out, out / "here")  # a link that stays inside is followed
    assert link_out_of(out, out / "figures" / "a.png") == elsewhere.resolve()
    assert link_out_of(out, out / "here" / "a.png") is None and link_out_of(out, out / "a.png") is None
    with pytest.raises(ConfigError, match=r"figures/a.png: a link on the way leads to .*elsewhere, outside"):
        with files_into(out) as tmp:
            (tmp / "figures").mkdir()
            (tmp / "figures" / "a.png").write_bytes(b"png")
            (tmp / "numbers.json").write_text("{}")
    assert list(elsewhere.iterdir()) == [] and not (out / "numbers.json").exists()  # checked before any rename


def test_remove_output_removes_a_link_itself(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "f").write_text("x")
    os.symlink(target, tmp_path / "link")
    remove_output(tmp_path / "link")
    assert not os.path.lexists(tmp_path / "link") and (target / "f").read_text() == "x"
    remove_output(target)
    assert not target.exists()
    remove_output(tmp_path / "missing")  # nothing there: nothing to do
