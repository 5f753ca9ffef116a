"""ELMo's released format: `options.json` and an HDF5 weight file, as bilm-tf dumps them and AllenNLP reads them.

options.json: {"lstm": {"dim": cell size, "projection_dim", "n_layers", "cell_clip", "proj_clip",
"use_skip_connections"}, "char_cnn": {"activation", "filters": [[width, count], ...], "n_highway",
"embedding": {"dim"}, "n_characters": 262 (261 in bilm-tf's training options), "max_characters_per_token"}} and,
from bilm-tf's training options, "n_tokens_vocab" and "dropout" when present.

The weight file, TensorFlow's layouts ([in, out] matrices):

    char_embed                                         [261, dim]        rows of ids 0..260 (ours are + 1; 0 is 0)
    CNN/W_cnn_i, CNN/b_cnn_i                           [1, width, dim, count], [count]
    CNN_high_k/W_transform, b_transform, W_carry, b_carry   [n, n], [n]   y = s relu(x W_t + b_t) + (1 - s) x,
                                                                          s = sigmoid(x W_c + b_c)
    CNN_proj/W_proj, b_proj                            [n, projection_dim], [projection_dim]
    RNN_d/RNN/MultiRNNCell/Cell{l}/LSTMCell/W_0        [input + projection_dim, 4 cell]  ([x, h] @ W_0)
                                            .../B      [4 cell]          gates i, j, f, o; TF adds 1 to f's bias
                                            .../W_P_0  [cell, projection_dim]
    softmax/W, softmax/b                               [vocab, projection_dim], [vocab]   (bertology's addition;
                                                                          bilm-tf does not dump its softmax)

d = 0 is the forward LM, 1 the backward one. Every name and shape is checked against options.json before anything
is loaded: a missing, mis-shaped or unexpected weight is a CheckpointError naming its key and the option it follows
from. h5py is needed only here (`pip install h5py`)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertology.errors import BertologyError, CheckpointError
from bertology.inputs import json_file
from bertology.io import atomic_directory
from bertology.model.elmo import NUM_CHARACTERS, ElmoConfig, ElmoModel
from bertology.model.heads import HeadSpec

OPTIONS_FILE = "options.json"
WEIGHTS_FILE = "weights.hdf5"
VOCAB_FILE = "vocab.txt"
TF_GATES = (0, 2, 1, 3)  # ours (i, f, g, o) from TF's (i, j, f, o), and back: the permutation is its own inverse


def h5py_module() -> Any:
    try:
        import h5py
    except ImportError:  # pragma: no cover - h5py is a declared dependency
        raise CheckpointError("reading or writing ELMo's HDF5 weights needs h5py (pip install h5py)") from None
    return h5py


# --- options ------------------------------------------------------------------------------------------------------


def _get(data: dict[str, Any], path: str, source: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            if default is not ...:
                return default
            raise CheckpointError(f"{source}: missing key {path!r}")
        node = node[part]
    if isinstance(node, bool) and kind is not bool or not isinstance(node, kind):
        raise CheckpointError(f"{source}: {path!r} must be {getattr(kind, '__name__', kind)}, got {node!r}")
    return node


def config_from_options(options: dict[str, Any], source: str) -> ElmoConfig:
    """An ElmoConfig from options.json's mapping; missing or wrong keys are CheckpointErrors naming them."""
    number = (int, float)
    n_characters = _get(options, "char_cnn.n_characters", source, int)
    if n_characters not in (NUM_CHARACTERS - 1, NUM_CHARACTERS):
        raise CheckpointError(f"{source}: 'char_cnn.n_characters' is {n_characters}; ELMo's characters are "
                              f"{NUM_CHARACTERS} ids (261 without padding)")
    filters = _get(options, "char_cnn.filters", source, list)
    if not all(isinstance(f, list) and len(f) == 2 and all(isinstance(v, int) for v in f) for f in filters):
        raise CheckpointError(f"{source}: 'char_cnn.filters' must be a list of [width, count] pairs, got {filters!r}")
    clips = {}
    for key in ("cell_clip", "proj_clip"):
        value = _get(options, f"lstm.{key}", source, number, None)
        clips[key] = float(value) if value else None  # absent or 0: no clipping
    values: dict[str, Any] = dict(
        vocab_size=_get(options, "n_tokens_vocab", source, int, 0),
        max_characters_per_token=_get(options, "char_cnn.max_characters_per_token", source, int),
        char_embedding_dim=_get(options, "char_cnn.embedding.dim", source, int),
        filters=filters,
        num_highway=_get(options, "char_cnn.n_highway", source, int),
        char_activation=_get(options, "char_cnn.activation", source, str),
        projection_dim=_get(options, "lstm.projection_dim", source, int),
        cell_size=_get(options, "lstm.dim", source, int),
        num_layers=_get(options, "lstm.n_layers", source, int),
        skip_connections=_get(options, "lstm.use_skip_connections", source, bool, False),
        dropout=float(_get(options, "dropout", source, number, 0.0)),
        **clips,
    )
    try:
        return ElmoConfig(**values)
    except BertologyError as error:
        raise CheckpointError(f"{source}: {error}") from None


