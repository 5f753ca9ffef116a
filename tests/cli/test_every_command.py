"""Every command on a tiny random model of every registered family: each gives its result (a JSON object on stdout
for the commands that report one) or refuses in one line on stderr naming what the family lacks (exit 2), never a
traceback. The models are built by transformers (BERT, RoBERTa, ALBERT, ELECTRA, DistilBERT, XLM-R, GPT-2, T5,
BART, XLNet, Longformer) or bertology (ELMo) once per module; the data are small files written here (a text corpus,
GLUE SST-2, passages, a UD treebank, sense-labelled sentences); `wsd` reads the shared SemCor and WordNet and is
skipped without them. `EXPECTED_REFUSALS` lists what each family cannot do: a command outside it must succeed.
`serve` runs as its app in-process (no port). Not here: `pretrain` (a run config, not a model: test_run_directories
and tests/training), `quickstart` (tests/recipes/test_quickstart.py), `evaluate --task retrieval`
(tests/retrieval)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from bertology.cli.main import main
from framing_helpers import backend

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILIES = ("bert", "roberta", "albert", "electra", "distilbert", "xlm-roberta", "gpt2", "t5", "bart", "xlnet",
            "longformer", "modernbert", "deberta-v2", "elmo")
STYLE = {"bert": "bert", "albert": "bert", "electra": "bert", "distilbert": "bert", "modernbert": "bert",
         "deberta-v2": "deberta",
         "roberta": "roberta",
         "xlm-roberta": "roberta", "longformer": "roberta", "gpt2": "gpt2", "t5": "t5", "bart": "bart",
         "xlnet": "xlnet"}
TOKENIZER_CLASS = {"bert": "BertTokenizer", "roberta": "RobertaTokenizer", "bart": "BartTokenizer",
                   "gpt2": "GPT2Tokenizer", "t5": "T5Tokenizer", "xlnet": "XLNetTokenizer",
                   "deberta": "DebertaV2Tokenizer"}
MASK = {"bert": "[MASK]", "deberta": "[MASK]", "roberta": "<mask>", "bart": "<mask>", "xlnet": "<mask>", "t5": "<extra_id_0>",
        "gpt2": "<mask>"}

ENCODERS = ("bert", "roberta", "albert", "electra", "distilbert", "xlm-roberta", "longformer", "modernbert",
            "deberta-v2")
# (command, family) -> what the refusal must say: the commands a family cannot run, each refused in one line.
EXPECTED_REFUSALS: dict[tuple[str, str], str] = {
    **{("generate", f): r"generation needs a decoder \(GPT-2\) or an encoder-decoder \(T5, BART\); this is a "
       rf"{f} model" for f in (*ENCODERS, "xlnet", "elmo")},
    ("fill-mask", "gpt2"): "fill-mask needs a masked-LM encoder .* this is a decoder-only model",
    ("fill-mask", "elmo"): "fill-mask needs a model with a masked-LM head; this one has no head",
    **{("longformer convert", f): rf"a Longformer is made from a bert, roberta, xlm-roberta encoder, got '{f}'"
       for f in FAMILIES if f not in ("bert", "roberta", "xlm-roberta")},
    **{("heads stats", f): "attention heads are read from a model that returns attention probabilities "
       for f in ("gpt2", "t5", "bart", "elmo")},
    **{("heads importance", f): "the model has no masked-LM head: give a fine-tuning task" for f in
       ("gpt2", "t5", "bart", "xlnet")},
    ("heads importance", "elmo"): "the model has no masked-LM head: give a fine-tuning task",
    **{("heads prune", f): rf"head importance and pruning .* needs a model that takes a head mask \(capability "
       rf"'head-mask'\); the model \({m}" for f, m in (("gpt2", "DecoderModel"), ("t5", "Seq2SeqModel"),
                                                           ("bart", "Seq2SeqModel"), ("xlnet", "XLNetModel"),
                                                           ("elmo", "ElmoModel"))},
    ("heads prune", "albert"): r"pruning the heads of shared layers \(ALBERT\) is not supported",
    # ModernBERT's model does not pass a head mask to its stack (it declares no 'head-mask'): stats only
    **{(f"heads {what}", "modernbert"): r"head importance and pruning .* needs a model that takes a head mask "
       r"\(capability 'head-mask'\); the model \(EncoderStackModel, registered as 'encoder-stack'\) does not "
       r"declare it" for what in ("importance", "prune")},
    ("heads prune", "longformer"): r"heads of a windowed model \(attention_window\) cannot be pruned",
    **{("longformer mlm-loss", f): rf"a {f} model without a masked-LM head \('mlm'\); mlm-loss scores masked-LM "
       "encoders" for f in ("gpt2", "t5", "bart", "xlnet", "elmo")},
}

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "in", "park", "with", "she", "read", "old", "book"]
SENTENCES = ["the cat sat on the mat", "a dog ran in the park with the cat", "she read the old book",
             "the dog sat with a cat", "a cat read the book in the park", "she ran with the old dog"]


def build_model(family: str, directory: Path) -> Path:
    """A random transformers model of `family` (its LM or MLM head) saved with a small tokenizer of its framing;
    ELMo: bertology's own tiny biLM with a word vocabulary."""
    if family == "elmo":
        from bertology.model import save_model
        from bertology.model.elmo import ElmoModel, tiny_config
        from bertology.tokenization.words import SPECIALS, WordVocabulary

        model = ElmoModel(tiny_config(projection_dim=8, cell_size=16))
        model.init_weights(torch.Generator().manual_seed(0))
        save_model(model, directory)
        WordVocabulary([*SPECIALS, *WORDS]).save(directory)
        return directory
    style = STYLE[family]
    made = backend(style)
    directory.mkdir(parents=True)
    made.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": TOKENIZER_CLASS[style]}))
    vocab, ids = made.get_vocab_size(), made.token_to_id
    T = transformers
    small = dict(vocab_size=vocab, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                 max_position_embeddings=66)
    torch.manual_seed(0)
    if family == "bert":
        model = T.BertForMaskedLM(T.BertConfig(**small))
    elif family == "albert":
        model = T.AlbertForMaskedLM(T.AlbertConfig(**small, embedding_size=8))
    elif family == "electra":
        model = T.ElectraForMaskedLM(T.ElectraConfig(**small, embedding_size=8))
    elif family == "distilbert":
        model = T.DistilBertForMaskedLM(T.DistilBertConfig(vocab_size=vocab, dim=16, n_layers=2, n_heads=2,
                                                           hidden_dim=32, max_position_embeddings=64))
    elif family == "roberta":
        model = T.RobertaForMaskedLM(T.RobertaConfig(**small, pad_token_id=ids("<pad>"), bos_token_id=ids("<s>"),
                                                     eos_token_id=ids("</s>")))
    elif family == "xlm-roberta":
        model = T.XLMRobertaForMaskedLM(T.XLMRobertaConfig(**small, pad_token_id=ids("<pad>")))
    elif family == "longformer":
        model = T.LongformerForMaskedLM(T.LongformerConfig(**small, attention_window=8, pad_token_id=ids("<pad>")))
    elif family == "gpt2":
        eos = ids("<|endoftext|>")
        model = T.GPT2LMHeadModel(T.GPT2Config(vocab_size=vocab, n_positions=64, n_embd=16, n_layer=2, n_head=2,
                                               bos_token_id=eos, eos_token_id=eos))
    elif family == "t5":
        model = T.T5ForConditionalGeneration(T.T5Config(
            vocab_size=vocab, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2, relative_attention_num_buckets=8,
            pad_token_id=ids("<pad>"), eos_token_id=ids("</s>"), decoder_start_token_id=ids("<pad>")))
    elif family == "bart":
        model = T.BartForConditionalGeneration(T.BartConfig(
            vocab_size=vocab, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
            pad_token_id=ids("<pad>"), bos_token_id=ids("<s>"), eos_token_id=ids("</s>"),
            decoder_start_token_id=ids("</s>"), forced_bos_token_id=None, forced_eos_token_id=None))
    elif family == "xlnet":
        model = T.XLNetLMHeadModel(T.XLNetConfig(vocab_size=vocab, d_model=16, n_layer=2, n_head=2, d_inner=32,
                                                 pad_token_id=ids("<pad>"), bos_token_id=ids("<s>"),
                                                 eos_token_id=ids("</s>"), mem_len=None))
    elif family == "modernbert":  # windows of 4 tokens in layer 1, narrower than the texts
        model = T.ModernBertForMaskedLM(T.ModernBertConfig(
            vocab_size=vocab, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
            max_position_embeddings=66, local_attention=4, global_attn_every_n_layers=2, pad_token_id=ids("[PAD]"),
            bos_token_id=ids("[CLS]"), cls_token_id=ids("[CLS]"), eos_token_id=ids("[SEP]"),
            sep_token_id=ids("[SEP]")))
    elif family == "deberta-v2":  # v3's settings: 4 log buckets a side, shorter than the texts
        model = T.DebertaV2ForMaskedLM(T.DebertaV2Config(
            **small, relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=4,
            max_relative_positions=16, share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False,
            type_vocab_size=0, pad_token_id=ids("[PAD]")))
    else:
        raise ValueError(family)
    model.eval().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {family: build_model(family, root / family) for family in FAMILIES}


