"""Head masks, real head pruning (against transformers) and head importance (Michel et al. 2019)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertology.analysis.importance import (
    MaskedLMData,
    existing_heads,
    head_importance,
    heads_removed_at,
    parse_heads,
    prunable_share,
    pruning_curve,
)
from bertology.errors import ConfigError, InputError
from bertology.model import EncoderModel, Pretrained, load, preset
from bertology.model.encoder import HeadSpec
from numerics import assert_within_scale

ROOT = Path(__file__).resolve().parents[2]
GLUE = ROOT.parent / "shared" / "data" / "glue"


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(heads=(), **overrides) -> EncoderModel:
    config = preset("tiny", vocab_size=60, num_layers=3, hidden_size=32, num_heads=4, intermediate_size=64,
                    max_position_embeddings=32, **overrides)
    model = EncoderModel(config, heads)
    model.init_weights(torch.Generator().manual_seed(0))
    return model.eval()


def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 60, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    return ids, mask


def real(t, mask):
    return t * mask[..., None]


def test_head_mask_of_ones_is_no_mask_and_paths_agree():
    model = tiny()
    ids, mask = batch()
    ones = torch.ones(3, 4)
    zeroed = ones.clone()
    zeroed[0, 1] = 0
    zeroed[2, [0, 3]] = 0
    for packed in (True, False):
        plain = model(ids, mask, packed=packed, output_attentions=True)
        masked = model(ids, mask, packed=packed, head_mask=ones, output_attentions=True)
        # another kernel path: float32 lies up to ~8.5e-7 from float64 on values up to 2.9, on any element: bound
        # relative to the scale (1e-5: a wrong head mask moves the states by ~0.1)
        assert_within_scale(real(masked.last_hidden_state, mask), real(plain.last_hidden_state, mask), 1e-5)
    a = model(ids, mask, head_mask=zeroed, output_attentions=True)
    b = model(ids, mask, head_mask=zeroed, packed=False, output_attentions=True)
    assert torch.allclose(real(a.last_hidden_state, mask), real(b.last_hidden_state, mask), atol=1e-5)
    assert a.attentions[0][:, 1].abs().max() == 0 and a.attentions[0][:, 0].abs().max() > 0  # masked probs, as HF


def hf_with_zeroed_heads(directory: Path, zeroed: dict[int, list[int]]):
    """transformers' BertModel with the heads' context outputs zeroed (what its old head_mask did: the mask
    multiplied the probabilities, so the head's context is zero)."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModel.from_pretrained(directory, attn_implementation="eager").eval()
    d = hf.config.hidden_size // hf.config.num_attention_heads

    def hook(heads):
        def zero(module, args, output):
            context = output[0].clone()
            for h in heads:
                context[..., h * d:(h + 1) * d] = 0
            return (context, *output[1:])
        return zero

    for layer, heads in zeroed.items():
        hf.encoder.layer[layer].attention.self.register_forward_hook(hook(heads))
    return hf


def test_zeroed_head_mask_matches_transformers(tmp_path):
    model = tiny()
    Pretrained(model, None).save(tmp_path / "m")
    ids, mask = batch()
    zeroed = {0: [1], 2: [0, 3]}
    head_mask = torch.ones(3, 4)
    for layer, heads in zeroed.items():
        head_mask[layer, heads] = 0
    hf = hf_with_zeroed_heads(tmp_path / "m", zeroed)
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    for packed in (True, False):
        ours = model(ids, mask, head_mask=head_mask, packed=packed).last_hidden_state
        assert torch.allclose(real(ours, mask), real(theirs, mask), atol=1e-5)


def test_pruned_model_is_smaller_equals_the_masked_one_and_round_trips(tmp_path):
    model = tiny()
    ids, mask = batch()
    zeroed = {0: [1], 1: [0, 1, 2, 3], 2: [0, 3]}  # layer 1 loses every head: only attn_out's bias is left
    head_mask = torch.ones(3, 4)
    for layer, heads in zeroed.items():
        head_mask[layer, heads] = 0
    expected = model(ids, mask, head_mask=head_mask).last_hidden_state
    before = sum(p.numel() for p in model.parameters())
    model.prune_heads(zeroed)
    assert model.config.pruned_heads == {0: [1], 1: [0, 1, 2, 3], 2: [0, 3]}
    assert [layer.query.weight.shape[0] for layer in model.encoder.layers] == [24, 0, 16]
    assert [layer.attn_out.weight.shape[1] for layer in model.encoder.layers] == [24, 0, 16]
    assert sum(p.numel() for p in model.parameters()) == before - 7 * (3 * (8 * 32 + 8) + 32 * 8)
    for packed in (True, False):
        out = model(ids, mask, packed=packed, output_attentions=True)
        assert_within_scale(real(out.last_hidden_state, mask), real(expected, mask), 1e-5)  # narrower matmuls
        assert [a.shape[1] for a in out.attentions] == [3, 0, 2]
    # A head mask keeps the unpruned numbering: the entries of pruned heads are ignored.
    assert_within_scale(model(ids, mask, head_mask=torch.ones(3, 4)).last_hidden_state,
                        model(ids, mask).last_hidden_state, 1e-5)
    Pretrained(model, None).save(tmp_path / "pruned")
    config = json.loads((tmp_path / "pruned" / "config.json").read_text())
    assert config["pruned_heads"] == {"0": [1], "1": [0, 1, 2, 3], "2": [0, 3]}
    reloaded = load(tmp_path / "pruned").model
    assert torch.equal(reloaded(ids, mask).last_hidden_state, model(ids, mask).last_hidden_state)
    model.prune_heads({0: [1, 2]})  # pruning again adds to what was pruned
    assert model.config.pruned_heads[0] == [1, 2] and model.encoder.layers[0].num_heads == 2


def test_pruned_model_in_native_format_round_trips(tmp_path):
    model = tiny([HeadSpec("sentiment", "pooled", num_labels=3)])
    model.prune_heads({1: [2]})
    ids, mask = batch()
    Pretrained(model, None).save(tmp_path / "native")
    assert (tmp_path / "native" / "bertology.json").is_file()
    reloaded = load(tmp_path / "native").model
    assert reloaded.config.pruned_heads == {1: [2]}
    assert torch.equal(reloaded(ids, mask).logits, model(ids, mask).logits)


def test_transformers_loads_the_pruned_model_with_the_same_outputs(tmp_path):
    """transformers 5 dropped `pruned_heads` and head pruning: the pruned checkpoint is compared with transformers'
    unpruned model whose removed heads are zeroed, and, when a transformers 4 install is named by
    BERTOLOGY_TRANSFORMERS4 (a `pip install --target` folder), loaded by its AutoModel from config.json."""
    model = tiny()
    Pretrained(model, None).save(tmp_path / "full")
    pruned = {0: [1], 2: [0, 3]}
    model.prune_heads(pruned)
    Pretrained(model, None).save(tmp_path / "pruned")
    ids, mask = batch()
    ours = model(ids, mask).last_hidden_state
    hf = hf_with_zeroed_heads(tmp_path / "full", pruned)
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.allclose(real(ours, mask), real(theirs, mask), atol=1e-5)

    old = os.environ.get("BERTOLOGY_TRANSFORMERS4")
    if not old:
        pytest.skip("transformers 4 (which reads pruned_heads) not given: set BERTOLOGY_TRANSFORMERS4 to a folder "
                    "holding it (pip install --target DIR 'transformers<5' 'huggingface_hub<1' 'tokenizers<0.23')")
    torch.save({"ids": ids, "mask": mask, "out": ours.detach()}, tmp_path / "io.pt")
    script = (
        "import sys, torch; sys.path.insert(0, sys.argv[1]); import transformers as t; "
        "assert t.__version__.startswith('4.'), t.__version__; "
        "m = t.AutoModel.from_pretrained(sys.argv[2]).eval(); d = torch.load(sys.argv[3]); "
        "o = m(input_ids=d['ids'], attention_mask=d['mask']).last_hidden_state; "
        "print(float(((o - d['out']) * d['mask'][..., None]).abs().max()), "
        "[tuple(l.attention.self.query.weight.shape) for l in m.encoder.layer])"
    )
    done = subprocess.run([sys.executable, "-c", script, old, str(tmp_path / "pruned"), str(tmp_path / "io.pt")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    difference, shapes = done.stdout.split(" ", 1)
    assert float(difference) < 1e-5
    assert shapes.strip() == "[(24, 32), (32, 32), (16, 32)]"


def test_bad_head_masks_and_pruned_heads_are_named(tmp_path):
    model = tiny()
    ids, mask = batch()
    with pytest.raises(InputError, match=r"head_mask must be \[layer calls, heads\] = \[3, 4\]"):
        model(ids, mask, head_mask=torch.ones(4))
    with pytest.raises(ConfigError, match="layer 5"):
        model.prune_heads({5: [0]})
    with pytest.raises(ConfigError, match=r"heads \[4\] are not all in \[0, 4\)"):
        model.prune_heads({0: [4]})
    Pretrained(model, None).save(tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    config = json.loads(path.read_text())
    config["pruned_heads"] = {"0": [9]}
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=f"{path}: pruned_heads"):
        load(tmp_path / "m")
    with pytest.raises(ConfigError, match="ALBERT"):
        preset("tiny", family="albert", num_layer_groups=1, pruned_heads={0: [0]})
    with pytest.raises(ConfigError, match="'0:x' is not LAYER:HEAD"):
        parse_heads("0:x")
    assert parse_heads("0:1,3; 5:0") == {0: [1, 3], 5: [0]}


def test_importance_is_the_mean_absolute_gradient_per_example():
    """Against central finite differences of each example's loss in one head's mask variable."""
    model = tiny([HeadSpec("mlm", "masked_lm")])
    texts_ids = [[2, 10, 11, 12, 3], [2, 20, 21, 3], [2, 30, 31, 32, 33, 3]]

    class Data:
        metric_name = "none"

        def importance_batches(self):
            for row in texts_ids:
                ids = torch.tensor([row])
                yield ids

        def loss(self, model, ids, head_mask):
            out = model(ids, head_mask=head_mask, masked_positions=torch.tensor([[0, 1]]))
            return torch.nn.functional.cross_entropy(out.logits, ids[:, 1])

    data = Data()
    importance = head_importance(model, data, normalize=False)
    eps = 1e-3
    model.double()
    for layer, head in ((0, 1), (2, 3)):
        total = 0.0
        for ids in data.importance_batches():
            up, down = torch.ones(3, 4, dtype=torch.float64), torch.ones(3, 4, dtype=torch.float64)
            up[layer, head] += eps
            down[layer, head] -= eps
            with torch.no_grad():
                total += abs(float(data.loss(model, ids, up) - data.loss(model, ids, down)) / (2 * eps))
        assert importance[layer, head] == pytest.approx(total / 3, rel=1e-3)
    normalised = head_importance(model.float(), data)
    assert torch.allclose(normalised.norm(dim=1), torch.ones(3), atol=1e-5)


def test_masked_lm_pruning_curve_and_the_removed_heads():
    model = tiny([HeadSpec("mlm", "masked_lm")])
    from bertology.tokenization import train_tokenizer

    words = "the cat sat on a mat while dogs ran over green hills and birds sang songs".split()
    texts = [" ".join(words[i % 7: i % 7 + 6]) for i in range(40)]
    tokenizer = train_tokenizer(iter(texts), "wordpiece", 60, show_progress=False, min_frequency=1)
    data = MaskedLMData(Pretrained(model, tokenizer), texts, importance_examples=12)
    assert data.counts["importance_examples"] == 12 and data.counts["eval_examples"] == 28
    steps = pruning_curve(model, data, step=0.25, max_share=0.5)
    assert [s.share for s in steps] == [0.0, 0.25, 0.5]
    assert [len(s.removed) for s in steps] == [0, 3, 3]
    removed = heads_removed_at(steps, 0.5)
    assert sum(len(h) for h in removed.values()) == 6
    mask = existing_heads(model).float()
    for layer, heads in removed.items():
        mask[layer, heads] = 0
    # The curve's last metric is the one of the model with those heads removed for good.
    assert data.metric(model, mask) == pytest.approx(steps[-1].metric)
    model.prune_heads(removed)
    assert data.metric(model, existing_heads(model).float()) == pytest.approx(steps[-1].metric, abs=1e-9)
    assert 0.0 <= prunable_share(steps) <= 0.5


@pytest.mark.skipif(not (GLUE / "SST-2" / "train.tsv").is_file(), reason="GLUE SST-2 not in ../shared/data/glue")
def test_sst2_importance_and_prune_commands_on_a_finetuned_tiny_model(tmp_path, capsys):
    from bertology.cli.main import main
    from tests.finetune_helpers import save_tiny_model

    lines = (GLUE / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:400]
    base = save_tiny_model(tmp_path / "base", [line.split("\t")[0] for line in lines], vocab_size=300)
    assert main(["finetune", "--task", "sst2", "--model", str(base), "--out", str(tmp_path / "ft"), "--data",
                 str(GLUE), "--max-steps", "20", "--limit-train", "320", "--set", "speed.threads=1", "--set",
                 "run.progress=false"]) == 0
    model_dir = tmp_path / "ft" / "model"
    common = ["--model", str(model_dir), "--task", "sst2", "--data", str(GLUE), "--examples", "8",
              "--eval-examples", "64", "--threads", "1", "--quiet"]
    assert main(["heads", "importance", *common, "--out", str(tmp_path / "imp"), "--step", "0.25",
                 "--max-share", "0.5"]) == 0
    numbers = json.loads((tmp_path / "imp" / "importance.json").read_text())
    assert [c["share_removed"] for c in numbers["curve"]] == [0.0, 0.25, 0.5]
    assert (tmp_path / "imp" / "importance.png").read_bytes().startswith(b"\x89PNG")
    assert main(["heads", "prune", *common, "--out", str(tmp_path / "pruned"), "--share", "0.5", "--step", "0.25"]) == 0
    record = json.loads((tmp_path / "pruned" / "pruning.json").read_text())
    assert record["heads_before"] == 4 and record["heads_after"] == 2
    assert record["parameters_after"] < record["parameters_before"]
    assert record["curve"][-1]["metric"] == pytest.approx(numbers["curve"][-1]["metric"])  # same data, same order
    assert record["metric_of_pruned_model"] == pytest.approx(record["curve"][-1]["metric"])  # pruned == masked
    pruned = load(tmp_path / "pruned")
    assert sum(len(h) for h in pruned.config.pruned_heads.values()) == 2
    capsys.readouterr()
    assert main(["heads", "prune", "--model", str(model_dir), "--out", str(tmp_path / "bad"), "--share", "0.5"]) == 2
    assert "--task NAME --data DIR" in capsys.readouterr().err


def test_too_few_texts_a_regression_task_and_a_missing_classifier_are_named(tmp_path):
    from bertology.analysis.importance import TaskData
    from bertology.errors import DataError
    from bertology.tokenization import train_tokenizer

    tokenizer = train_tokenizer(iter(["the cat sat"] * 5), "wordpiece", 60, show_progress=False, min_frequency=1)
    with pytest.raises(DataError, match="3 non-empty texts: need more than the 8 used for importances"):
        MaskedLMData(Pretrained(tiny([HeadSpec("mlm", "masked_lm")]), tokenizer), ["a", "b", "", "c"],
                     importance_examples=8)
    with pytest.raises(ConfigError, match="no masked-LM head"):
        MaskedLMData(Pretrained(tiny(), tokenizer), ["a"] * 20, importance_examples=8)
    with pytest.raises(ConfigError, match="'stsb' is a regression task"):
        TaskData(Pretrained(tiny(), tokenizer), "stsb", tmp_path)
    with pytest.raises(ConfigError, match=r"heads \(none\) are not a classifier for task 'sst2' with 2 labels"):
        TaskData(Pretrained(tiny(), tokenizer), "sst2", tmp_path)