def options_from_config(config: ElmoConfig) -> dict[str, Any]:
    options: dict[str, Any] = {
        "lstm": {"dim": config.cell_size, "projection_dim": config.projection_dim, "n_layers": config.num_layers,
                 "cell_clip": config.cell_clip or 0, "proj_clip": config.proj_clip or 0,
                 "use_skip_connections": config.skip_connections},
        "char_cnn": {"activation": config.char_activation, "filters": config.filters,
                     "n_highway": config.num_highway, "embedding": {"dim": config.char_embedding_dim},
                     "n_characters": NUM_CHARACTERS, "max_characters_per_token": config.max_characters_per_token},
        "dropout": config.dropout,
    }
    if config.vocab_size:
        options["n_tokens_vocab"] = config.vocab_size
    return options


# --- the weight table ---------------------------------------------------------------------------------------------


def lstm_prefix(direction: int, layer: int) -> str:
    return f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell/"


def expected_shapes(config: ElmoConfig, softmax: bool) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every dataset the weight file must hold: name -> (shape, the options.json keys it follows from)."""
    n, p, cell, dim = config.num_filters, config.projection_dim, config.cell_size, config.char_embedding_dim
    out: dict[str, tuple[tuple[int, ...], str]] = {"char_embed": ((NUM_CHARACTERS - 1, dim), "char_cnn.embedding.dim")}
    for i, (width, count) in enumerate(config.filters):
        out[f"CNN/W_cnn_{i}"] = ((1, width, dim, count), f"char_cnn.filters[{i}]")
        out[f"CNN/b_cnn_{i}"] = ((count,), f"char_cnn.filters[{i}]")
    for k in range(config.num_highway):
        for part in ("transform", "carry"):
            out[f"CNN_high_{k}/W_{part}"] = ((n, n), "char_cnn.filters, char_cnn.n_highway")
            out[f"CNN_high_{k}/b_{part}"] = ((n,), "char_cnn.filters, char_cnn.n_highway")
    out["CNN_proj/W_proj"] = ((n, p), "char_cnn.filters, lstm.projection_dim")
    out["CNN_proj/b_proj"] = ((p,), "lstm.projection_dim")
    for d in range(2):
        for layer in range(config.num_layers):
            prefix = lstm_prefix(d, layer)
            out[prefix + "W_0"] = ((2 * p, 4 * cell), "lstm.dim, lstm.projection_dim, lstm.n_layers")
            out[prefix + "B"] = ((4 * cell,), "lstm.dim, lstm.n_layers")
            out[prefix + "W_P_0"] = ((cell, p), "lstm.dim, lstm.projection_dim, lstm.n_layers")
    if softmax:
        out["softmax/W"] = ((config.vocab_size, p), "n_tokens_vocab, lstm.projection_dim")
        out["softmax/b"] = ((config.vocab_size,), "n_tokens_vocab")
    return out


def _gates(x: np.ndarray, cell: int) -> np.ndarray:
    """Rows (or entries) grouped in four gates, reordered between TF's order and ours (an involution)."""
    return np.concatenate([x[g * cell:(g + 1) * cell] for g in TF_GATES])


