"""The prefix LM: attention bidirectional over a prefix and causal after it (checked against its definition, padded
and packed, with documents), batches split at a keyed random point with targets on the continuation only, no
gradient from the prefix's positions, and a pretraining run that resumes bitwise."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bertology.data.causal import PrefixLMBatches
from bertology.data.dataset import InstanceBatch, PretrainingDataset
from bertology.data.instances import InMemoryDocuments, InstanceConfig
from bertology.errors import ConfigError, InputError
from bertology.model import HeadSpec
from bertology.model.attention import CAUSAL, attention, packed_attention
from bertology.model.context import AttentionContext
from bertology.model.packing import Layout
from bertology.model.transformer import DecoderModel, Seq2SeqModel
from bertology.objectives.base import Passes
from bertology.objectives.prefixlm import PrefixLM
from bertology.tokenization.framing import Framing
from transformer_helpers import tiny_config

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "training"))
from pretrain_helpers import build, make_assets, run_shipped_config_briefly, tiny_config as run_config  # noqa: E402

BROWN = ROOT.parent / "shared" / "data" / "brown-nltk"
FRAMING = Framing(cls_id=1, sep_id=2, pad_id=0, mask_id=None, style="roberta")


pytestmark = pytest.mark.usefixtures("one_thread")


def reference(q, k, v, allowed):
    """Computed in float64, returned in float32: the bound of 1e-6 then covers the rounding of the path under test
    alone (~3e-7 on outputs up to 2.7, measured), not the sum of two float32 paths'."""
    q, k, v = q.double(), k.double(), v.double()
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    return (scores.masked_fill(~allowed[:, None], float("-inf")).softmax(-1) @ v).nan_to_num().float()  # padding: 0


def definition(real, documents, prefix):
    """[B, L, L]: query i sees key j when both are real, of one document, and j <= i or both are in the prefix."""
    length = real.shape[1]
    i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
    return (real[:, :, None] & real[:, None, :] & (documents[:, :, None] == documents[:, None, :])
            & ((j <= i)[None] | (prefix[:, :, None] & prefix[:, None, :])))


def test_the_mask_is_its_definition_padded_and_packed():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 8, 4, generator=g) for _ in range(3))
    real = torch.tensor([[1] * 8, [1] * 5 + [0] * 3, [1] * 7 + [0]]).bool()
    documents = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [0] * 8, [0, 0, 1, 1, 1, 2, 2, 2]])
    split = torch.tensor([5, 2, 4])
    prefix = (torch.arange(8)[None, :] < split[:, None]) & real
    allowed = definition(real, documents, prefix)
    expected = reference(q, k, v, allowed)
    rows = real[:, None, :, None]  # padding rows see nothing: not compared
    out, _ = attention(q, k, v, AttentionContext(policy=CAUSAL, key_mask=real, documents=documents, lm_prefix=prefix))
    torch.testing.assert_close(out * rows, expected * rows, atol=1e-6, rtol=0)
    # The packed stream (each document a sequence) runs the group loop with the boolean mask.
    layout = Layout(real.long(), documents)
    packed = [layout.pack(t.transpose(1, 2)) for t in (q, k, v)]
    out, _ = packed_attention(*packed, AttentionContext(layout=layout, policy=CAUSAL, lm_prefix=layout.pack(prefix)))
    torch.testing.assert_close(layout.unpack(out).transpose(1, 2) * rows, expected * rows, atol=1e-6, rtol=0)
    # Without a prefix it is causal attention; with every token in it, bidirectional within documents.
    causal, _ = attention(q, k, v, AttentionContext(policy=CAUSAL, key_mask=real, documents=documents,
                                                    lm_prefix=torch.zeros_like(real)))
    torch.testing.assert_close(causal * rows, reference(q, k, v, definition(real, documents, real & False)) * rows,
                               atol=1e-6, rtol=0)
    whole, _ = attention(q, k, v, AttentionContext(policy=CAUSAL, key_mask=real, documents=documents, lm_prefix=real))
    same = real[:, :, None] & real[:, None, :] & (documents[:, :, None] == documents[:, None, :])
    torch.testing.assert_close(whole * rows, reference(q, k, v, same) * rows, atol=1e-6, rtol=0)


