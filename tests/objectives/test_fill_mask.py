"""fill-mask on a small model pretrained here (BERT style, [MASK]) and a RoBERTa-style one (<mask>)."""

from __future__ import annotations

import pytest
import torch

from bertology.cli.main import main
from bertology.errors import BertologyError, CheckpointError
from bertology.model import EncoderModel, HeadSpec, Pretrained, load, preset
from bertology.objectives import fill_mask
from bertology.tokenization import train_tokenizer

LINES = ["please turn your homework in today .", "please hand your homework in on time .",
         "turn the page and read the book .", "the teacher asked for the homework ."] * 20


@pytest.fixture(scope="module", params=["wordpiece", "bpe"])
def model_dir(request, tmp_path_factory):
    """A 1-layer model whose MLM head is trained for a few steps to predict the masked word of LINES."""
    kind = request.param
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest, and immune to a busy machine
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    directory = tmp_path_factory.mktemp(f"fill-mask-{kind}")
    tokenizer = train_tokenizer(iter(LINES), kind, 120 if kind == "wordpiece" else 300, show_progress=False,
                                min_frequency=1)
    family = "bert" if tokenizer.style == "bert" else "roberta"
    extra = {} if family == "bert" else {"positions_after_padding": True, "type_vocab_size": 1,
                                         "max_position_embeddings": 64 + tokenizer.pad_id + 1}
    config = preset("tiny", family=family, vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id,
                    num_layers=1, hidden_size=32, num_heads=2, intermediate_size=64,
                    **{"max_position_embeddings": 64, **extra})
    model = EncoderModel(config, [HeadSpec("mlm", "masked_lm")])
    model.init_weights(torch.Generator().manual_seed(0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batch = tokenizer.encode_batch(LINES[:4])
    target = tokenizer.encode(" homework")
    homework = [i for i in target.ids if i not in tokenizer.special_ids][0]
    positions = (batch.input_ids == homework).nonzero()
    masked = batch.input_ids.clone()
    masked[positions[:, 0], positions[:, 1]] = tokenizer.mask_id
    for _ in range(40):
        out = model(masked, batch.attention_mask, masked_positions=positions)
        loss = torch.nn.functional.cross_entropy(out.head_logits["mlm"], batch.input_ids[positions[:, 0],
                                                                                        positions[:, 1]])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    Pretrained(model.eval(), tokenizer).save(directory)
    return directory, tokenizer.mask_token, tokenizer.id_to_token(homework)


def test_fill_mask_predicts_the_trained_word(model_dir):
    directory, mask, word = model_dir
    pretrained = load(directory)
    results = fill_mask(pretrained.model, pretrained.tokenizer, f"please turn your {mask} in today .", top_k=3)
    assert len(results) == 1 and len(results[0]) == 3
    best = results[0][0]
    assert best.token == word and best.probability > 0.5
    assert "homework" in best.sequence and mask not in best.sequence
    probabilities = [p.probability for p in results[0]]
    assert probabilities == sorted(probabilities, reverse=True) and sum(probabilities) <= 1.0 + 1e-6
    two = fill_mask(pretrained.model, pretrained.tokenizer, f"{mask} turn your {mask} in .", top_k=2)
    assert len(two) == 2 and all(mask in p.sequence for p in two[0])  # the other mask stays


def test_fill_mask_cli(model_dir, capsys):
    directory, mask, word = model_dir
    assert main(["fill-mask", "--model", str(directory), f"please turn your {mask} in today .", "--top-k", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    probability, token, sequence = lines[0].split("\t")
    assert 0.5 < float(probability) <= 1.0 and token == word


def test_fill_mask_without_a_mask_token_is_an_error(model_dir, capsys):
    directory, mask, _ = model_dir
    assert main(["fill-mask", "--model", str(directory), "Please turn your homework in."]) == 2
    err = capsys.readouterr().err
    assert "no mask token in the input" in err and repr(mask) in err
    other = "<mask>" if mask == "[MASK]" else "[MASK]"
    pretrained = load(directory)
    with pytest.raises(BertologyError, match="no mask token"):
        fill_mask(pretrained.model, pretrained.tokenizer, f"Please turn your homework {other}.")


def test_fill_mask_needs_an_mlm_head(model_dir):
    directory, mask, _ = model_dir
    pretrained = load(directory)
    bare = EncoderModel(pretrained.model.config)
    with pytest.raises(CheckpointError, match="masked-LM head"):
        fill_mask(bare, pretrained.tokenizer, f"a {mask} .")


def test_fill_mask_length_limit_counts_the_position_offset():
    """A RoBERTa-style model numbers positions from pad_token_id + 1: its limit is that many below its table size."""
    tokenizer = train_tokenizer(iter(LINES), "bpe", 300, show_progress=False, min_frequency=1)
    text = f"please turn your {tokenizer.mask_token} in today ."
    length = len(tokenizer.encode(text).ids)

    def roberta(max_length: int) -> EncoderModel:
        config = preset("tiny", family="roberta", vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id,
                        positions_after_padding=True, type_vocab_size=1, num_layers=1, hidden_size=16, num_heads=2,
                        intermediate_size=32, max_position_embeddings=max_length + tokenizer.pad_id + 1)
        model = EncoderModel(config, [HeadSpec("mlm", "masked_lm")])
        model.init_weights(torch.Generator().manual_seed(0))
        return model

    assert roberta(length).encoder.max_length == roberta(length).config.max_length == length
    assert len(fill_mask(roberta(length), tokenizer, text, top_k=1)) == 1
    # One position short: the table still has more rows than the input has tokens, but not after the offset.
    short = roberta(length - 1)
    assert short.config.max_position_embeddings >= length
    with pytest.raises(BertologyError, match=f"the input is {length} tokens long; the model takes at most {length - 1}"):
        fill_mask(short, tokenizer, text)