def state_from_arrays(config: ElmoConfig, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Our state dict (the LM head's bias as `heads.lm.bias`) from the weight file's arrays."""
    def t(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))

    p, cell = config.projection_dim, config.cell_size
    embed = np.zeros((NUM_CHARACTERS, config.char_embedding_dim), np.float32)
    embed[1:] = arrays["char_embed"]
    state = {"characters.embed.weight": t(embed)}
    for i in range(len(config.filters)):
        state[f"characters.convs.{i}.weight"] = t(arrays[f"CNN/W_cnn_{i}"][0].transpose(2, 1, 0))
        state[f"characters.convs.{i}.bias"] = t(arrays[f"CNN/b_cnn_{i}"])
    for k in range(config.num_highway):
        for part in ("transform", "carry"):
            state[f"characters.highways.{k}.{part}.weight"] = t(arrays[f"CNN_high_{k}/W_{part}"].T)
            state[f"characters.highways.{k}.{part}.bias"] = t(arrays[f"CNN_high_{k}/b_{part}"])
    state["characters.projection.weight"] = t(arrays["CNN_proj/W_proj"].T)
    state["characters.projection.bias"] = t(arrays["CNN_proj/b_proj"])
    for d, stack in enumerate(("forward_layers", "backward_layers")):
        for layer in range(config.num_layers):
            prefix, ours = lstm_prefix(d, layer), f"{stack}.{layer}."
            kernel = _gates(arrays[prefix + "W_0"].T, cell)  # [4 cell, input + p], our gate order
            bias = arrays[prefix + "B"].astype(np.float32).copy()
            bias[2 * cell:3 * cell] += 1.0  # TF's forget bias, added at run time there
            state[ours + "weight_ih"] = t(kernel[:, :p])
            state[ours + "weight_hh"] = t(kernel[:, p:])
            state[ours + "bias"] = t(_gates(bias, cell))
            state[ours + "weight_hr"] = t(arrays[prefix + "W_P_0"].T)
    if "softmax/W" in arrays:
        state["softmax.weight"] = t(arrays["softmax/W"])
        state["heads.lm.bias"] = t(arrays["softmax/b"])
    return state


def arrays_from_model(model: ElmoModel) -> dict[str, np.ndarray]:
    config, cell = model.config, model.config.cell_size
    state = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    out = {"char_embed": state["characters.embed.weight"][1:]}
    for i in range(len(config.filters)):
        out[f"CNN/W_cnn_{i}"] = state[f"characters.convs.{i}.weight"].transpose(2, 1, 0)[None]
        out[f"CNN/b_cnn_{i}"] = state[f"characters.convs.{i}.bias"]
    for k in range(config.num_highway):
        for part in ("transform", "carry"):
            out[f"CNN_high_{k}/W_{part}"] = state[f"characters.highways.{k}.{part}.weight"].T
            out[f"CNN_high_{k}/b_{part}"] = state[f"characters.highways.{k}.{part}.bias"]
    out["CNN_proj/W_proj"] = state["characters.projection.weight"].T
    out["CNN_proj/b_proj"] = state["characters.projection.bias"]
    for d, stack in enumerate(("forward_layers", "backward_layers")):
        for layer in range(config.num_layers):
            prefix, ours = lstm_prefix(d, layer), f"{stack}.{layer}."
            kernel = np.concatenate([state[ours + "weight_ih"], state[ours + "weight_hh"]], axis=1)
            out[prefix + "W_0"] = _gates(kernel, cell).T
            bias = _gates(state[ours + "bias"], cell).copy()
            bias[2 * cell:3 * cell] -= 1.0
            out[prefix + "B"] = bias
            out[prefix + "W_P_0"] = state[ours + "weight_hr"].T
    if model.softmax is not None:
        out["softmax/W"] = state["softmax.weight"]
        bias = state.get("heads.lm.bias")
        out["softmax/b"] = bias if bias is not None else np.zeros(config.vocab_size, np.float32)
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


# --- reading and writing --------------------------------------------------------------------------------------------


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every dataset of an HDF5 file by its path ("CNN/W_cnn_0"); an unreadable file, or a dataset claiming more
    bytes than the whole file holds (checked before it is read), is a CheckpointError naming the file."""
    h5py = h5py_module()
    arrays: dict[str, np.ndarray] = {}
    size = path.stat().st_size
    try:
        with h5py.File(path, "r") as handle:
            def visit(name: str, node: Any) -> None:
                if isinstance(node, h5py.Dataset):
                    # Bytes kept outside the file (external storage, a virtual dataset's sources) could be any file
                    # on the machine: only the weight file itself is read.
                    if node.is_virtual:
                        raise CheckpointError(f"{path}: dataset {name!r} is a virtual dataset, whose values live in "
                                              "other files; ELMo weights are read from the weight file only")
                    if node.external:
                        raise CheckpointError(f"{path}: dataset {name!r} keeps its values in external storage "
                                              f"({node.external[0][0]!r}); ELMo weights are read from the weight "
                                              "file only")
                    if node.size * node.dtype.itemsize > size:
                        raise CheckpointError(f"{path}: dataset {name!r} claims {tuple(node.shape)} "
                                              f"{node.dtype} values, more than the file's {size} bytes")
                    arrays[name] = np.asarray(node[...])
            handle.visititems(visit)
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as error:
        raise CheckpointError(f"{path}: not a readable HDF5 file ({type(error).__name__}: {error})") from None
    return arrays


def stored_count(arrays: dict[str, np.ndarray], pattern: str) -> int:
    """How many numbered groups (LSTM cells, highway layers) the weight file holds: `pattern` matches a name and
    captures the number."""
    numbers = {int(match.group(1)) for name in arrays if (match := re.fullmatch(pattern, name))}
    return len(numbers)


def check_arrays(config: ElmoConfig, arrays: dict[str, np.ndarray], options: str, weights: str) -> None:
    # The depths options.json declares against what the file holds, before the table of expected weights (a few
    # entries a layer) is made: lstm.n_layers 10**9 is refused at once.
    for key, declared, pattern in (
            ("lstm.n_layers", config.num_layers, r"RNN_0/RNN/MultiRNNCell/Cell(\d+)/LSTMCell/W_0"),
            ("char_cnn.n_highway", config.num_highway, r"CNN_high_(\d+)/W_transform"),
            ("char_cnn.filters", len(config.filters), r"CNN/W_cnn_(\d+)")):
        stored = stored_count(arrays, pattern)
        if declared > stored:
            raise CheckpointError(f"{options}: {key} declares {declared} (layers or filters), but {weights} holds "
                                  f"weights for {stored}")
    expected = expected_shapes(config, softmax="softmax/W" in arrays or "softmax/b" in arrays)
    if config.vocab_size and "softmax/W" not in arrays:
        raise CheckpointError(f"{weights}: missing 'softmax/W': {options} gives 'n_tokens_vocab' "
                              f"{config.vocab_size} but the file has no softmax")
    for name, (shape, keys) in expected.items():
        if name not in arrays:
            raise CheckpointError(f"{weights}: missing weight {name!r} (expected from {options} {keys})")
        if tuple(arrays[name].shape) != shape:
            raise CheckpointError(f"{weights}: weight {name!r} has shape {tuple(arrays[name].shape)}, but {options} "
                                  f"({keys}) gives {shape}")
        if not np.issubdtype(arrays[name].dtype, np.floating):
            raise CheckpointError(f"{weights}: weight {name!r} is {arrays[name].dtype}, not floating point")
    unexpected = sorted(set(arrays) - set(expected))
    if unexpected:
        raise CheckpointError(f"{weights}: weight(s) {', '.join(repr(n) for n in unexpected[:5])} are not described "
                              f"by {options} (char_cnn.filters {config.filters}, char_cnn.n_highway "
                              f"{config.num_highway}, lstm.n_layers {config.num_layers}): do the files belong "
                              "together?")


def read_elmo(options_file: str | os.PathLike, weight_file: str | os.PathLike) -> ElmoModel:
    """An ElmoModel (in eval mode) from options.json and the HDF5 weights; with a softmax in the file, with its
    `lm` head (`tied_lm_bias`)."""
    options_path, weights_path = Path(options_file), Path(weight_file)
    for path in (options_path, weights_path):
        if not path.is_file():
            raise CheckpointError(f"{path}: no such file")
    options = json_file(options_path, CheckpointError)
    arrays = read_arrays(weights_path)
    config = config_from_options(options, str(options_path))
    if "softmax/W" in arrays and not config.vocab_size:
        config.vocab_size = int(arrays["softmax/W"].shape[0])
    check_arrays(config, arrays, str(options_path), str(weights_path))
    heads = [HeadSpec("lm", "tied_lm_bias")] if config.vocab_size else []
    model = ElmoModel(config, heads)
    model.load_state_dict(state_from_arrays(config, arrays))
    return model.eval()


def write_elmo(model: ElmoModel, directory: str | os.PathLike, vocabulary: list[str] | None = None) -> Path:
    """options.json, weights.hdf5 (and vocab.txt, one word a line, when given: the softmax's rows) in `directory`,
    atomically. `bertology.load` reads such a directory back (with vocab.txt as its `WordVocabulary` when that
    starts with the special words)."""
    h5py = h5py_module()
    if not isinstance(model, ElmoModel):
        raise CheckpointError(f"write_elmo writes ELMo models, not {type(model).__name__}")
    if vocabulary is not None and len(vocabulary) != model.config.vocab_size:
        raise CheckpointError(f"write_elmo: {len(vocabulary)} words for a softmax of {model.config.vocab_size}")
    arrays = arrays_from_model(model)
    with atomic_directory(directory) as tmp:
        (tmp / OPTIONS_FILE).write_text(json.dumps(options_from_config(model.config), indent=2) + "\n",
                                        encoding="utf-8")
        with h5py.File(tmp / WEIGHTS_FILE, "w") as handle:
            for name, array in arrays.items():
                handle.create_dataset(name, data=array)
        if vocabulary is not None:
            (tmp / VOCAB_FILE).write_text("".join(f"{w}\n" for w in vocabulary), encoding="utf-8")
    return Path(directory)