def decoder(seed=0, **overrides):
    model = DecoderModel(tiny_config(vocab_size=64, num_layers=2, **overrides), [HeadSpec("lm", "tied_lm")])
    model.init_weights(torch.Generator().manual_seed(seed))
    return model.eval()


def test_a_decoder_sees_the_prefix_both_ways_and_never_the_continuation_from_it():
    model = decoder()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 64, (2, 9), generator=g)
    mask = torch.tensor([[1] * 9, [1] * 6 + [0] * 3])
    prefix = (torch.arange(9)[None, :] < torch.tensor([[4], [3]])) & mask.bool()
    with torch.no_grad():
        packed = model(ids, mask, lm_prefix=prefix).last_hidden_state
        padded = model(ids, mask, lm_prefix=prefix, packed=False).last_hidden_state
        torch.testing.assert_close(packed * mask[..., None], padded * mask[..., None], atol=1e-5, rtol=0)
        changed = ids.clone()
        changed[0, 6] = (ids[0, 6] + 1 - 3) % 61 + 3  # a continuation token
        after = model(changed, mask, lm_prefix=prefix).last_hidden_state
        assert torch.equal(after[0, :6], packed[0, :6]) and not torch.allclose(after[0, 6:], packed[0, 6:])
        changed = ids.clone()
        changed[0, 3] = (ids[0, 3] + 1 - 3) % 61 + 3  # the last prefix token: the whole prefix sees it
        after = model(changed, mask, lm_prefix=prefix).last_hidden_state
        assert all(not torch.allclose(after[0, t], packed[0, t]) for t in range(9))
        causal = model(changed, mask).last_hidden_state  # causal LM: the tokens before it do not
        assert torch.equal(causal[0, :3], model(ids, mask).last_hidden_state[0, :3])
    with pytest.raises(InputError, match=r"lm_prefix has shape \(2, 8\); it marks the positions of the attention "
                                         r"mask, \(2, 9\)"):
        model(ids, mask, lm_prefix=prefix[:, :8])


def documents(count: int = 9, seed: int = 0) -> InMemoryDocuments:
    rng = np.random.default_rng(seed)
    return InMemoryDocuments([[rng.integers(10, 60, int(rng.integers(1, 9))) for _ in range(int(rng.integers(1, 4)))]
                              for _ in range(count)])


def packed_batches(epoch: int, seed: int = 5):
    config = InstanceConfig(kind="packed-documents", max_seq_length=16, seed=3)
    dataset = PretrainingDataset(documents(), FRAMING, config, PrefixLMBatches(seed))
    return list(dataset.batches(epoch, 3, drop_last=False))


def test_batches_split_each_row_and_target_the_continuation_only():
    batches = packed_batches(0)
    assert len(batches) >= 2
    for batch in batches:
        lengths = batch.attention_mask.sum(1)
        assert ((batch.split >= 1) & (batch.split <= lengths - 1)).all()
        columns = torch.arange(batch.input_ids.shape[1])[None, :]
        assert torch.equal(batch.lm_prefix, (columns < batch.split[:, None]) & batch.attention_mask.bool())
        rows, cols = batch.masked_positions.unbind(1)
        assert (cols + 1 >= batch.split[rows]).all()  # every target is a continuation token ...
        assert torch.equal(batch.lm_labels, batch.input_ids[rows, cols + 1])
        assert torch.equal(batch.documents[rows, cols], batch.documents[rows, cols + 1])  # ... of the same document
        # ... and every continuation token whose predecessor is of its document is one.
        follows = (batch.documents[:, 1:] == batch.documents[:, :-1]) & batch.attention_mask[:, 1:].bool()
        after = columns[:, 1:] >= batch.split[:, None]
        assert len(rows) == int((follows & after).sum())
    # Keyed: the same instances and epoch give the same splits; another epoch or seed others.
    again = packed_batches(0)
    assert all(torch.equal(a.split, b.split) and torch.equal(a.lm_labels, b.lm_labels) for a, b in zip(batches, again))
    assert any(not torch.equal(a.split, b.split) for a, b in zip(batches, packed_batches(1)))
    assert any(not torch.equal(a.split, b.split) for a, b in zip(batches, packed_batches(0, seed=6)))


