"""`bertology prompt` (bertology.tasks.prompting): a decoder's k-shot prompt token for token, the label score as
the next-token log-probability at the prompt's end, demonstrations drawn from train by seed (never dev), cloze
prompting of an encoder through the cloze task, contextual calibration on a hand example, the JSON result, and the
errors (too few training examples for --shots, a verbaliser word that is not one token)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertology.cli.main import main
from bertology.errors import ConfigError
from bertology.model import EncoderModel, Pretrained, load, preset
from bertology.model.encoder import HeadSpec
from bertology.tasks.examples import TextExample
from bertology.tasks.prompting import (PromptSetup, calibrate, decoder_prompt, decoder_scores, draw_demonstrations,
                                       parse_verbalizer, prompt_evaluate, prompt_task)
from bertology.tokenization import train_tokenizer
from finetune_helpers import save_family_model

pytestmark = pytest.mark.usefixtures("one_thread")

GOOD, BAD, FILL = ["good", "nice"], ["bad", "awful"], ["the", "film", "plot", "was", "very", "a"]


def sentence(rng, positive: bool) -> str:
    words = list(rng.choice(FILL, 3))
    words.insert(1, str(rng.choice(GOOD if positive else BAD)))
    return " ".join(words)


@pytest.fixture(scope="module")
def glue(tmp_path_factory):
    """SST-2: train sentences start with 'train', dev ones with 'dev', so a prompt shows where it drew from."""
    root = tmp_path_factory.mktemp("glue")
    rng = np.random.default_rng(0)
    (root / "SST-2").mkdir()
    for split, n in (("train", 20), ("dev", 10)):
        (root / "SST-2" / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(
            f"{split} {sentence(rng, i % 2 == 1)}\t{i % 2}\n" for i in range(n)), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def gpt2(glue, tmp_path_factory):
    texts = [line.split("\t")[0] + " It was good . It was bad ." for split in ("train", "dev")
             for line in (glue / "SST-2" / f"{split}.tsv").read_text().splitlines()[1:]]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield save_family_model(tmp_path_factory.mktemp("gpt2"), "gpt2", texts * 3, positions=128)
    torch.set_num_threads(threads)


def read(glue, split):
    setup = PromptSetup("sst2", "{text} It was [MASK] .", {"good": "1", "bad": "0"})
    return setup, setup.glue.read(setup.glue.path(str(glue), split))


def test_a_k_shot_prompt_token_for_token_and_the_score_at_its_end(glue, gpt2):
    setup, train = read(glue, "train")
    _, dev = read(glue, "dev")
    shown = draw_demonstrations(train, 3, seed=7)
    assert shown == draw_demonstrations(train, 3, seed=7) and shown != draw_demonstrations(train, 3, seed=8)
    assert all(d.text.startswith("train ") for d in shown) and len({d.id for d in shown}) == 3
    word = {"1": "good", "0": "bad"}
    expected = "".join(f"{d.text} It was {word[str(d.label)]} .\n" for d in shown) + f"{dev[0].text} It was"
    text, spaced = decoder_prompt(setup.template, setup.verbalizer, shown, dev[0].text, None)
    assert text == expected and spaced
    pretrained = load(gpt2)
    tokenizer, model = pretrained.tokenizer, pretrained.model.eval()
    label_ids = setup.label_token_ids(tokenizer, True, spaced)
    assert label_ids == [tokenizer.encode(" bad").ids[0], tokenizer.encode(" good").ids[0]]  # label order 0, 1
    # the score: log P(word | prompt) at the prompt's last token, whatever the padding of the batch
    other, _ = decoder_prompt(setup.template, setup.verbalizer, shown[:1], dev[1].text, None)
    scores = decoder_scores(model, tokenizer, [text, other], label_ids, batch_size=2)
    for row, prompt in enumerate([text, other]):
        ids = torch.tensor([tokenizer.encode(prompt).ids])
        with torch.no_grad():
            full = model(ids).logits[0, -1].double()
        assert np.allclose(scores[row], torch.log_softmax(full, -1)[label_ids].numpy(), rtol=0, atol=1e-5)


def test_contextual_calibration_on_a_hand_example():
    p = np.array([[0.7, 0.3], [0.6, 0.4], [0.9, 0.1]])
    content_free = np.array([0.8, 0.2])
    # W = diag(1 / p_cf): [0.875, 1.5] -> [0.875, 1.5] / 2.375; [0.75, 2.0] / 2.75; [1.125, 0.5] / 1.625
    expected = np.array([[0.875 / 2.375, 1.5 / 2.375], [0.75 / 2.75, 2.0 / 2.75], [1.125 / 1.625, 0.5 / 1.625]])
    q = calibrate(p, content_free)
    assert np.allclose(q, expected, rtol=0, atol=1e-15)
    assert q.argmax(1).tolist() == [1, 1, 0] and p.argmax(1).tolist() == [0, 0, 0]
    assert np.allclose(calibrate(p, np.array([0.5, 0.5])), p, rtol=0, atol=1e-15)  # uniform p_cf: no change


def test_calibration_uses_the_content_free_input_after_the_same_demonstrations(glue, gpt2):
    setup, train = read(glue, "train")
    _, dev = read(glue, "dev")
    pretrained = load(gpt2)
    model, tokenizer = pretrained.model.eval(), pretrained.tokenizer
    result = prompt_evaluate(model, tokenizer, setup, train, dev, shots=2, seeds=[5], calibrated=True)
    shown = draw_demonstrations(train, 2, 5)
    label_ids = setup.label_token_ids(tokenizer, True, True)
    prompts = [decoder_prompt(setup.template, setup.verbalizer, shown, e.text, None)[0] for e in dev]
    free = decoder_prompt(setup.template, setup.verbalizer, shown, "N/A", None)[0]
    scores = decoder_scores(model, tokenizer, [*prompts, free], label_ids)
    probabilities = np.exp(scores) / np.exp(scores).sum(1, keepdims=True)
    predicted = calibrate(probabilities[:-1], probabilities[-1]).argmax(1)
    accuracy = 100 * np.mean([str(p) == e.label for p, e in zip(predicted, dev)])
    assert result["per_seed"] == [{"seed": 5, "accuracy": pytest.approx(accuracy)}]
    assert result["accuracy"] == pytest.approx(accuracy) and result["accuracy_sd"] == 0.0


def test_the_command_prints_one_json_object_per_seed_mean_and_sd(glue, gpt2, capsys):
    assert main(["prompt", "--model", str(gpt2), "--task", "sst2", "--data", str(glue), "--shots", "2",
                 "--seeds", "0", "1", "2", "--calibrate", "--device", "cpu"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["kind"] == "decoder" and result["shots"] == 2 and result["calibrate"] is True
    values = [run["accuracy"] for run in result["per_seed"]]
    assert [run["seed"] for run in result["per_seed"]] == [0, 1, 2]
    assert result["accuracy"] == pytest.approx(np.mean(values))
    assert result["accuracy_sd"] == pytest.approx(np.std(values, ddof=1))
    assert main(["prompt", "--model", str(gpt2), "--task", "sst2", "--data", str(glue)]) == 0
    zero = json.loads(capsys.readouterr().out)
    assert zero["per_seed"][0]["seed"] is None and len(zero["per_seed"]) == 1 and zero["examples"] == 10


def test_fewer_training_examples_than_shots_is_an_error_naming_shots_and_the_file(glue, gpt2, capsys):
    assert main(["prompt", "--model", str(gpt2), "--task", "sst2", "--data", str(glue), "--shots", "21"]) == 2
    error = capsys.readouterr().err
    assert "--shots 21" in error and str(glue / "SST-2" / "train.tsv") in error and "only 20 examples" in error


def test_a_verbaliser_word_that_is_not_one_token_is_an_error_naming_it(glue, gpt2, capsys):
    assert main(["prompt", "--model", str(gpt2), "--task", "sst2", "--data", str(glue),
                 "--verbalizer", "good=1,abysmally=0"]) == 2
    assert "'abysmally' is not one token" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"'good' is not WORD=LABEL"):
        parse_verbalizer("good,bad=0")
    with pytest.raises(ConfigError, match=r"verbaliser labels \['2'\] are not sst2's labels"):
        PromptSetup("sst2", "{text} It was [MASK] .", {"good": "2", "bad": "0"})


def test_an_encoder_is_prompted_as_a_cloze_with_the_demonstrations_before_its_text(glue, tmp_path):
    words = [*GOOD, *BAD, *FILL, "train", "dev", "It", "was", "."]
    tokenizer = train_tokenizer(iter(words), "wordpiece", 80, show_progress=False, min_frequency=1)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=2, hidden_size=32, num_heads=2,
                    intermediate_size=64, max_position_embeddings=128)
    model = EncoderModel(config, [HeadSpec("mlm", "masked_lm")])
    model.init_weights(torch.Generator().manual_seed(0))
    Pretrained(model, tokenizer).save(tmp_path / "bert")
    result = prompt_task(tmp_path / "bert", "sst2", glue, shots=2, seeds=[3], calibrated=False)
    assert result["kind"] == "cloze"
    # by hand: the demonstrations' filled templates, then the example's, its mask the tokenizer's
    setup, train = read(glue, "train")
    _, dev = read(glue, "dev")
    shown = draw_demonstrations(train, 2, 3)
    word = {"1": "good", "0": "bad"}
    model = load(tmp_path / "bert").model.eval()
    label_ids = [tokenizer.token_to_id("bad"), tokenizer.token_to_id("good")]
    predictions = []
    for example in dev:
        text = "".join(f"{d.text} It was {word[str(d.label)]} . " for d in shown) + \
            f"{example.text} It was {tokenizer.mask_token} ."
        ids = tokenizer.encode(text).ids
        with torch.no_grad():
            logits = model(torch.tensor([ids]), masked_positions=torch.tensor([[0, ids.index(tokenizer.mask_id)]]))
        predictions.append(str(int(logits.head_logits["mlm"][0, label_ids].argmax())))
    accuracy = 100 * np.mean([p == e.label for p, e in zip(predictions, dev)])
    assert result["accuracy"] == pytest.approx(accuracy)


def test_a_model_that_is_neither_a_decoder_nor_a_masked_lm_is_refused(glue, tmp_path):
    tokenizer = train_tokenizer(iter([*GOOD, *BAD, *FILL]), "wordpiece", 60, show_progress=False, min_frequency=1)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=1, hidden_size=32, num_heads=2,
                    intermediate_size=64, max_position_embeddings=64)
    model = EncoderModel(config)
    model.init_weights(torch.Generator().manual_seed(0))
    setup, dev = read(glue, "dev")
    with pytest.raises(ConfigError, match="prompting needs a decoder .* or an encoder with a masked-LM head"):
        prompt_evaluate(model, tokenizer, setup, [], dev)
    with pytest.raises(ConfigError, match="--shots: must be >= 0"):
        prompt_evaluate(load_decoder_stub(), tokenizer, setup, [], dev, shots=-1)
    with pytest.raises(ConfigError, match="the dev split has no examples"):
        prompt_evaluate(load_decoder_stub(), tokenizer, setup, [TextExample("0", "x", None, "1")], [])


def load_decoder_stub():
    """Any decoder: the shots check comes before any forward."""
    from bertology.model import TransformerConfig
    from bertology.model.transformer import DecoderModel

    return DecoderModel(TransformerConfig.decoder(vocab_size=50, num_layers=1, hidden_size=16, num_heads=2,
                                                  intermediate_size=32, max_position_embeddings=16),
                        [HeadSpec("lm", "tied_lm")])
