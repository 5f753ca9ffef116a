"""Numbers given on the command line that no machine could honour are refused at once with a one-line error
naming the option: a Longformer of 10**8 positions, a seed of 2**70, zero windows a forward; so is a model of the
wrong kind for the command (an ELMo given to `longformer convert` or `longformer mlm-loss`)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/finetune_helpers.py

from finetune_helpers import save_tiny_model  # noqa: E402

from bertology.cli.main import main  # noqa: E402
from bertology.errors import ConfigError  # noqa: E402
from bertology.model import EncoderModel, HeadSpec, Pretrained, load  # noqa: E402
from bertology.model.elmo import ElmoModel, tiny_config  # noqa: E402
from bertology.model.elmo_format import write_elmo  # noqa: E402
from bertology.model.longformer import MAX_LENGTH, longformer_from  # noqa: E402
from bertology.recipes.long_mlm import long_document_mlm_loss, mask_documents  # noqa: E402
from bertology.tokenization.words import SPECIALS  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = "the cat sat on the mat and a dog ran in the park".split()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("bounds")
    torch.manual_seed(0)
    base = load(save_tiny_model(root / "base", WORDS, vocab_size=50))
    model = EncoderModel(base.model.config, [HeadSpec("mlm", "masked_lm")])
    model.init_weights(torch.Generator().manual_seed(1))
    Pretrained(model, base.tokenizer).save(root / "mlm")
    words = [*SPECIALS, *sorted(set(WORDS))]
    elmo = ElmoModel(tiny_config(vocab_size=len(words), projection_dim=8, cell_size=16, filters=[[1, 4], [2, 4]]),
                     [HeadSpec("lm", "tied_lm_bias")])
    write_elmo(elmo, root / "elmo", words)
    text = root / "text.txt"
    text.write_text(" ".join(WORDS * 20), encoding="utf-8")
    return root


def refused(argv, capsys, match):
    start = time.perf_counter()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err  # one line, no traceback
    assert match in err, err
    assert time.perf_counter() - start < 20  # nothing of the asked size was made


def argparse_refused(argv, capsys, match):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert match in capsys.readouterr().err


def test_longformer_convert_refuses_a_length_past_its_bound_before_loading(models, tmp_path, capsys):
    refused(["longformer", "convert", "--model", str(models / "mlm"), "--max-length", "100000000", "--out",
             str(tmp_path / "lf")], capsys, f"max_length (--max-length) 100000000 is above the limit of {MAX_LENGTH}")
    assert not (tmp_path / "lf").exists()
    with pytest.raises(ConfigError, match=r"above the limit of 131072 tokens"):
        longformer_from(load(models / "mlm").model, MAX_LENGTH + 1, 8)


def test_longformer_convert_from_an_elmo_model_names_the_family(models, tmp_path, capsys):
    refused(["longformer", "convert", "--model", str(models / "elmo"), "--out", str(tmp_path / "lf")], capsys,
            "a Longformer is made from a bert, roberta, xlm-roberta encoder, got 'elmo'")


def test_mlm_loss_refuses_zero_windows_a_forward_an_elmo_model_and_a_huge_seed(models, capsys):
    text = str(models / "text.txt")
    argparse_refused(["longformer", "mlm-loss", "--model", str(models / "mlm"), "--text", text, "--batch-size", "0"],
                     capsys, "argument --batch-size: must be at least 1, got 0")
    argparse_refused(["longformer", "mlm-loss", "--model", str(models / "mlm"), "--text", text, "--seed",
                      str(2**70)], capsys, "argument --seed: a seed must lie in [0, 2**63)")
    refused(["longformer", "mlm-loss", "--model", str(models / "elmo"), "--text", text], capsys,
            "a elmo model without a masked-LM head ('mlm')")
    pretrained = load(models / "mlm")  # the Python API's own checks
    documents = mask_documents(pretrained.tokenizer, [" ".join(WORDS * 5)], 16, seed=0)
    with pytest.raises(ConfigError, match=r"batch_size: expected a positive number of windows per forward, got 0"):
        long_document_mlm_loss(pretrained, documents, batch_size=0)
    with pytest.raises(ConfigError, match=r"seed \(--seed\): must be an integer in \[0, 2\*\*63\)"):
        mask_documents(pretrained.tokenizer, [" ".join(WORDS * 5)], 16, seed=2**70)


@pytest.mark.parametrize("argv", [
    ["generate", "--model", "M", "--text", "a", "--seed", str(2**70)],
    ["quickstart", "--out", "O", "--seed", str(2**70)],
    ["probe", "--seed", str(-1)],
    ["data", "prepare", "corpus.txt", "--seed", str(2**64)],
])
def test_every_seed_option_refuses_values_past_64_bits(argv, capsys):
    argparse_refused(argv, capsys, "argument --seed: a seed must lie in [0, 2**63)")