def test_the_split_is_uniform_over_the_row():
    n, rows = 11, 4000
    instances = InstanceBatch(torch.ones(rows, n, dtype=torch.long), torch.ones(rows, n, dtype=torch.long),
                              torch.zeros(rows, n, dtype=torch.long), torch.zeros(rows, n, dtype=torch.bool), None,
                              torch.arange(rows), epoch=0)
    split = PrefixLMBatches(0)(instances).split
    counts = torch.bincount(split, minlength=n + 1)
    assert counts[0] == 0 and counts[n] == 0
    expected = rows / (n - 1)
    chi2 = float((((counts[1:n] - expected) ** 2) / expected).sum())
    assert chi2 < 27.9  # chi-square, 9 degrees of freedom: p = 0.001


def test_no_gradient_reaches_the_prefix_positions_outputs():
    objective = PrefixLM()
    model = DecoderModel(tiny_config(vocab_size=64, num_layers=2), objective.heads())
    model.init_weights(torch.Generator().manual_seed(0))
    batch = packed_batches(0)[0]
    outputs = []

    def keep(module, args, out):
        out[0].retain_grad()
        outputs.append(out[0])

    model.decoder.register_forward_hook(keep)
    result = objective(Passes(model, batch, objective.reads(batch)), batch)
    result.loss_sum.backward()
    grad = outputs[0].grad.abs().sum(-1)  # [B, L]: the last layer's output feeds only the head at its position
    columns = torch.arange(batch.input_ids.shape[1])[None, :]
    predicts = torch.zeros_like(grad, dtype=torch.bool)
    predicts[batch.masked_positions[:, 0], batch.masked_positions[:, 1]] = True
    assert (grad[~predicts] == 0).all() and (grad[predicts] > 0).all()
    assert not predicts[columns < batch.split[:, None] - 1].any()  # nothing before the last prefix token predicts
    assert float(result.stats["lm_units"]) == len(batch.lm_labels)


def test_prefixlm_pretrains_and_resumes_bitwise(tmp_path):
    from bertology.recipes.pretrain import pretrain

    (tmp_path / "assets").mkdir()
    assets = make_assets(tmp_path / "assets", kind="bpe", style="gpt2")

    def raw(output_dir):
        config = run_config(assets, output_dir, model={"architecture": "decoder", "family": "gpt2"},
                            data={"instances": {"kind": "packed-documents"}},
                            optim={"total_steps": 6, "grad_accumulation": 2},
                            run={"checkpoint_every": 2, "eval_every": 3})
        config["objectives"] = {"prefixlm": {}}
        return build(config)

    pretrain(raw(tmp_path / "reference"))

    class Crash(Exception):
        pass

    def crash(trainer, report):
        if report.step == 5:
            raise Crash()

    with pytest.raises(Crash):
        pretrain(raw(tmp_path / "stopped"), hooks=[crash])
    pretrain(raw(tmp_path / "stopped"), resume=True)
    ours = load_file(tmp_path / "stopped" / "model" / "model.safetensors")
    theirs = load_file(tmp_path / "reference" / "model" / "model.safetensors")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[key], theirs[key]) for key in ours)
    rows = (tmp_path / "reference" / "metrics.jsonl").read_text()
    assert '"lm_loss"' in rows and '"perplexity"' in rows
    config = raw(tmp_path / "x").to_dict()
    config["objectives"] = {"prefixlm": {}, "clm": {}}
    with pytest.raises(ConfigError, match="objectives.prefixlm: makes its own batches .*not both"):
        build(config)
    config["objectives"] = {"clm": {}}
    config["model"]["prefix_lm"] = True
    with pytest.raises(ConfigError, match="model.prefix_lm: a prefix LM reads an input in both directions"):
        build(config)
    config["objectives"] = {"prefixlm": {}}
    config["data"]["instances"]["kind"] = "nsp"
    with pytest.raises(ConfigError, match="objectives.prefixlm: next-token prediction reads running text"):
        build(config)


