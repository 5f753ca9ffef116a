"""XLNet pretraining with memory: segment streams (each row continues its documents batch after batch, `reset`
where a row starts one), the permutation-LM objective carrying the memory from batch to batch (hidden where a row
starts a document) as the model computes it by hand, the memory saved with checkpoints so that a stopped and
resumed run ends with the same weights bit for bit, and the settings' range checks naming their keys."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bertology.data.instances import InMemoryDocuments
from bertology.data.segment_streams import SegmentStreams
from bertology.errors import ConfigError
from bertology.model.xlnet import XLNetConfig, XLNetModel
from bertology.objectives.base import Passes
from bertology.objectives.plm import PermutationBatches, PermutationConfig, PermutationLM
from bertology.tokenization.framing import Framing
from test_plm import Stop, stop_at, xlnet_run

from pretrain_helpers import build, make_assets, tiny_config, write_corpus  # on the path test_plm puts it

CLS, SEP, PAD, MASK = 3, 4, 5, 6
XLNET = Framing(cls_id=CLS, sep_id=SEP, pad_id=PAD, mask_id=MASK, style="xlnet")
VOCAB = 40


pytestmark = pytest.mark.usefixtures("one_thread")


def documents(count: int = 9, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [[list(rng.integers(7, VOCAB, int(rng.integers(2, 9)))) for _ in range(int(rng.integers(1, 5)))]
            for _ in range(count)]


def streams(docs, length: int = 8, seed: int = 0, shuffle: bool = True) -> SegmentStreams:
    maker = PermutationBatches(PermutationConfig(k=3), (SEP, CLS), seed, length)
    return SegmentStreams(InMemoryDocuments(docs), XLNET, length, maker, seed, shuffle)


def test_each_row_continues_its_documents_batch_after_batch() -> None:
    docs = documents()
    data = streams(docs)
    flat = [np.concatenate([np.asarray(s) for s in d]).tolist() for d in docs]
    batches = list(data.batches(0, 3))
    assert len(batches) == data.num_batches(0, 3) == sum(-(-len(t) // 6) for t in flat) // 3
    read: list[list[list[int]]] = [[] for _ in range(3)]  # per row, the texts read since each reset
    for b, batch in enumerate(batches):
        assert batch.reset.dtype == torch.bool and (b > 0 or batch.reset.all())
        for row in range(3):
            real = batch.input_ids[row][batch.attention_mask[row].bool()].tolist()
            assert real[-2:] == [SEP, CLS] and len(real) <= 8  # segment <sep> <cls>, right padding
            if batch.reset[row]:
                read[row].append([])
            read[row][-1].extend(real[:-2])
    texts = [text for row in read for text in row]
    # Every text a row read from a reset on is a whole document; only a row's first can lack the document's start
    # (its run began inside it) and only its last the document's end (its run ended inside it).
    for row in read:
        for number, text in enumerate(row):
            assert any(t[i:i + len(text)] == text for t in flat for i in range(len(t))), text
            assert number in (0, len(row) - 1) or text in flat, text
            if len(row) > 1 and number == 0:  # a document's end
                assert any(t[len(t) - len(text):] == text for t in flat), text
            if len(row) > 1 and number == len(row) - 1:  # a document's start
                assert any(t[:len(text)] == text for t in flat), text
    assert len(texts) >= len(docs)
    # Deterministic, resumable, split across ranks, reshuffled every epoch.
    again = list(streams(docs).batches(0, 3, start_batch=2))
    assert all(torch.equal(a.input_ids, b.input_ids) and torch.equal(a.perm_mask, b.perm_mask)
               for a, b in zip(again, batches[2:]))
    halves = [list(data.batches(0, 2, rank=rank, world_size=2)) for rank in (0, 1)]
    assert len(halves[0]) == len(halves[1]) == data.num_batches(0, 4)
    assert not torch.equal(next(data.batches(1, 3)).input_ids, batches[0].input_ids)
    with pytest.raises(ConfigError, match="segment-stream"):
        from bertology.data.instances import InstanceConfig, create_instances
        create_instances(InMemoryDocuments(docs), InstanceConfig(kind="segment-stream"), XLNET)


def test_the_memory_carries_over_and_is_hidden_where_a_document_starts() -> None:
    torch.manual_seed(0)
    model = XLNetModel(XLNetConfig(vocab_size=VOCAB, hidden_size=16, num_layers=2, num_heads=2,
                                   intermediate_size=24, mem_len=10, reuse_len=6, pad_token_id=PAD),
                       PermutationLM().heads())
    model.init_weights(torch.Generator().manual_seed(0))
    model.eval()
    objective = PermutationLM().eval()
    first, second = list(streams(documents(), seed=1).batches(0, 3))[:2]
    second.reset = torch.tensor([False, True, False])  # row 1 starts a document here
    with torch.no_grad():
        objective(Passes(model, first, None), first)
        memory, mask = objective.eval_memory
        got = objective(Passes(model, second, None), second)
        previous = model(first.input_ids, first.attention_mask, token_type_ids=first.token_type_ids,
                         perm_mask=first.perm_mask, target_mapping=first.target_mapping, use_mems=True)
        hidden = torch.cat([first.attention_mask[:, :6], second.attention_mask], 1)
        hidden[1, :6] = 0
        expected = model(second.input_ids, hidden, token_type_ids=second.token_type_ids,
                         perm_mask=second.perm_mask, target_mapping=second.target_mapping,
                         mems=previous.mems, use_mems=True)
    assert memory.shape == (2, 6, 3, 16) and torch.equal(mask, first.attention_mask[:, :6])
    assert all(torch.equal(memory[i], previous.mems[i]) for i in range(2))
    used = second.labels != -100
    loss = torch.nn.functional.cross_entropy(expected.logits[used], second.labels[used], reduction="sum")
    torch.testing.assert_close(got.loss_sum, loss, atol=1e-5, rtol=1e-5)
    assert objective.eval_memory[0].shape[1] == 10  # mem_len kept of 6 + 6
    assert objective.memory.numel() == 0  # training keeps a memory of its own


@pytest.fixture(scope="module")
def xlnet_assets(tmp_path_factory):
    """A corpus, an XLNet-style Unigram tokenizer and its shards."""
    from bertology.data.shards import prepare_corpus
    from bertology.tokenization import load_tokenizer, train_tokenizer

    root = tmp_path_factory.mktemp("xlnet-assets")
    corpus = write_corpus(root / "corpus.txt")
    train_tokenizer([str(corpus)], "unigram", 120, style="xlnet", show_progress=False).save(root / "tokenizer")
    tokenizer = load_tokenizer(root / "tokenizer")
    prepare_corpus(str(corpus), tokenizer, root / "shards", heldout_documents=3, show_progress=False)
    return {"corpus": corpus, "tokenizer": root / "tokenizer", "shards": root / "shards"}


def stream_run(assets, output_dir, **sections):
    raw = xlnet_run(assets, output_dir, **sections)
    raw["data"]["instances"] = {"kind": "segment-stream", "max_seq_length": 16}
    raw["model"]["mem_len"] = 20
    return raw


def test_a_stopped_run_resumes_bit_for_bit_with_its_memory(tmp_path, xlnet_assets) -> None:
    from bertology.recipes.pretrain import pretrain

    settings = dict(optim={"total_steps": 6}, run={"checkpoint_every": 2, "eval_every": 3})
    reference = pretrain(build(stream_run(xlnet_assets, tmp_path / "reference", **settings)))
    assert reference.steps == 6 and reference.metrics["lm_loss"] > 0
    with pytest.raises(Stop):
        pretrain(build(stream_run(xlnet_assets, tmp_path / "stopped", **settings)), hooks=[stop_at(5)])
    saved = load_file(max((tmp_path / "stopped" / "checkpoints").glob("step-*")) / "trainer_state.safetensors")
    memory = [k for k in saved if k.endswith("lm.memory")]
    assert memory and saved[memory[0]].shape[:2] == (2, 20)  # layers, mem_len
    pretrain(build(stream_run(xlnet_assets, tmp_path / "stopped", **settings)), resume=True)
    ours, theirs = (load_file(tmp_path / run / "model" / "model.safetensors") for run in ("stopped", "reference"))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    # The memory settings are the saved model's (reuse_len: a segment's text, 16 - <sep> <cls>).
    config = json.loads((tmp_path / "reference" / "model" / "config.json").read_text())
    assert (config["mem_len"], config["reuse_len"]) == (20, 14)


@pytest.mark.parametrize(("change", "message"), [
    ({"model": {"mem_len": 0}}, "model.mem_len: segment streams carry the memory from batch to batch; it needs a "
                                "length >= 1"),
    ({"model": {"mem_len": -3}}, r"model.mem_len: expected a length >= 0 or null, got -3"),
    ({"model": {"reuse_len": 17}}, r"model.reuse_len: 17 is longer than a segment \(data.instances.max_seq_length "
                                   r"16\)"),
    ({"objectives": {"mlm": {}}}, "data.instances.kind: segment-stream carries XLNet's memory"),
])
def test_memory_settings_out_of_range_are_refused(tmp_path, xlnet_assets, change, message) -> None:
    from bertology.recipes.pretrain import pretrain

    raw = stream_run(xlnet_assets, tmp_path / "run")
    for section, values in change.items():
        if section == "objectives":
            raw["objectives"] = values
        else:
            raw[section].update(values)
    with pytest.raises(ConfigError, match=message):
        pretrain(build(raw))


def test_xlnet_settings_on_other_models_are_refused(tmp_path) -> None:
    from bertology.recipes.pretrain import pretrain
    from bertology.training.config import load_config

    with pytest.raises(ConfigError, match=r"model.mem_len: unknown key for the decoder architecture \(a field of xlnet "
                                          "models: set model.architecture"):
        load_config(None, ["model.architecture=decoder", "model.family=gpt2", "model.mem_len=64",
                           "data.instances.kind=packed-documents"])
    (tmp_path / "assets").mkdir()
    raw = tiny_config(make_assets(tmp_path / "assets"), tmp_path / "run")
    raw["model"]["reuse_len"] = 8
    with pytest.raises(ConfigError, match=r"model.reuse_len: unknown key for the encoder architecture \(a field of "
                                          "xlnet models"):
        pretrain(build(raw))


def test_shipped_memory_config_runs_on_brown(tmp_path) -> None:
    from test_plm import BROWN, ROOT

    from bertology.model import load_model
    from pretrain_helpers import run_shipped_config_briefly

    if not BROWN.is_dir():
        pytest.skip(f"the Brown corpus is not at {BROWN} (see ../shared/data/README.md)")
    corpus = [BROWN / f"ca0{i}" for i in range(1, 5)]
    config = ROOT / "configs" / "xlnet-tiny-memory.yaml"
    assert run_shipped_config_briefly(config, tmp_path / "run", corpus, heldout=1) == 0
    model = load_model(tmp_path / "run" / "model")
    assert isinstance(model, XLNetModel) and (model.config.mem_len, model.config.reuse_len) == (256, 126)
