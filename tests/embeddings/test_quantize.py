"""int8 inference (bertology.model.quantize): the int8 linear map, the quantized encoder against float32, --dtype."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from bertology.cli.main import main
from bertology.embeddings import embed
from bertology.errors import ConfigError
from bertology.model import TransformerConfig, EncoderModel, Pretrained, load
from bertology.model.quantize import Int8Linear, check_dtype, is_quantized, quantize, with_dtype

quantize_module = sys.modules["bertology.model.quantize"]

TEXTS = [
    "The bank raised its rates.",
    "An unaffable clerk stamped the form twice, then left.",
    "Hi",
    "She sat on the river bank and watched the water rush past the old mill.",
    "",
]


@pytest.fixture(scope="module")
def minilm(minilm_path) -> Pretrained:
    return load(minilm_path)


@pytest.fixture(scope="module")
def minilm_int8(minilm) -> Pretrained:
    return quantize(minilm)


@pytest.mark.parametrize("split", [False, True])
def test_int8_linear_is_exact_on_values_it_can_represent(monkeypatch, split):
    # Weights that are integers in [-127, 127] times a per-row scale, and input rows that are low + integers in
    # [0, 255] times a per-row step, are represented exactly: the int8 product equals the float one up to float32
    # rounding. Both ends of both ranges are reached, so a matmul that saturates 16-bit pair sums would be off by
    # ~10^4; `split`: the weight split in two as where the CPU's int8 matmul saturates, whatever this CPU does.
    if split:
        monkeypatch.setattr(quantize_module, "int_mm_saturates", lambda: True)
    g = torch.Generator().manual_seed(0)
    linear = nn.Linear(24, 10)
    with torch.no_grad():
        row_scale = torch.rand(10, 1, generator=g) + 0.1
        ints = torch.randint(-127, 128, (10, 24), generator=g).float()
        ints[:, 0] = 127  # each row reaches 127, so its scale is exactly row_scale / 127
        linear.weight.copy_(ints * row_scale / 127)
    q = Int8Linear.from_linear(linear)
    torch.testing.assert_close(q.dequantized_weight(), linear.weight.detach(), rtol=1e-6, atol=1e-7)
    levels = torch.randint(0, 256, (3, 5, 24), generator=g).float()
    levels[..., 0], levels[..., 1] = 0, 255  # each row spans exactly 255 steps
    x = -1.5 + levels * 0.0625  # the step is a power of two: x is exact in float32
    torch.testing.assert_close(q(x), linear(x).detach(), rtol=1e-5, atol=1e-5)
    assert q(x).shape == (3, 5, 10)


def test_int8_linear_is_exact_where_the_cpus_int8_matmul_saturates():
    """oneDNN without AVX512-VNNI (ONEDNN_MAX_CPU_ISA=AVX2 caps any x86-64 CPU to it) sums pairs of byte products in
    saturating 16 bits: the probe sees it, and the layer stays exact on full-range operands."""
    code = (
        "import platform, torch\n"
        "from bertology.model.quantize import Int8Linear, int_mm_saturates\n"
        "assert int_mm_saturates() or platform.machine().lower() not in ('x86_64', 'amd64')\n"
        "g = torch.Generator().manual_seed(0)\n"
        "ints = torch.randint(-127, 128, (16, 32), generator=g).float()\n"
        "ints[:, 0], ints[0], ints[1] = 127, 127, -127  # rows of 127s: pairs of 255 x 127 products\n"
        "linear = torch.nn.Linear(32, 16, bias=False)\n"
        "with torch.no_grad():\n"
        "    linear.weight.copy_(ints * (torch.arange(16.0)[:, None] + 1) / 8)\n"
        "levels = torch.randint(0, 256, (9, 32), generator=g).float()\n"
        "levels[:, 0], levels[:, 1], levels[0, 2:] = 0, 255, 255  # each row spans 255 steps; one of 255s\n"
        "x = -2.0 + levels / 16\n"
        "q = Int8Linear.from_linear(linear)\n"
        "y = linear(x).detach()  # float32 rounding of terms up to ~4e3, relative to the scale; saturation: ~10^3\n"
        "assert (q(x) - y).abs().max() <= 1e-5 * y.abs().max(), (q(x) - y).abs().max()\n")
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2", PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_int8_linear_handles_zero_rows_and_no_rows():
    linear = nn.Linear(8, 4)
    q = Int8Linear.from_linear(linear)
    zeros = torch.zeros(2, 8)
    torch.testing.assert_close(q(zeros), linear.bias.detach().expand(2, 4))
    assert q(torch.zeros(0, 8)).shape == (0, 4)


def test_int8_linear_error_is_within_the_rounding_bound():
    # Per-row activation and per-channel weight rounding: |error| <= sum_k (|x_k| dw_k + |w_k| dx_k + dx_k dw_k),
    # with dx = x_scale / 2 and dw = w_scale / 2.
    g = torch.Generator().manual_seed(1)
    linear = nn.Linear(64, 16)
    x = torch.randn(50, 64, generator=g) * 3
    q = Int8Linear.from_linear(linear)
    w = linear.weight.detach()
    dx = x.abs().amax(1, keepdim=True) / 127 / 2  # [50, 1]
    dw = (w.abs().amax(1) / 127 / 2)[None, :, None]  # [1, 16, 1]
    bound = (x.abs()[:, None, :] * dw + w.abs()[None] * dx[:, :, None] + dx[:, :, None] * dw).sum(-1)
    error = (q(x) - linear(x).detach()).abs()
    assert (error <= bound + 1e-5).all()
    assert error.max() > 0  # it is an approximation, not a copy of the float layer


def test_quantize_replaces_the_layer_linears_and_leaves_the_original(minilm, minilm_int8):
    q = minilm_int8
    assert isinstance(q, Pretrained) and q.tokenizer is minilm.tokenizer
    layer = q.model.encoder.layers[0]
    assert all(isinstance(getattr(layer, n), Int8Linear) for n in ("query", "key", "value", "attn_out", "ffn_in",
                                                                     "ffn_out"))
    assert type(minilm.model.encoder.layers[0].query) is nn.Linear  # a copy: the float32 model is untouched
    assert is_quantized(q) and not is_quantized(minilm)
    assert not q.model.training


def test_quantized_minilm_sentence_vectors_are_close_to_float32(minilm, minilm_int8):
    base = embed(minilm, TEXTS, levels=("sentence",)).sentences
    int8 = embed(minilm_int8, TEXTS, levels=("sentence",)).sentences
    cosine = (base * int8).sum(1) / np.linalg.norm(base, axis=1) / np.linalg.norm(int8, axis=1)
    assert cosine.min() > 0.99, cosine
    assert not np.array_equal(base, int8)


def test_quantized_packed_and_padded_paths_are_both_close_to_float32(minilm, minilm_int8):
    # Not equal to each other: float32 differences of 1e-7 between the two paths flip an int8 level here and there.
    model = minilm_int8.model
    batch = minilm.tokenizer.encode_batch(TEXTS[:4])
    real = batch.attention_mask.bool()
    with torch.inference_mode():
        base = minilm.model(batch.input_ids, batch.attention_mask, batch.token_type_ids).last_hidden_state[real]
        for packed in (True, False):
            out = model(batch.input_ids, batch.attention_mask, batch.token_type_ids, packed=packed)
            cosine = torch.nn.functional.cosine_similarity(out.last_hidden_state[real], base)
            assert cosine.min() > 0.98, (packed, cosine.min())


def test_wrapped_linears_stay_float32():
    class Wrapped(nn.Module):
        def __init__(self, inner: nn.Linear) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)

    config = TransformerConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                           max_position_embeddings=16)
    model = EncoderModel(config)
    model.encoder.layers[0].value = Wrapped(model.encoder.layers[0].value)
    q = quantize(model)
    assert isinstance(q.encoder.layers[0].value, Wrapped) and type(q.encoder.layers[0].value.inner) is nn.Linear
    assert isinstance(q.encoder.layers[0].query, Int8Linear)
    ids = torch.randint(0, 50, (2, 6))
    with torch.inference_mode():
        assert q(ids).last_hidden_state.shape == (2, 6, 16)


def test_dtype_names():
    assert check_dtype("fp32") == "float32" and check_dtype("int8") == "int8"
    with pytest.raises(ConfigError, match="dtype: unknown 'int4'; expected one of float32, int8"):
        check_dtype("int4")
    model = EncoderModel(TransformerConfig(vocab_size=20, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=8,
                                       max_position_embeddings=8))
    assert with_dtype(model, "float32") is model
    assert is_quantized(with_dtype(model, "int8"))
    with pytest.raises(ConfigError, match="quantize needs a Pretrained, EncoderModel or Encoder"):
        quantize(nn.Linear(2, 2))


def test_embed_cli_int8(minilm_path, minilm_int8, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "int8.npy"
    assert main(["embed", "--model", str(minilm_path), "--input", str(source), "--output", str(out), "--quiet",
                 "--dtype", "int8"]) == 0
    np.testing.assert_allclose(np.load(out), embed(minilm_int8, TEXTS, levels=("sentence",)).sentences, atol=1e-6)


def test_embed_cli_bad_dtype(minilm_path, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("a text\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        main(["embed", "--model", str(minilm_path), "--input", str(source), "--output", str(tmp_path / "o.npy"),
              "--dtype", "int4"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'int4'" in capsys.readouterr().err
    assert not (tmp_path / "o.npy").exists()


def test_predict_cli_int8_agrees_with_float32(tmp_path, capsys):
    from bertology.tasks.base import get_task
    from finetune_helpers import save_tiny_model

    words = ["good", "bad", "film", "plot", "great", "dull", "the", "was", "a", "very"]
    base = save_tiny_model(tmp_path / "base", words * 5)
    pretrained = load(base)
    heads = get_task("sst2").heads(pretrained.config)
    model = EncoderModel(pretrained.config, heads)
    model.init_weights(torch.Generator().manual_seed(3))
    Pretrained(model.eval(), pretrained.tokenizer).save(tmp_path / "model")
    g = torch.Generator().manual_seed(0)
    rows = [" ".join(words[int(i)] for i in torch.randint(0, len(words), (6,), generator=g)) for _ in range(40)]
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\n" + "".join(f"{r}\t{n % 2}\n" for n, r in enumerate(rows)), encoding="utf-8")
    outputs = {}
    for dtype in ("float32", "int8"):
        outputs[dtype] = tmp_path / f"{dtype}.tsv"
        assert main(["predict", "--task", "sst2", "--model", str(tmp_path / "model"), "--input", str(dev),
                     "--output", str(outputs[dtype]), "--dtype", dtype]) == 0
    fp32, int8 = (outputs[d].read_text().splitlines() for d in ("float32", "int8"))
    assert len(fp32) == len(int8) == 41
    assert sum(a == b for a, b in zip(fp32, int8)) >= 39  # a random head's near-ties may flip one


def test_a_quantized_model_is_not_saved(tmp_path):
    from bertology.errors import CheckpointError
    from bertology.model import save_model

    config = TransformerConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                           max_position_embeddings=16)
    model = EncoderModel(config)
    with pytest.raises(CheckpointError, match="int8-quantized model is for inference only"):
        save_model(quantize(model), tmp_path / "int8")
    assert not (tmp_path / "int8" / "model.safetensors").exists()  # nothing half-written
    save_model(model, tmp_path / "fp32")  # the float32 model it was made from still saves