def test_the_shipped_config_runs(tmp_path):
    if not BROWN.is_dir():
        pytest.skip(f"the Brown corpus is not at {BROWN} (see ../shared/data/README.md)")
    corpus = [BROWN / f"ca0{i}" for i in range(1, 5)]
    assert run_shipped_config_briefly(ROOT / "configs" / "prefixlm-tiny.yaml", tmp_path / "run", corpus) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["kind"] == "eval" and rows[-1]["lm_loss"] > 0
    # transformers' GPT-2 has no prefix LM: the model is kept in bertology's format
    saved = json.loads((tmp_path / "run" / "model" / "bertology.json").read_text())
    assert saved["model"] == "decoder" and saved["config"]["prefix_lm"] is True


def test_generation_reads_the_prompt_as_the_prefix():
    from bertology import generate

    model = decoder(seed=2)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 64, (2, 6), generator=g)
    mask = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]])  # a decoder's prompts padded on the left
    ids[1, :2] = 0
    out = generate(model, ids, mask, max_new_tokens=5, prefix_lm=True, eos_token_id=[])
    # By definition: each step the whole sequence again, the prompt as the prefix, the new tokens causal after it.
    expected, full_mask = ids, mask
    with torch.no_grad():
        for _ in range(5):
            prefix = torch.cat([mask, torch.zeros(2, expected.shape[1] - 6, dtype=torch.long)], 1).bool()
            logits = model(expected, full_mask, lm_prefix=prefix, packed=False).logits[:, -1]
            expected = torch.cat([expected, logits.argmax(-1, keepdim=True)], 1)
            full_mask = torch.cat([full_mask, torch.ones(2, 1, dtype=torch.long)], 1)
        causal = model(ids, mask, packed=False).logits[:, -1]
        bidirectional = model(ids, mask, lm_prefix=mask.bool(), packed=False).logits[:, -1]
    assert torch.equal(out, expected)
    assert not torch.allclose(causal, bidirectional, atol=1e-4)  # the prompt's last token sees the whole prompt
    seq2seq = Seq2SeqModel(tiny_config(vocab_size=64), [HeadSpec("lm", "tied_lm")])
    with pytest.raises(ConfigError, match="prefix_lm: a decoder's option .* the model \\(Seq2SeqModel"):
        generate(seq2seq, ids, mask, prefix_lm=True)


def test_a_prefix_lm_reads_a_whole_input_both_ways_and_keeps_it_in_its_native_checkpoint(tmp_path):
    from bertology import generate
    from bertology.model import load_model, save_model

    plain, prefix_lm = decoder(seed=4), decoder(seed=4, prefix_lm=True)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 64, (2, 7), generator=g)
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    with torch.no_grad():
        whole = plain(ids, mask, lm_prefix=mask.bool()).logits
        torch.testing.assert_close(prefix_lm(ids, mask).logits, whole)  # fine-tuning reads the input as the prefix
        split = mask.bool() & (torch.arange(7) < 3)
        torch.testing.assert_close(prefix_lm(ids, mask, lm_prefix=split).logits,  # training's own split wins
                                   plain(ids, mask, lm_prefix=split).logits)
    left = torch.tensor([[1] * 7, [0, 0] + [1] * 5])  # a decoder's prompts padded on the left
    assert torch.equal(generate(prefix_lm, ids, left, max_new_tokens=4, eos_token_id=[]),
                       generate(plain, ids, left, max_new_tokens=4, eos_token_id=[], prefix_lm=True))
    save_model(prefix_lm, tmp_path / "model")
    assert (tmp_path / "model" / "bertology.json").is_file()  # transformers' GPT-2 has no prefix LM
    back = load_model(tmp_path / "model").eval()
    assert back.config.prefix_lm is True
    with torch.no_grad():
        torch.testing.assert_close(back(ids, mask).logits, whole)
