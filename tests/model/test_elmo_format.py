"""ELMo's released format (options.json + HDF5, bilm-tf's names and TensorFlow's layouts): a file written here by plain
h5py + numpy, read by bertology and run against a reference computed from the same arrays; our writer read back;
bad files refused naming the key."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

h5py = pytest.importorskip("h5py")

from bertology.errors import CheckpointError  # noqa: E402
from bertology.model.elmo import ElmoModel, batch_to_ids, tiny_config  # noqa: E402
from bertology.model.elmo_format import read_elmo, write_elmo  # noqa: E402
from bertology.model.heads import HeadSpec  # noqa: E402

OPTIONS = {
    "lstm": {"use_skip_connections": True, "projection_dim": 8, "cell_clip": 3, "proj_clip": 1, "dim": 16,
             "n_layers": 2},
    "char_cnn": {"activation": "relu", "filters": [[1, 4], [2, 4], [3, 8]], "n_highway": 2, "embedding": {"dim": 4},
                 "n_characters": 262, "max_characters_per_token": 50},
}


def released_arrays(options: dict, scale: float = 0.5) -> dict[str, np.ndarray]:
    """Random weights under bilm-tf's dataset names, in TensorFlow's shapes."""
    rng = np.random.default_rng(0)
    cnn, lstm = options["char_cnn"], options["lstm"]
    dim, p, cell = cnn["embedding"]["dim"], lstm["projection_dim"], lstm["dim"]
    n = sum(count for _, count in cnn["filters"])
    arrays = {"char_embed": rng.normal(0, 1.0, (261, dim))}
    for i, (width, count) in enumerate(cnn["filters"]):
        arrays[f"CNN/W_cnn_{i}"] = rng.normal(0, scale, (1, width, dim, count))
        arrays[f"CNN/b_cnn_{i}"] = rng.normal(0, scale, (count,))
    for k in range(cnn["n_highway"]):
        for part in ("transform", "carry"):
            arrays[f"CNN_high_{k}/W_{part}"] = rng.normal(0, scale, (n, n))
            arrays[f"CNN_high_{k}/b_{part}"] = rng.normal(0, scale, (n,))
    arrays["CNN_proj/W_proj"] = rng.normal(0, scale, (n, p))
    arrays["CNN_proj/b_proj"] = rng.normal(0, scale, (p,))
    for d in range(2):
        for layer in range(lstm["n_layers"]):
            prefix = f"RNN_{d}/RNN/MultiRNNCell/Cell{layer}/LSTMCell/"
            arrays[prefix + "W_0"] = rng.normal(0, scale, (2 * p, 4 * cell))
            arrays[prefix + "B"] = rng.normal(0, scale, (4 * cell,))
            arrays[prefix + "W_P_0"] = rng.normal(0, scale, (cell, p))
    return {k: v.astype(np.float32) for k, v in arrays.items()}


def write_released(directory: Path, options: dict = OPTIONS, arrays: dict | None = None) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    arrays = released_arrays(options) if arrays is None else arrays
    (directory / "options.json").write_text(json.dumps(options))
    with h5py.File(directory / "weights.hdf5", "w") as handle:
        for name, array in arrays.items():
            handle.create_dataset(name, data=array)
    return directory / "options.json", directory / "weights.hdf5"


# --- a reference forward, straight from the arrays (bilm-tf's computation, in float64) --------------------------------

def raw_chars(word: str) -> list[int]:
    """bilm-tf's character ids (no shift): 258 begin of word, 259 end, 260 padding, 256/257 the sentence markers."""
    body = {"<S>": [256], "</S>": [257]}.get(word) or list(word.encode("utf-8"))
    return ([258, *body, 259] + [260] * 50)[:50]


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def token_vector(a: dict, options: dict, word: str) -> np.ndarray:
    e = a["char_embed"].astype(np.float64)[raw_chars(word)]  # [50, dim]
    features = []
    for i, (width, _) in enumerate(options["char_cnn"]["filters"]):
        w = a[f"CNN/W_cnn_{i}"][0].astype(np.float64)  # [width, dim, count]
        conv = np.stack([sum(e[t + k] @ w[k] for k in range(width)) for t in range(50 - width + 1)])
        features.append(np.maximum((conv + a[f"CNN/b_cnn_{i}"]).max(0), 0))
    x = np.concatenate(features)
    for k in range(options["char_cnn"]["n_highway"]):
        carry = sigmoid(x @ a[f"CNN_high_{k}/W_carry"] + a[f"CNN_high_{k}/b_carry"])
        transform = np.maximum(x @ a[f"CNN_high_{k}/W_transform"] + a[f"CNN_high_{k}/b_transform"], 0)
        x = carry * transform + (1 - carry) * x
    return x @ a["CNN_proj/W_proj"] + a["CNN_proj/b_proj"]


