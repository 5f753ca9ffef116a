"""--device and --dtype on every command that runs a model: --device cpu gives bit-identical results to the
default (auto, which is the CPU on a machine without a GPU), and a CUDA device without one, a bad device name and
a half precision on the CPU are one-line errors naming the option (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertology.cli.main import main
from bertology.model import EncoderModel, Pretrained, preset
from bertology.model.encoder import HeadSpec
from bertology.tokenization import train_tokenizer

WORDS = ("the cat sat on the mat . a dog ran in the park and the birds sang . paris is the capital of france . "
         "she went to the bank of the river . he put money in the bank .").split()
SENTENCES = [" ".join(WORDS[i:i + 6]) for i in range(0, len(WORDS) - 6, 3)]


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    """The same answers on a machine with a GPU: auto is the CPU, and cuda is not there."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def conllu(sentences: list[str]) -> str:
    blocks = []
    for n, sentence in enumerate(sentences):
        words = sentence.split()
        lines = [f"# sent_id = s{n}", f"# text = {sentence}"]
        for i, word in enumerate(words, start=1):
            upos = "PUNCT" if word == "." else ("DET" if word in ("the", "a") else "NOUN")
            head, relation = (0, "root") if i == 1 else (1, "punct" if word == "." else "dep")
            lines.append(f"{i}\t{word}\t{word}\t{upos}\t_\t_\t{head}\t{relation}\t_\t_")
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks) + "\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """A tiny masked-LM model, an sst2 classifier over the same tokenizer, and small inputs for every command."""
    root = tmp_path_factory.mktemp("device")
    tokenizer = train_tokenizer(iter([" ".join(WORDS)] * 4), "wordpiece", 90, show_progress=False, min_frequency=1)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=2, hidden_size=32, num_heads=2,
                    intermediate_size=64, max_position_embeddings=64)
    model = EncoderModel(config, [HeadSpec("mlm", "masked_lm")])
    model.init_weights(torch.Generator().manual_seed(0))
    Pretrained(model, tokenizer).save(root / "model")

    from bertology.tasks.lookup import get_task

    classifier = EncoderModel(config, get_task("sst2").heads(config))
    classifier.init_weights(torch.Generator().manual_seed(1))
    Pretrained(classifier, tokenizer).save(root / "sst2")
    (root / "dev.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{i % 2}\n" for i, s in
                                                                 enumerate(SENTENCES)), encoding="utf-8")

    (root / "texts.txt").write_text("\n".join(SENTENCES * 2) + "\n", encoding="utf-8")
    (root / "passages.jsonl").write_text("".join(json.dumps({"id": i, "text": s}) + "\n"
                                                 for i, s in enumerate(SENTENCES)), encoding="utf-8")
    (root / "corpus").mkdir()
    (root / "corpus" / "a.jsonl").write_bytes((root / "passages.jsonl").read_bytes())
    (root / "labelled.tsv").write_text("".join(f"{s}\tthe\t{'a' if i % 2 else 'b'}\n" for i, s in
                                               enumerate(SENTENCES) if " the " in f" {s} "), encoding="utf-8")
    squad = {"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": s, "qas": [{"id": f"q{i}", "question": " ".join(s.split()[:3]),
                                "answers": [{"text": s.split()[1], "answer_start": s.index(s.split()[1])}]}]}
        for i, s in enumerate(SENTENCES)]}]}
    (root / "squad.json").write_text(json.dumps(squad), encoding="utf-8")
    assert main(["index", "build", "--model", str(root / "model"), "--squad", str(root / "squad.json"), "--out",
                 str(root / "squad-index"), "--quiet", "--device", "cpu"]) == 0
    ud = root / "data" / "ud-english-ewt"
    ud.mkdir(parents=True)
    for split in ("train", "dev", "test"):
        (ud / f"en_ewt-ud-{split}.conllu").write_text(conllu(SENTENCES), encoding="utf-8")
    return root


def run(*argv) -> int:
    return main([str(a) for a in argv])


def commands(f: Path, out: Path) -> dict[str, list]:
    """Each command that runs a model, with arguments that make it quick, writing under `out`."""
    return {
        "embed": ["embed", "--model", f / "model", "--input", f / "texts.txt", "--output", out / "v.npz",
                  "--level", "token", "--quiet"],
        "embed-corpus": ["embed", "--model", f / "model", "--input", f / "corpus", "--format", "jsonl",
                         "--output", out / "corpus", "--quiet", "--shard-size", "4"],
        "fill-mask": ["fill-mask", "--model", f / "model", "the cat [MASK] on the mat", "--top-k", "3"],
        "predict": ["predict", "--model", f / "sst2", "--task", "sst2", "--input", f / "dev.tsv",
                    "--output", out / "pred.tsv"],
        "index": ["index", "build", "--model", f / "model", "--input", f / "passages.jsonl", "--out", out / "index",
                  "--quiet"],
        "demo": ["demo", "--model", f / "model", "--layers", "last"],
        "evaluate-retrieval": ["evaluate", "--task", "retrieval", "--index", f / "squad-index", "--squad",
                               f / "squad.json"],
        "anisotropy": ["anisotropy", "--model", f / "model", "--corpus", f / "texts.txt", "--out", out,
                       "--bootstrap", "20", "--quiet"],
        "neighbours": ["neighbours", "--model", f / "model", "--corpus", f / "texts.txt", "--out", out,
                       "--query", "bank", "he put money in the bank", "-k", "3", "--quiet"],
        "sense-map": ["sense-map", "--model", f / "model", "--labelled", f / "labelled.tsv", "--out", out,
                      "--method", "pca"],
        "probe": ["probe", "--model", f / "model", "--ud", f / "data" / "ud-english-ewt", "--out", out,
                  "--epochs", "2", "--l2", "0", "--tasks", "upos", "--quiet"],
        "heads-stats": ["heads", "stats", "--model", f / "model", "--ud", f / "data" / "ud-english-ewt",
                        "--out", out, "--min-count", "1", "--quiet"],
        "heads-importance": ["heads", "importance", "--model", f / "model", "--text", f / "texts.txt",
                             "--examples", "6", "--out", out, "--step", "0.5", "--quiet"],
        "heads-prune": ["heads", "prune", "--model", f / "model", "--text", f / "texts.txt", "--examples", "6",
                        "--share", "0.5", "--step", "0.5", "--out", out / "pruned", "--quiet"],
        "analyze": ["analyze", "--model", f / "model", "--out", out, "--only", "anisotropy", "--data", f / "data",
                    "--quick"],
    }


def without_seconds(value):
    """A JSON value with its timings (the only thing two runs may differ in) left out."""
    if isinstance(value, dict):
        return {k: without_seconds(v) for k, v in value.items() if k not in ("seconds", "fit seconds")}
    if isinstance(value, list):
        return [without_seconds(v) for v in value]
    return value


def printed_lines(printed: str) -> list[object]:
    """What a command printed, line by line; a JSON line (a command's result) read back without its timings."""
    lines: list[object] = []
    for line in printed.splitlines():
        try:
            lines.append(without_seconds(json.loads(line)))
        except ValueError:
            lines.append(line)
    return lines


def results(out: Path, printed: str) -> dict[str, object]:
    """What a command left: its printed output and every file under `out` (arrays and JSON read back)."""
    found: dict[str, object] = {"printed": printed_lines(printed)}
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        name = str(path.relative_to(out))
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as data:
                found[name] = {k: data[k].tolist() for k in data.files}
        elif path.suffix == ".npy":
            found[name] = np.load(path).tolist()
        elif path.suffix == ".json":
            text = path.read_text(encoding="utf-8").replace(str(out), "OUT")  # the report names its own folder
            found[name] = without_seconds(json.loads(text))
        elif path.suffix in (".png", ".html"):
            continue  # figures and the page: drawn from the JSON compared above
        else:
            found[name] = path.read_bytes()
    return found


@pytest.mark.parametrize("name", list(commands(Path("f"), Path("o"))))
def test_device_cpu_is_bit_identical_to_the_default(name, files, tmp_path, capsys):
    outputs = []
    for extra in ([], ["--device", "cpu", "--dtype", "float32"]):
        out = tmp_path / ("default" if not extra else "cpu")
        out.mkdir()
        assert run(*commands(files, out)[name], *extra) == 0, capsys.readouterr().err
        printed = capsys.readouterr().out
        outputs.append(results(out, printed.replace(str(out), "OUT")))
    assert len(outputs[0]) > 1 or outputs[0]["printed"]  # something was written or printed
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("name", list(commands(Path("f"), Path("o"))) + ["serve", "search", "wsd-fit"])
@pytest.mark.parametrize("extra, option, message", [
    (["--device", "cuda"], "--device", "'cuda' asked for, but CUDA is not available on this machine"),
    (["--device", "cuda:1"], "--device", "'cuda:1' asked for, but CUDA is not available"),
    (["--device", "gpu"], "--device", "'gpu' is not a device; expected auto, cpu, cuda or cuda:N"),
    (["--dtype", "bfloat16"], "--dtype", "bfloat16: half precision runs on a GPU only, and this runs on cpu"),
    (["--device", "cpu", "--dtype", "float16"], "--dtype", "float16: half precision runs on a GPU only"),
])
def test_no_gpu_bad_devices_and_half_precision_on_the_cpu_are_one_line_errors(name, extra, option, message, files,
                                                                            tmp_path, capsys):
    argv = {**commands(files, tmp_path),
            "serve": ["serve", "--model", files / "model", "--port", "0"],
            "search": ["search", "--index", tmp_path / "no-index", "paris"],
            "wsd-fit": ["wsd", "fit", "--model", files / "model", "--semcor", tmp_path, "--wordnet", tmp_path,
                        "--out", tmp_path / "senses.npz"]}[name]
    assert run(*argv, *extra) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bertology {argv[0]}: error: {option}") and message in err, err
    assert err.count("\n") == 1  # one line
    assert not any(tmp_path.rglob("*.npz")) and not (tmp_path / "index").exists()  # nothing written


def test_evaluate_takes_the_device_for_retrieval_only(files, tmp_path, capsys):
    predictions = tmp_path / "pred.tsv"
    assert run("predict", "--model", files / "sst2", "--task", "sst2", "--input", files / "dev.tsv",
               "--output", predictions) == 0
    capsys.readouterr()
    assert run("evaluate", "--task", "sst2", "--gold", files / "dev.tsv", "--predictions", predictions) == 0
    assert run("evaluate", "--task", "sst2", "--gold", files / "dev.tsv", "--predictions", predictions,
               "--device", "cpu") == 2
    assert capsys.readouterr().err.endswith("error: --device, --dtype: for --task retrieval and open-qa only (they "
                                            "embed the questions); sst2 scores files\n")


def test_int8_keeps_working_and_is_the_cpus(files, tmp_path, capsys):
    out = tmp_path / "v.npy"
    assert run("embed", "--model", files / "model", "--input", files / "texts.txt", "--output", out,
               "--dtype", "int8") == 0
    assert np.load(out).shape == (len(SENTENCES) * 2, 32)
    assert run("embed", "--model", files / "model", "--input", files / "texts.txt", "--output", out,
               "--dtype", "int8", "--device", "cuda") == 2
    assert "--device: 'cuda' asked for, but CUDA is not available" in capsys.readouterr().err
    for bad in ("int8", "float64"):  # fill-mask has no int8 path; float64 is nobody's
        with pytest.raises(SystemExit) as exited:
            run("fill-mask", "--model", files / "model", "the [MASK]", "--dtype", bad)
        assert exited.value.code == 2
        assert f"argument --dtype: invalid choice: '{bad}'" in capsys.readouterr().err


def test_ray_options_are_checked_before_anything_runs(files, tmp_path, capsys):
    base = ["embed", "--model", files / "model", "--input", files / "corpus", "--format", "jsonl",
            "--output", tmp_path / "corpus"]
    assert run(*base, "--gpus-per-worker", "1") == 2
    assert "--gpus-per-worker: for corpus mode with --engine ray only" in capsys.readouterr().err
    assert run("embed", "--model", files / "model", "--input", files / "texts.txt", "--output", tmp_path / "v.npy",
               "--gpus-per-worker", "1") == 2
    assert "--gpus-per-worker: for corpus mode only" in capsys.readouterr().err
    assert not (tmp_path / "corpus").exists()


def test_serve_and_search_take_the_device(files, tmp_path, capsys):
    """The service and the index answer the same on --device cpu as by default; the service says where it runs."""
    from fastapi.testclient import TestClient

    from bertology.serve import create_app

    answers = []
    for device in (None, "cpu", "auto"):
        with TestClient(create_app(files / "model", device=device)) as client:
            health = client.get("/health").json()
            assert health["device"] == "cpu" and health["dtype"] == "float32"
            answers.append((client.post("/v1/embed", json={"texts": SENTENCES[:3]}).json(),
                            client.post("/v1/fill-mask", json={"texts": ["the cat [MASK] on the mat"]}).json()))
    assert answers[0] == answers[1] == answers[2]
    assert run("index", "build", "--model", files / "model", "--input", files / "passages.jsonl", "--out",
               tmp_path / "index", "--quiet") == 0
    assert json.loads(capsys.readouterr().out)["passages"] == 12  # the build's result, one JSON object
    printed = []
    for extra in ([], ["--device", "cpu"]):
        assert run("search", "--index", tmp_path / "index", "--k", "2", *extra, "paris", "the bank") == 0
        printed.append(capsys.readouterr().out)
    assert printed[0] == printed[1] and printed[0].count("\n") == 2
