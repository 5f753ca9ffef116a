"""Bad input to generation and fill-mask that the other tests leave out: a prompt longer than the model's positions
on the command line, generation settings out of range on an encoder-decoder, fill-mask with a tokenizer that has no
mask token (library and service), a BART text longer than its positions: each a clear error naming the option."""

from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient
from finetune_helpers import family_tokenizer, save_family_model

from bertology import generate
from bertology.cli.main import main
from bertology.errors import BertologyError, ConfigError, TokenizerError
from bertology.model import EncoderModel, HeadSpec, Pretrained, load, preset
from bertology.objectives import fill_mask
from bertology.serve import create_app

pytest.importorskip("transformers")

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "the old book by the window"] * 4


@pytest.fixture(scope="module")
def directories(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield {style: save_family_model(tmp_path_factory.mktemp(style), style, TEXTS, positions=32)
           for style in ("gpt2", "t5", "bart")}
    torch.set_num_threads(threads)


def test_a_prompt_longer_than_the_positions_is_one_line_on_the_command_line(directories, capsys):
    long = " ".join(["the cat sat on the mat"] * 10)
    assert main(["generate", "--model", str(directories["gpt2"]), long]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "input_ids: a prompt of" in err and "longer than the model's 32 positions" in err


@pytest.mark.parametrize("options, message", [
    (dict(num_beams=0), "num_beams must be an integer of at least 1, got 0"),
    (dict(do_sample=True, top_p=1.01), r"top_p must lie in \(0, 1\], got 1.01"),
    (dict(do_sample=True, temperature=0), "temperature must be a positive number when sampling"),
    (dict(max_new_tokens=0), "max_new_tokens must be an integer of at least 1, got 0"),
])
def test_settings_out_of_range_on_an_encoder_decoder_name_the_option(directories, options, message):
    t5 = load(directories["t5"])
    with pytest.raises(ConfigError, match=message):
        generate(t5, input_ids=torch.tensor([t5.tokenizer.encode("the cat").ids]), **options)


def test_fill_mask_with_a_tokenizer_without_a_mask_token(tmp_path):
    tokenizer = family_tokenizer("gpt2", TEXTS)  # GPT-2's vocabulary has no mask token
    config = preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=1, hidden_size=16, num_heads=2,
                    intermediate_size=32, max_position_embeddings=64, pooler=False)
    model = EncoderModel(config, [HeadSpec("mlm", "masked_lm")])
    model.init_weights(torch.Generator().manual_seed(0))
    with pytest.raises(TokenizerError, match=r"no mask token \(gpt2 framing\)"):
        fill_mask(model, tokenizer, "the cat sat")
    tokenizer.model_max_length = 64
    with TestClient(create_app(Pretrained(model, tokenizer))) as client:
        response = client.post("/v1/fill-mask", json={"texts": ["the cat sat"]})
    assert response.status_code == 422 and response.json()["field"] == "texts[0]"
    assert "no mask token (gpt2 framing)" in response.json()["detail"]


def test_a_bart_text_longer_than_its_positions_is_named(directories):
    bart = load(directories["bart"])
    bart.tokenizer.model_max_length = 32
    long = " ".join(["the cat <mask> on the mat"] * 8)
    with pytest.raises(BertologyError, match="tokens long; the model takes at most 32"):
        fill_mask(bart.model, bart.tokenizer, long)
    with TestClient(create_app(bart)) as client:
        response = client.post("/v1/fill-mask", json={"texts": ["a <mask>", long]})
    assert response.status_code == 422 and response.json()["field"] == "texts[1]"
    assert "the model takes at most 32" in response.json()["detail"]