def ud_sentence(rng, number: int) -> list[str]:
    """One CoNLL-U sentence: DET NOUN VERB ADP DET NOUN, the verb the root."""
    det, noun, verb, adp = (str(rng.choice(c)) for c in (["the", "a"], ["cat", "dog", "book"], ["sat", "ran", "read"],
                                                          ["on", "in", "with"]))
    noun2 = str(rng.choice(["mat", "park", "book"]))
    rows = [(det, "DET", 2, "det"), (noun, "NOUN", 3, "nsubj"), (verb, "VERB", 0, "root"), (adp, "ADP", 6, "case"),
            (str(rng.choice(["the", "a"])), "DET", 6, "det"), (noun2, "NOUN", 3, "obl")]
    text = " ".join(r[0] for r in rows)
    return [f"# sent_id = s{number}", f"# text = {text}"] + [
        f"{i}\t{w}\t{w}\t{pos}\t_\t_\t{head}\t{rel}\t_\t_" for i, (w, pos, head, rel) in enumerate(rows, start=1)] + [""]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES * 3) + "\n", encoding="utf-8")
    glue = root / "glue" / "SST-2"
    glue.mkdir(parents=True)
    for split, n in (("train", 24), ("dev", 8)):
        rows = [(f"the film was {'good' if label else 'bad'} and {rng.choice(WORDS)}", int(label))
                for label in rng.integers(0, 2, n)]
        (glue / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    passages = root / "passages.jsonl"
    passages.write_text("".join(json.dumps({"id": f"p{i}", "text": s}) + "\n" for i, s in enumerate(SENTENCES)))
    ud = root / "analysis-data" / "ud-english-ewt"
    ud.mkdir(parents=True)
    number = 0
    for split, n in (("train", 24), ("dev", 12), ("test", 12)):
        lines = []
        for _ in range(n):
            lines += ud_sentence(rng, number)
            number += 1
        (ud / f"en_tiny-ud-{split}.conllu").write_text("\n".join(lines) + "\n", encoding="utf-8")
    labelled = root / "labelled.tsv"
    labelled.write_text("".join(f"{s}\tcat\t{'animal' if i % 2 else 'pet'}\n"
                                for i, s in enumerate(s for s in SENTENCES * 2 if "cat" in s.split())))
    return {"corpus": corpus, "glue": glue.parent, "passages": passages, "ud": ud, "analysis": ud.parent,
            "labelled": labelled}


def run(capsys, *argv) -> tuple[int, str, str]:
    """`bertology ARGV` in this process: its exit code, stdout and stderr."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_:  # argparse
        code = exit_.code if isinstance(exit_.code, int) else 2
    out, err = capsys.readouterr()
    return code, out, err


def check(command: str, family: str, outcome: tuple[int, str, str], json_result: bool = True) -> dict | None:
    """The command succeeded (and printed one JSON object on stdout when it reports one), or it refused as
    `EXPECTED_REFUSALS` says: exit 2 and one line on stderr."""
    code, out, err = outcome
    assert "Traceback" not in err and "Traceback" not in out
    expected = EXPECTED_REFUSALS.get((command, family))
    if expected is not None:
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and lines[0].startswith(f"bertology {command.split()[0]}: error: "), \
            (code, err)
        assert re.search(expected, lines[0]), lines[0]
        return None
    assert code == 0, f"{command} on {family}: exit {code}: {err.strip()[-2000:]}"
    if not json_result:
        return None
    result = json.loads(out)  # stdout holds the one JSON object, nothing else
    assert isinstance(result, dict)
    return result


# ------------------------------------------------------------------------------------------------------ model only

@pytest.mark.parametrize("family", FAMILIES)
def test_info(family, models, capsys):
    outcome = run(capsys, "info", models[family])
    check("info", family, outcome, json_result=False)
    if outcome[0] == 0:
        text = outcome[1]
        assert "parameters" in text and re.search(r"total\s+[\d,]+", text)
        total = int(re.search(r"total\s+([\d,]+)", text).group(1).replace(",", ""))
        from bertology.model import load_model

        assert total == sum(p.numel() for p in {id(p): p for p in load_model(models[family]).parameters()}.values())


@pytest.mark.parametrize("family", FAMILIES)
def test_fill_mask(family, models, capsys):
    mask = MASK.get(STYLE.get(family, ""), "<mask>")
    check("fill-mask", family, run(capsys, "fill-mask", "--model", models[family], "--top-k", 2,
                                   "--max-new-tokens", 3, f"the cat {mask} on the mat"), json_result=False)


@pytest.mark.parametrize("family", FAMILIES)
def test_generate(family, models, capsys):
    outcome = run(capsys, "generate", "--model", models[family], "--max-new-tokens", 3, "the cat", "a dog ran")
    check("generate", family, outcome, json_result=False)
    if outcome[0] == 0:
        assert len(outcome[1].splitlines()) == 2  # one line per text


@pytest.mark.parametrize("family", FAMILIES)
def test_demo(family, models, capsys):
    check("demo", family, run(capsys, "demo", "--model", models[family], "--layers", "last"), json_result=False)


@pytest.mark.parametrize("level", ["sentence", "word"])
@pytest.mark.parametrize("family", FAMILIES)
def test_embed(family, level, models, data, tmp_path, capsys):
    output = tmp_path / ("v.npy" if level == "sentence" else "v.npz")
    result = check("embed", family, run(capsys, "embed", "--model", models[family], "--input", data["corpus"],
                                        "--output", output, "--level", level, "--quiet"))
    if result is not None:
        assert output.is_file() and result["output"] == str(output)


@pytest.mark.parametrize("family", FAMILIES)
def test_serve(family, models):
    """The service's app (no port): health, embed of words, and fill-mask or its 501 naming what is missing."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertology.serve import create_app

    with TestClient(create_app(models[family], max_wait_ms=1)) as client:
        health = client.get("/health").json()
        assert health["status"] == "ok"
        embedded = client.post("/v1/embed", json={"texts": ["the cat sat", "a dog"], "level": "word"})
        assert embedded.status_code == 200, embedded.text
        body = embedded.json()
        assert len(body["vectors"]) == 2 and len(body["vectors"][0][0]) == body["dim"] == health["dim"]
        mask = MASK.get(STYLE.get(family, ""), "<mask>")
        filled = client.post("/v1/fill-mask", json={"texts": [f"the cat {mask} on the mat"], "top_k": 2})
        if health["fill_mask"]:
            assert filled.status_code == 200, filled.text
        else:
            assert filled.status_code == 501 and "fill-mask is not available" in filled.json()["detail"]


# --------------------------------------------------------------------------------------------- retrieval, analyses

@pytest.mark.parametrize("family", FAMILIES)
def test_index_build_and_search(family, models, data, tmp_path, capsys):
    index = tmp_path / "index"
    result = check("index build", family, run(capsys, "index", "build", "--model", models[family], "--input",
                                              data["passages"], "--out", index, "--quiet"))
    if result is None:
        return
    code, out, err = run(capsys, "search", "--index", index, "--k", 2, "the cat")
    assert code == 0, err
    hits = json.loads(out.splitlines()[0])["hits"]
    assert len(hits) == 2


@pytest.mark.parametrize("family", FAMILIES)
def test_neighbours(family, models, data, tmp_path, capsys):
    check("neighbours", family, run(capsys, "neighbours", "--model", models[family], "--corpus", data["corpus"],
                                    "--query", "cat", "the cat sat on the mat", "--out", tmp_path / "n", "-k", 2,
                                    "--quiet"))


@pytest.mark.parametrize("family", FAMILIES)
def test_anisotropy(family, models, data, tmp_path, capsys):
    check("anisotropy", family, run(capsys, "anisotropy", "--model", models[family], "--corpus", data["corpus"],
                                    "--out", tmp_path / "a", "--bootstrap", 2, "--min-occurrences", 2, "--quiet"))


@pytest.mark.parametrize("family", FAMILIES)
def test_probe(family, models, data, tmp_path, capsys):
    check("probe", family, run(capsys, "probe", "--model", models[family], "--ud", data["ud"], "--out",
                               tmp_path / "p", "--limit", 24, "--epochs", 1, "--tasks", "upos", "--quiet"))


@pytest.mark.parametrize("family", FAMILIES)
def test_heads(family, models, data, tmp_path, capsys):
    model = models[family]
    check("heads stats", family, run(capsys, "heads", "stats", "--model", model, "--ud", data["ud"], "--out",
                                     tmp_path / "stats", "--split", "dev", "--limit", 12, "--quiet"))
    check("heads importance", family, run(capsys, "heads", "importance", "--model", model, "--text", data["corpus"],
                                          "--examples", 6, "--out", tmp_path / "importance", "--quiet"))
    check("heads prune", family, run(capsys, "heads", "prune", "--model", model, "--heads", "0:1", "--out",
                                     tmp_path / "pruned", "--quiet"))


@pytest.mark.parametrize("family", FAMILIES)
def test_sense_map(family, models, data, tmp_path, capsys):
    check("sense-map", family, run(capsys, "sense-map", "--model", models[family], "--labelled", data["labelled"],
                                   "--out", tmp_path / "s", "--method", "pca", "--min-count", 1))


@pytest.mark.parametrize("family", FAMILIES)
def test_longformer(family, models, data, tmp_path, capsys):
    model = models[family]
    check("longformer convert", family, run(capsys, "longformer", "convert", "--model", model, "--max-length", 128,
                                            "--window", 8, "--out", tmp_path / "long"))
    check("longformer mlm-loss", family, run(capsys, "longformer", "mlm-loss", "--model", model, "--text",
                                             data["corpus"], "--length", 16, "--max-documents", 2, "--seed", 0))


@pytest.mark.parametrize("family", FAMILIES)
def test_analyze_quick(family, models, data, tmp_path, capsys):
    result = check("analyze", family, run(capsys, "analyze", "--model", models[family], "--out", tmp_path / "r",
                                          "--data", data["analysis"], "--quick", "--only", "geometry,probing,attention"))
    if result is not None:
        assert Path(result["report"]).is_file()


# ------------------------------------------------------------------------------------------------------- training

@pytest.mark.parametrize("family", FAMILIES)
def test_finetune_predict_evaluate(family, models, data, tmp_path, capsys):
    """Two steps of SST-2 (a classifier, or text-to-text on T5), then `predict` on dev with the kept model and
    `evaluate` of both predictions files: the scores equal the run's."""
    out = tmp_path / "run"
    result = check("finetune", family, run(capsys, "finetune", "--task", "sst2", "--model", models[family], "--out",
                                           out, "--data", data["glue"], "--max-steps", 2, "--set",
                                           "optim.batch_size=8"))
    if result is None:
        return
    assert result["steps"] == 2 and Path(result["model"]).is_dir()
    gold = data["glue"] / "SST-2" / "dev.tsv"
    code, out_text, err = run(capsys, "evaluate", "--task", "sst2", "--gold", gold, "--predictions",
                              out / "dev_predictions.tsv")
    assert code == 0, err
    assert json.loads(out_text) == result["dev_metrics"]
    predicted = tmp_path / "p.tsv"
    code, out_text, err = run(capsys, "predict", "--model", result["model"], "--task", "sst2", "--input", gold,
                              "--output", predicted)
    assert code == 0, err
    assert predicted.read_text() == (out / "dev_predictions.tsv").read_text()


@pytest.mark.parametrize("family", FAMILIES)
def test_wsd(family, models, data_dir, tmp_path, capsys):
    """wsd fit, predict and score on the shared SemCor subset and WordNet (a few sentences)."""
    semcor, wordnet = data_dir / "semcor3.0-subset", data_dir / "wordnet-3.0"
    framework = data_dir / "wsd-raganato2017" / "semeval2007"
    for needed in (semcor, wordnet, framework):
        if not needed.exists():
            pytest.skip(f"{needed} not found (../shared is absent)")
    senses, key = tmp_path / f"{family}.npz", tmp_path / f"{family}.key"
    if check("wsd fit", family, run(capsys, "wsd", "fit", "--model", models[family], "--semcor", semcor,
                                    "--wordnet", wordnet, "--out", senses, "--max-sentences", 10,
                                    "--quiet")) is not None:
        check("wsd predict", family, run(capsys, "wsd", "predict", "--model", models[family], "--senses", senses,
                                         "--wordnet", wordnet, "--data", framework / "semeval2007.data.xml",
                                         "--output", key, "--quiet"))
        scored = check("wsd score", family, run(capsys, "wsd", "score", "--gold",
                                                framework / "semeval2007.gold.key.txt", "--predictions", key))
        assert scored["total"] > 0


# ------------------------------------------------------------------------------------- commands without a model

@pytest.mark.parametrize("kind,style", [("wordpiece", "bert"), ("bpe", "roberta"), ("unigram", "t5"),
                                        ("unigram", "deberta")])
def test_tokenizer_train_and_data_prepare(kind, style, data, tmp_path, capsys):
    """The tokenizer of each kind, then pretraining shards made with it: each prints its result on stdout."""
    result = check("tokenizer train", kind, run(capsys, "tokenizer", "train", "--kind", kind, "--vocab-size", 400,
                                                "--style", style, "--out", tmp_path / "tok", "--format", "text",
                                                "--min-frequency", 1, "--quiet", data["corpus"]))
    assert result["out"] == str(tmp_path / "tok") and result["style"] == style and 0 < result["vocab_size"] <= 400
    result = check("data prepare", kind, run(capsys, "data", "prepare", "--tokenizer", tmp_path / "tok", "--out",
                                             tmp_path / "shards", "--format", "text", "--quiet", data["corpus"]))
    assert result["documents"] > 0 and result["tokens"] > 0 and result["shards"] >= 1
