"""Binary loaders fed damaged copies of files bertology wrote (truncated, bit-flipped, bytes spliced in, an int32 or
int64 length field inflated, random bytes): each loads, or raises bertology's own error naming the file, within a
bounded amount of memory; never another exception, never an allocation of what a damaged field claims."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings

from fuzz_helpers import bounded_memory, damaged, only_our_errors

EXAMPLES = 100  # inputs per loader (the suite's time budget: about 30 seconds in all)


@pytest.fixture(scope="module")
def work():
    root = Path(tempfile.mkdtemp(prefix="bertology-fuzz-loaders-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def model_dir(work):
    from bertology.model import EncoderModel, Pretrained, preset
    from bertology.tokenization import train_tokenizer

    tokenizer = train_tokenizer(iter(["the cat sat on the mat"] * 4), "wordpiece", 40, show_progress=False,
                                min_frequency=1)
    model = EncoderModel(preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=1, hidden_size=8, num_heads=2,
                                intermediate_size=16, max_position_embeddings=16))
    model.init_weights(torch.Generator().manual_seed(0))
    Pretrained(model, tokenizer).save(work / "model")
    return work / "model"


def fuzz_file(name: str, original: Path, load, header: int = 4096) -> None:
    """Replace `original` by damaged copies of itself, call `load()` on each, then put it back."""
    valid = original.read_bytes()

    @settings(max_examples=EXAMPLES)
    @given(data=damaged(valid, header))
    def run(data):
        original.write_bytes(data)
        only_our_errors(name, load, names=(original.name, str(original.parent)))

    try:
        with bounded_memory():
            run()
    finally:
        original.write_bytes(valid)
    load()  # the restored file loads again


def test_model_safetensors_and_config(model_dir):
    from bertology.model import load

    fuzz_file("model.safetensors", model_dir / "model.safetensors", lambda: load(model_dir), header=256)
    fuzz_file("config.json", model_dir / "config.json", lambda: load(model_dir))
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json"):
        if (model_dir / name).is_file():
            fuzz_file(name, model_dir / name, lambda: load(model_dir))


def test_sense_vectors_npz(work):
    from bertology.analysis.wsd import SenseVectors

    senses = SenseVectors(["dog%1:05:00::", "cat%1:05:00::"], np.ones((2, 4), np.float32), np.array([3, 1]),
                          ["noun.animal"], np.ones((1, 4), np.float32), np.zeros(4, np.float32),
                          np.ones(4, np.float32), {"propagate": "none", "gloss_weight": 0.0, "standardize": False},
                          {"path": "m", "fingerprint": "f"})
    path = senses.save(work / "senses.npz")
    fuzz_file("senses.npz", path, lambda: SenseVectors.load(path))


@pytest.mark.parametrize("suffix", ["npy", "npz"])
def test_embedding_vector_files(work, suffix):
    from bertology.embeddings import load_vectors

    path = work / f"vectors.{suffix}"
    vectors = np.arange(24, dtype=np.float32).reshape(6, 4)
    if suffix == "npy":
        np.save(path, vectors)
    else:
        np.savez(path, vectors=vectors, meta=np.array(json.dumps({"format": 2})))
    fuzz_file(f"vectors.{suffix}", path, lambda: load_vectors(path))


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_index_faiss_file(work, model_dir, kind):
    pytest.importorskip("faiss")
    from bertology.retrieval import Index, Structure

    passages = [{"id": f"p{i}", "text": t} for i, t in enumerate(["the cat", "the mat", "sat on"] * 14)]
    directory = work / f"index-{kind}"
    if not directory.exists():
        index = Index.build(model_dir, passages)
        if kind != "flat":
            index = index.restructured(Structure(kind, nlist=1 if kind == "ivf" else None, hnsw_m=4))
        index.save(directory)
    fuzz_file(f"vectors.faiss ({kind})", directory / "vectors.faiss", lambda: Index.load(directory), header=2048)
    if kind == "flat":
        fuzz_file("index.json", directory / "index.json", lambda: Index.load(directory))
        fuzz_file("passages.jsonl", directory / "passages.jsonl", lambda: Index.load(directory))


def test_trainer_checkpoint_state(work, model_dir):
    from bertology.model import load
    from bertology.training.checkpoint import TrainingState, read_checkpoint, save_checkpoint

    pretrained = load(model_dir)
    optimizer = torch.optim.AdamW(pretrained.model.parameters())
    pretrained.model(torch.tensor([[2, 5, 3]])).last_hidden_state.sum().backward()
    optimizer.step()
    path = save_checkpoint(work / "run", pretrained.model, pretrained.tokenizer, TrainingState(step=1),
                           {"optimizer": optimizer.state_dict(), "rng": [], "world_size": 1})
    fuzz_file("trainer_state.safetensors", path / "trainer_state.safetensors",
              lambda: read_checkpoint(path, pretrained.model), header=512)
    fuzz_file("trainer_state.json", path / "trainer_state.json", lambda: read_checkpoint(path, pretrained.model))


def test_elmo_released_format(work):
    pytest.importorskip("h5py")
    from bertology.model import load
    from bertology.model.elmo import ElmoModel, tiny_config
    from bertology.model.elmo_format import write_elmo

    model = ElmoModel(tiny_config(projection_dim=4, cell_size=8, filters=[[1, 2], [2, 2]], char_embedding_dim=2))
    model.init_weights(torch.Generator().manual_seed(0))
    directory = write_elmo(model, work / "elmo")
    fuzz_file("weights.hdf5", directory / "weights.hdf5", lambda: load(directory), header=2048)
    fuzz_file("options.json", directory / "options.json", lambda: load(directory))