def lstm(a: dict, prefix: str, xs: list, options: dict) -> list:
    """TensorFlow's LSTMCell: [x, h] @ W_0 + B split in i, j, f, o, forget bias 1, clipped cell and projection."""
    cell, clip_c, clip_p = options["lstm"]["dim"], options["lstm"]["cell_clip"], options["lstm"]["proj_clip"]
    h, c, out = np.zeros(options["lstm"]["projection_dim"]), np.zeros(cell), []
    for x in xs:
        z = np.concatenate([x, h]) @ a[prefix + "W_0"] + a[prefix + "B"]
        i, j, f, o = (z[g * cell:(g + 1) * cell] for g in range(4))
        c = np.clip(sigmoid(f + 1.0) * c + sigmoid(i) * np.tanh(j), -clip_c, clip_c)
        h = np.clip((sigmoid(o) * np.tanh(c)) @ a[prefix + "W_P_0"], -clip_p, clip_p)
        out.append(h)
    return out


def reference_layers(a: dict, options: dict, words: list[str]) -> list[np.ndarray]:
    tokens = [token_vector(a, options, w) for w in ["<S>", *words, "</S>"]]
    layers = [np.stack([np.concatenate([t, t]) for t in tokens])]
    directions = []
    for d in range(2):
        x = tokens if d == 0 else tokens[::-1]
        outs = []
        for layer in range(options["lstm"]["n_layers"]):
            y = lstm(a, f"RNN_{d}/RNN/MultiRNNCell/Cell{layer}/LSTMCell/", x, options)
            if layer > 0:
                y = [yi + xi for yi, xi in zip(y, x)]
            outs.append(y if d == 0 else y[::-1])
            x = y
        directions.append(outs)
    for layer in range(options["lstm"]["n_layers"]):
        layers.append(np.stack([np.concatenate([f, b]) for f, b in zip(directions[0][layer], directions[1][layer])]))
    return layers


# --- tests --------------------------------------------------------------------------------------------------------

def test_released_layout_reads_and_runs_as_the_reference(tmp_path):
    arrays = released_arrays(OPTIONS)
    model = read_elmo(*write_released(tmp_path, OPTIONS, arrays))
    config = model.config
    assert (config.cell_size, config.projection_dim, config.num_layers, config.num_highway) == (16, 8, 2, 2)
    assert config.filters == [[1, 4], [2, 4], [3, 8]] and config.cell_clip == 3.0 and config.proj_clip == 1.0
    assert config.vocab_size == 0  # both clips bite in this forward (the cell reaches 4, the projection 1.9)
    state = model.state_dict()
    assert state["characters.embed.weight"].shape == (262, 4) and state["characters.embed.weight"][0].eq(0).all()
    assert state["characters.convs.2.weight"].shape == (8, 4, 3)
    assert state["forward_layers.1.weight_ih"].shape == (64, 8)
    assert state["backward_layers.0.weight_hr"].shape == (8, 16)
    words = ["Héllo", "tiny", "world", "!"]
    chars, mask = batch_to_ids([words])
    with torch.no_grad():
        ours = model.layer_states(chars, mask)
    for got, want in zip(ours, reference_layers(arrays, OPTIONS, words)):
        np.testing.assert_allclose(got[0].numpy(), want, atol=1e-5, rtol=1e-5)


def test_our_writer_round_trips_with_the_softmax(tmp_path):
    torch.manual_seed(0)
    model = ElmoModel(tiny_config(vocab_size=12, cell_clip=None, proj_clip=None), [HeadSpec("lm", "tied_lm_bias")])
    model.init_weights(torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.heads["lm"].bias.normal_(0, 1, generator=torch.Generator().manual_seed(1))
    words = [f"w{i}" for i in range(12)]
    write_elmo(model, tmp_path / "out", vocabulary=words)
    assert (tmp_path / "out" / "vocab.txt").read_text().split() == words
    with h5py.File(tmp_path / "out" / "weights.hdf5", "r") as handle:
        assert handle["RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_0"].shape == (128, 1024)
        assert handle["CNN/W_cnn_3"].shape == (1, 4, 8, 64) and handle["softmax/W"].shape == (12, 64)
    again = read_elmo(tmp_path / "out" / "options.json", tmp_path / "out" / "weights.hdf5")
    assert again.config == model.config
    for key, value in model.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key
    # The file our writer makes has exactly the names and shapes of the released layout (no softmax there).
    theirs = released_arrays(json.loads((tmp_path / "out" / "options.json").read_text()))
    with h5py.File(tmp_path / "out" / "weights.hdf5", "r") as handle:
        names = set()
        handle.visititems(lambda name, node: names.add(name) if isinstance(node, h5py.Dataset) else None)
        assert names - {"softmax/W", "softmax/b"} == set(theirs)
        assert all(handle[name].shape == theirs[name].shape for name in theirs)


def expect_error(tmp_path: Path, match: str, options: dict = OPTIONS, arrays: dict | None = None) -> None:
    with pytest.raises(CheckpointError, match=match):
        read_elmo(*write_released(tmp_path, options, arrays))


def test_missing_or_misshaped_weights_are_named(tmp_path):
    arrays = released_arrays(OPTIONS)
    del arrays["CNN_high_1/W_carry"]
    expect_error(tmp_path / "a", r"missing weight 'CNN_high_1/W_carry'", arrays=arrays)
    arrays = released_arrays(OPTIONS)
    arrays["RNN_1/RNN/MultiRNNCell/Cell0/LSTMCell/W_P_0"] = arrays["RNN_1/RNN/MultiRNNCell/Cell0/LSTMCell/W_P_0"][:5]
    expect_error(tmp_path / "b", r"'RNN_1/RNN/MultiRNNCell/Cell0/LSTMCell/W_P_0' has shape \(5, 8\).*\(16, 8\)",
                 arrays=arrays)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "weights.hdf5").write_bytes(b"not hdf5 at all")
    (tmp_path / "c" / "options.json").write_text(json.dumps(OPTIONS))
    with pytest.raises(CheckpointError, match="not a readable HDF5 file"):
        read_elmo(tmp_path / "c" / "options.json", tmp_path / "c" / "weights.hdf5")


def test_options_that_disagree_with_the_weights_are_named(tmp_path):
    arrays = released_arrays(OPTIONS)
    fewer = copy.deepcopy(OPTIONS)
    fewer["char_cnn"]["n_highway"] = 1
    expect_error(tmp_path / "a", r"'CNN_high_1/W_carry'.* not described by .*char_cnn.n_highway 1", fewer, arrays)
    wider = copy.deepcopy(OPTIONS)
    wider["char_cnn"]["filters"][2] = [3, 16]
    expect_error(tmp_path / "b", r"'CNN/W_cnn_2' has shape \(1, 3, 4, 8\).*char_cnn.filters\[2\]", wider, arrays)
    cells = copy.deepcopy(OPTIONS)
    cells["lstm"]["dim"] = 32
    expect_error(tmp_path / "c", r"'RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_0'.*lstm.dim", cells, arrays)
    vocab = copy.deepcopy(OPTIONS)
    vocab["n_tokens_vocab"] = 100
    expect_error(tmp_path / "d", r"missing 'softmax/W'.*n_tokens_vocab", vocab, arrays)
    missing = copy.deepcopy(OPTIONS)
    del missing["lstm"]["dim"]
    expect_error(tmp_path / "e", r"missing key 'lstm.dim'", missing, arrays)
    chars = copy.deepcopy(OPTIONS)
    chars["char_cnn"]["n_characters"] = 300
    expect_error(tmp_path / "f", r"'char_cnn.n_characters' is 300", chars, arrays)
    typed = copy.deepcopy(OPTIONS)
    typed["lstm"]["n_layers"] = "two"
    expect_error(tmp_path / "g", r"'lstm.n_layers' must be int", typed, arrays)


def test_bertology_load_reads_a_released_directory(tmp_path):
    import bertology
    from bertology.tokenization.words import WordVocabulary

    write_released(tmp_path / "released")
    pretrained = bertology.load(tmp_path / "released")
    assert isinstance(pretrained.model, ElmoModel) and pretrained.tokenizer is None
    torch.manual_seed(0)
    model = ElmoModel(tiny_config(vocab_size=6), [HeadSpec("lm", "tied_lm_bias")])
    model.init_weights(torch.Generator().manual_seed(0))
    write_elmo(model, tmp_path / "ours", vocabulary=["<pad>", "<S>", "</S>", "<UNK>", "the", "cat"])
    pretrained = bertology.load(tmp_path / "ours")
    assert isinstance(pretrained.tokenizer, WordVocabulary) and pretrained.tokenizer.words[-1] == "cat"
    assert torch.equal(pretrained.model.word_embeddings.weight, model.word_embeddings.weight)


def test_a_dataset_claiming_more_than_the_file_is_refused_before_reading(tmp_path):
    write_released(tmp_path)
    with h5py.File(tmp_path / "weights.hdf5", "a") as handle:
        del handle["CNN/W_cnn_0"]
        handle.create_dataset("CNN/W_cnn_0", shape=(1, 1, 4, 100_000_000), dtype="float32")  # never written
    with pytest.raises(CheckpointError, match=r"dataset 'CNN/W_cnn_0' claims \(1, 1, 4, 100000000\) float32"):
        read_elmo(tmp_path / "options.json", tmp_path / "weights.hdf5")


# --- what options.json declares and where the HDF5 bytes come from ------------------------------------------------


@pytest.mark.parametrize("key,change,match", [
    ("lstm.n_layers", lambda o: o["lstm"].update(n_layers=10**9),
     r"options\.json: lstm\.n_layers declares 1000000000 .*weights\.hdf5 holds weights for 2"),
    ("char_cnn.n_highway", lambda o: o["char_cnn"].update(n_highway=10**9),
     r"options\.json: char_cnn\.n_highway declares 1000000000 .*weights\.hdf5 holds weights for 2"),
    ("char_cnn.max_characters_per_token", lambda o: o["char_cnn"].update(max_characters_per_token=10**12),
     r"options\.json: max_characters_per_token must lie in \[3, 256\].*got 1000000000000"),
])
def test_declared_sizes_beyond_the_weights_or_the_caps_are_refused_at_once(tmp_path, monkeypatch, key, change,
                                                                             match):
    options = copy.deepcopy(OPTIONS)
    options_path, weights_path = write_released(tmp_path, OPTIONS)
    change(options)
    options_path.write_text(json.dumps(options))
    built = []
    monkeypatch.setattr(ElmoModel, "__init__", lambda self, *a, **k: built.append(a))
    with pytest.raises(CheckpointError, match=match):
        read_elmo(options_path, weights_path)
    assert built == []  # refused before any model (or the table of a billion layers' weights) is made


def test_external_storage_pointing_outside_the_file_is_refused(tmp_path):
    options_path, weights_path = write_released(tmp_path)
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(np.arange(261 * 4, dtype=np.float32).tobytes())
    with h5py.File(weights_path, "a") as handle:
        del handle["char_embed"]
        handle.create_dataset("char_embed", shape=(261, 4), dtype=np.float32,
                              external=[(str(outside), 0, 261 * 4 * 4)])
    with h5py.File(weights_path, "r") as handle:  # the crafted file does read another file's bytes as weights
        assert np.array_equal(handle["char_embed"][0], np.arange(4, dtype=np.float32))
    with pytest.raises(CheckpointError, match=r"weights\.hdf5: dataset 'char_embed' keeps its values in external "
                                              r"storage .*elsewhere\.bin"):
        read_elmo(options_path, weights_path)


def test_a_virtual_dataset_mapping_another_file_is_refused(tmp_path):
    options_path, weights_path = write_released(tmp_path)
    source = tmp_path / "source.h5"
    with h5py.File(source, "w") as handle:
        handle.create_dataset("data", data=np.ones((261, 4), np.float32))
    layout = h5py.VirtualLayout(shape=(261, 4), dtype=np.float32)
    layout[:] = h5py.VirtualSource(str(source), "data", shape=(261, 4))
    with h5py.File(weights_path, "a") as handle:
        del handle["char_embed"]
        handle.create_virtual_dataset("char_embed", layout)
    with pytest.raises(CheckpointError, match=r"weights\.hdf5: dataset 'char_embed' is a virtual dataset"):
        read_elmo(options_path, weights_path)
