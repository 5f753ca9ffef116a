"""bertology.generate: greedy and beam search token for token equal to transformers' `generate` on the same random
GPT-2 and T5 models (weights copied by hand), sampling checked statistically, the key/value cache used, bad settings
refused naming the option."""

from __future__ import annotations

import math

import pytest
import torch
from transformer_helpers import gpt2_pair, t5_pair, tiny_config

from bertology import generate
from bertology.errors import ConfigError, InputError
from bertology.generation import Settings, filtered
from bertology.model import HeadSpec, Pretrained, register_head
from bertology.model.transformer import DecoderModel, Seq2SeqModel

PAD = 3  # not 0, which transformers' beam search replaces by the EOS id (tested on its own below)
NEW = 12


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def gpt2():
    """Sharp logits (a large initialisation), so that outputs vary and chosen EOS ids are reached."""
    torch.manual_seed(0)
    hf, ours = gpt2_pair(vocab_size=60, positions=40, bos_token_id=1, eos_token_id=2, pad_token_id=PAD,
                         initializer_range=0.3)
    ids = torch.randint(4, 60, (4, 6))
    mask = torch.ones_like(ids)
    mask[0, :2] = mask[2, :1] = 0  # left padding
    ids[mask == 0] = PAD
    free = hf.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=PAD)
    # EOS ids the rows reach at different steps: one id, then two
    eos_choices = [int(free[0, 8]), [int(free[1, 9]), int(free[3, 7])], None]
    return hf, ours, ids, mask, eos_choices


@pytest.fixture(scope="module", params=[False, True], ids=["t5-relu", "t5-gated"])
def t5(request):
    torch.manual_seed(1)
    hf, ours = t5_pair(request.param, vocab_size=40, pad_token_id=PAD, eos_token_id=1, decoder_start_token_id=0,
                       initializer_factor=3.0)
    src = torch.randint(4, 40, (3, 7))
    mask = torch.ones_like(src)
    mask[0, 5:] = 0  # encoder inputs padded on the right
    src[mask == 0] = PAD
    free = hf.generate(src, attention_mask=mask, max_new_tokens=NEW, do_sample=False)
    eos_choices = [int(free[0, 5]), [int(free[1, 4]), int(free[2, 6])], None]
    return hf, ours, src, mask, eos_choices


SEARCHES = [
    dict(),
    dict(num_beams=3),
    dict(num_beams=4, length_penalty=0.5),
    dict(num_beams=3, length_penalty=-1.0),
    dict(num_beams=3, early_stopping=True),
    dict(num_beams=2, early_stopping="never", length_penalty=2.0),
]


def search_id(options):
    return ",".join(f"{k}={v}" for k, v in options.items()) or "greedy"


@pytest.mark.parametrize("options", SEARCHES, ids=search_id)
def test_a_decoder_generates_transformers_tokens(gpt2, options):
    hf, ours, ids, mask, eos_choices = gpt2
    stopped = 0
    for eos in eos_choices:
        expected = hf.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=PAD,
                               eos_token_id=eos, **options)
        got = generate(ours, input_ids=ids, attention_mask=mask, max_new_tokens=NEW, pad_token_id=PAD,
                       eos_token_id=eos if eos is not None else [], **options)
        assert torch.equal(got, expected), (eos, got[:, ids.shape[1]:], expected[:, ids.shape[1]:])
        assert torch.equal(got[:, :ids.shape[1]], ids)  # the prompt, then the new tokens
        stopped += int((got[:, ids.shape[1]:] == PAD).any()) + int(got.shape[1] < ids.shape[1] + NEW)
    assert stopped or options.get("length_penalty", 1.0) > 1  # some row stopped at an EOS id (a length penalty
    # above 1 favours long beams): the comparison covered stopping, not only max length


@pytest.mark.parametrize("options", SEARCHES, ids=search_id)
def test_an_encoder_decoder_generates_transformers_tokens(t5, options):
    hf, ours, src, mask, eos_choices = t5
    stopped = 0
    for eos in eos_choices:
        expected = hf.generate(src, attention_mask=mask, max_new_tokens=NEW, do_sample=False, eos_token_id=eos,
                               **options)
        got = generate(ours, input_ids=src, attention_mask=mask, max_new_tokens=NEW,
                       eos_token_id=eos if eos is not None else [], **options)  # None: the config's; []: none
        assert torch.equal(got, expected), (eos, got, expected)
        assert (got[:, 0] == 0).all()  # the decoder's sequence, from decoder_start_token_id
        stopped += int((got == PAD).any()) + int(got.shape[1] < 1 + NEW)
    assert stopped or options.get("length_penalty", 1.0) > 1


def test_beams_of_a_model_whose_pad_id_is_0_are_padded_as_transformers_pads_them():
    torch.manual_seed(1)
    hf, ours = t5_pair(vocab_size=40, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, initializer_factor=3.0)
    src = torch.randint(4, 40, (3, 7))
    free = hf.generate(src, max_new_tokens=NEW, do_sample=False)
    padded = 0
    for eos in sorted(set(free[:, 1:].flatten().tolist())):
        expected = hf.generate(src, max_new_tokens=NEW, num_beams=3, eos_token_id=eos)
        assert torch.equal(generate(ours, input_ids=src, max_new_tokens=NEW, num_beams=3, eos_token_id=eos), expected)
        for row in expected[:, 1:].tolist():
            padded += eos in row[:-1] and all(token == eos for token in row[row.index(eos):])
    assert padded  # some row ended before others and was padded with the EOS id


def test_the_configs_eos_and_pad_are_the_defaults(t5):
    hf, ours, src, mask, _ = t5
    expected = hf.generate(src, attention_mask=mask, max_new_tokens=NEW, do_sample=False, num_beams=2)
    assert torch.equal(generate(Pretrained(ours, None), input_ids=src, attention_mask=mask, max_new_tokens=NEW,
                                num_beams=2), expected)


def test_the_cache_runs_the_encoder_once_and_one_token_per_step(t5, monkeypatch):
    _, ours, src, mask, _ = t5
    encoded, widths, logits_rows = [], [], []
    encode, forward = ours.encode, ours.forward

    def counting_encode(*args, **kwargs):
        encoded.append(1)
        return encode(*args, **kwargs)

    def recording_forward(*args, **kwargs):
        widths.append(kwargs["decoder_input_ids"].shape[1])
        assert kwargs["use_cache"] and kwargs["masked_positions"] is not None
        out = forward(*args, **kwargs)
        logits_rows.append(tuple(out.logits.shape))
        return out

    monkeypatch.setattr(ours, "encode", counting_encode)
    monkeypatch.setattr(ours, "forward", recording_forward)
    for beams in (1, 3):
        encoded.clear(), widths.clear(), logits_rows.clear()
        generate(ours, input_ids=src, attention_mask=mask, max_new_tokens=5, num_beams=beams, eos_token_id=[])
        assert encoded == [1] and widths == [1] * 5
        # logits at the last position only: [rows, vocab], the start token's step once per prompt
        assert logits_rows == [(3, 40)] + [(3 * beams, 40)] * 4


def test_a_decoders_prompt_runs_once_then_one_token_per_step(gpt2, monkeypatch):
    _, ours, ids, mask, _ = gpt2
    widths = []
    forward = ours.forward

    def recording_forward(input_ids, attention_mask=None, **kwargs):
        widths.append((input_ids.shape[1], attention_mask.shape[1]))
        return forward(input_ids, attention_mask, **kwargs)

    monkeypatch.setattr(ours, "forward", recording_forward)
    generate(ours, input_ids=ids, attention_mask=mask, max_new_tokens=4, num_beams=2, eos_token_id=[])
    assert widths == [(6, 6), (1, 7), (1, 8), (1, 9)]  # no forward after the last token


def test_generation_equals_the_full_forward_without_a_cache(gpt2):
    """Greedy by recomputing every position each step (no cache) gives the same tokens."""
    _, ours, ids, mask, _ = gpt2
    got = generate(ours, input_ids=ids, attention_mask=mask, max_new_tokens=6, eos_token_id=[])
    sequences, current_mask = ids, mask
    with torch.no_grad():
        for _ in range(6):
            token = ours(sequences, current_mask).logits[:, -1].argmax(-1)
            sequences = torch.cat([sequences, token[:, None]], 1)
            current_mask = torch.cat([current_mask, torch.ones_like(current_mask[:, :1])], 1)
    assert torch.equal(got, sequences)


# ---------------------------------------------------------------------------------------------------------------
# Sampling


def kept_by_definition(logits, temperature=1.0, top_k=None, top_p=None):
    """The tokens sampling may draw and their probabilities, from the definitions: the k most probable tokens, then
    the fewest most probable ones whose probability reaches top_p."""
    probs = (logits / temperature).softmax(-1)
    order = probs.argsort(descending=True).tolist()
    kept = order[:top_k] if top_k is not None else order
    if top_p is not None:
        mass = probs[kept] / probs[kept].sum()
        total, reach = 0.0, []
        for index, token in enumerate(kept):
            reach.append(token)
            total += float(mass[index])
            if total >= top_p:
                break
        kept = reach
    expected = torch.zeros_like(probs)
    expected[kept] = probs[kept] / probs[kept].sum()
    return set(kept), expected


SAMPLINGS = [dict(temperature=0.7), dict(top_k=5), dict(top_p=0.6), dict(top_k=10, top_p=0.8, temperature=1.3)]


@pytest.mark.parametrize("options", SAMPLINGS, ids=search_id)
def test_the_first_sampled_token_follows_the_filtered_softmax(gpt2, options):
    _, ours, ids, mask, _ = gpt2
    prompt = ids[1:2]
    with torch.no_grad():
        logits = ours(prompt).logits[0, -1]
    kept, expected = kept_by_definition(logits, **options)
    assert 1 < len(kept) < 60 or "temperature" in options and len(options) == 1
    draws = 20000
    rows = prompt.expand(draws, -1)
    first = generate(ours, input_ids=rows, max_new_tokens=1, do_sample=True, seed=7, eos_token_id=[],
                     **options)[:, -1]
    assert set(first.tolist()) <= kept  # never a token the filter removed
    frequency = torch.bincount(first, minlength=60).double() / draws
    sigma = (expected.double() * (1 - expected.double()) / draws).sqrt()
    assert ((frequency - expected.double()).abs() <= 5 * sigma + 1e-9).all(), (frequency, expected)
    # the summed deviation within twice its expectation, sum of sqrt(2 / pi) sigma
    assert (frequency - expected.double()).abs().sum() <= 2 * math.sqrt(2 / math.pi) * sigma.sum()


def test_the_filter_removes_what_transformers_warpers_remove():
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    scores = torch.randn(8, 50) * 3
    for temperature, top_k, top_p in ((1.0, 7, None), (0.5, None, 0.9), (2.0, 20, 0.3), (1.0, None, 0.05)):
        settings = Settings(max_new_tokens=1, num_beams=1, do_sample=True, temperature=temperature, top_k=top_k,
                            top_p=top_p, length_penalty=1.0, early_stopping=False, eos_token_ids=(), pad_token_id=0,
                            seed=None)
        expected = TemperatureLogitsWarper(temperature)(None, scores.clone())
        if top_k is not None:
            expected = TopKLogitsWarper(top_k)(None, expected)
        if top_p is not None:
            expected = TopPLogitsWarper(top_p)(None, expected)
        assert torch.equal(filtered(scores, settings), expected)


def test_the_same_seed_gives_the_same_sequences(gpt2, t5):
    for _, model, ids, mask, _ in (gpt2, t5):
        run = dict(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=True, top_k=20, eos_token_id=[])
        first = generate(model, seed=11, **run)
        assert torch.equal(generate(model, seed=11, **run), first)
        assert not torch.equal(generate(model, seed=12, **run), first)
        torch.manual_seed(5)  # no seed: torch's global generator
        unseeded = generate(model, **run)
        torch.manual_seed(5)
        assert torch.equal(generate(model, **run), unseeded)


def test_sampled_rows_stop_at_eos_and_are_padded(gpt2):
    _, ours, ids, mask, _ = gpt2
    run = dict(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=True, seed=3, pad_token_id=PAD)
    free = generate(ours, eos_token_id=[], **run)[:, ids.shape[1]:]
    eos = int(free[0, 0])  # row 0's first draw: with the same seed, row 0 says EOS at once
    new = generate(ours, eos_token_id=eos, **run)[:, ids.shape[1]:]
    assert (new[0, 1:] == PAD).all() and new[0, 0] == eos
    for row, unstopped in zip(new.tolist(), free.tolist()):
        end = row.index(eos) + 1 if eos in row else NEW
        assert row[:end] == unstopped[:end] and all(token == PAD for token in row[end:])


def test_the_model_runs_in_eval_mode_and_keeps_its_mode():
    model = DecoderModel(tiny_config(hidden_dropout=0.5, attention_dropout=0.5), [HeadSpec("lm", "tied_lm")])
    model.init_weights(torch.Generator().manual_seed(0))
    model.train()
    ids = torch.randint(1, 50, (2, 4))
    first = generate(model, input_ids=ids, max_new_tokens=5)
    assert model.training and torch.equal(generate(model, input_ids=ids, max_new_tokens=5), first)


# ---------------------------------------------------------------------------------------------------------------
# Bad input


@pytest.mark.parametrize("options,message", [
    (dict(num_beams=0), "num_beams must be an integer of at least 1, got 0"),
    (dict(max_new_tokens=0), "max_new_tokens must be an integer of at least 1, got 0"),
    (dict(max_new_tokens=2.5), "max_new_tokens must be an integer"),
    (dict(do_sample=True, top_p=1.5), r"top_p must lie in \(0, 1\], got 1.5"),
    (dict(do_sample=True, top_p=0.0), r"top_p must lie in \(0, 1\], got 0.0"),
    (dict(do_sample=True, top_k=0), "top_k must be an integer of at least 1"),
    (dict(do_sample=True, temperature=0.0), r"temperature must be a positive number when sampling .*got 0.0"),
    (dict(do_sample=True, temperature=-1.0), "temperature must be a positive number when sampling"),
    (dict(temperature=float("nan")), "temperature must be a positive number"),
    (dict(top_k=5), "top_k=5 applies to sampling only: add do_sample=True"),
    (dict(top_p=0.5), "top_p=0.5 applies to sampling only"),
    (dict(temperature=0.5), "temperature=0.5 applies to sampling only"),
    (dict(length_penalty=2.0), "length_penalty=2.0 applies to beam search only: set num_beams above 1"),
    (dict(early_stopping=True), "early_stopping=True applies to beam search only"),
    (dict(num_beams=2, early_stopping="sometimes"), "early_stopping must be False, True or 'never'"),
    (dict(num_beams=2, early_stopping=1), "early_stopping must be False, True or 'never', got 1"),
    (dict(num_beams=2, do_sample=True), "do_sample with num_beams=2"),
    (dict(eos_token_id=50), r"eos_token_id 50 is outside the model's vocabulary \[0, 50\)"),
    (dict(eos_token_id=[2, -1]), "eos_token_id -1 is outside"),
    (dict(eos_token_id="2"), "eos_token_id must be a token id or a list of token ids"),
    (dict(pad_token_id=99), "pad_token_id 99 is outside"),
    (dict(do_sample=True, seed="7"), r"seed must be an integer in \[0, 2\*\*63\) or None"),
])
def test_bad_settings_are_errors_naming_the_option(options, message):
    model = DecoderModel(tiny_config(), [HeadSpec("lm", "tied_lm")])
    with pytest.raises(ConfigError, match=message):
        generate(model, input_ids=torch.tensor([[4, 5, 6]]), **options)


def test_prompts_and_positions():
    decoder = DecoderModel(tiny_config(max_position_embeddings=8), [HeadSpec("lm", "tied_lm")])
    with pytest.raises(ConfigError, match="input_ids: a prompt of 9 tokens is longer than the model's 8 positions"):
        generate(decoder, input_ids=torch.ones(1, 9, dtype=torch.long))
    with pytest.raises(ConfigError, match=r"max_new_tokens: 6 prompt token\(s\) \+ 3 new tokens exceed the model's 8"):
        generate(decoder, input_ids=torch.ones(1, 6, dtype=torch.long), max_new_tokens=3)
    assert generate(decoder, input_ids=torch.ones(1, 6, dtype=torch.long), max_new_tokens=2).shape == (1, 8)
    with pytest.raises(InputError, match="attention_mask: prompt row 1 ends with padding; pad a decoder's prompts on "
                                         "the left"):
        generate(decoder, input_ids=torch.ones(2, 3, dtype=torch.long), max_new_tokens=2,
                 attention_mask=torch.tensor([[1, 1, 1], [1, 1, 0]]))
    with pytest.raises(InputError, match=r"attention_mask has shape \(1, 2\); input_ids \(1, 3\)"):
        generate(decoder, input_ids=torch.ones(1, 3, dtype=torch.long), attention_mask=torch.ones(1, 2))
    with pytest.raises(InputError, match="input_ids must be a non-empty"):
        generate(decoder, input_ids=torch.ones(3, dtype=torch.long))
    with pytest.raises(InputError, match=r"input_ids must lie in \[0, 50\)"):
        generate(decoder, input_ids=torch.tensor([[4, 50]]), max_new_tokens=2)
    # an encoder-decoder with learned positions (BART-like): the encoder's input and the decoder's length
    seq2seq = Seq2SeqModel(tiny_config(max_position_embeddings=8), [HeadSpec("lm", "tied_lm")])
    with pytest.raises(ConfigError, match="input_ids: a prompt of 9 tokens is longer"):
        generate(seq2seq, input_ids=torch.ones(1, 9, dtype=torch.long))
    with pytest.raises(ConfigError, match=r"max_new_tokens: 1 start token\(s\) \+ 8 new tokens exceed"):
        generate(seq2seq, input_ids=torch.ones(1, 8, dtype=torch.long), max_new_tokens=8)
    assert generate(seq2seq, input_ids=torch.ones(1, 8, dtype=torch.long), max_new_tokens=7).shape == (1, 8)


def test_models_that_cannot_generate_say_why():
    from bertology.model import EncoderModel, preset

    with pytest.raises(ConfigError, match="generation needs a model that generates text through a key/value "
                                          "cache \\(capability 'generates'\\); the model \\(EncoderModel, registered "
                                          "as 'encoder'\\) does not declare it"):
        generate(EncoderModel(preset("tiny", vocab_size=50)), input_ids=torch.ones(1, 3, dtype=torch.long))
    classifier = DecoderModel(tiny_config(), [HeadSpec("cls", "mean_pooled", num_labels=2)])
    with pytest.raises(ConfigError, match="needs a language-model head .* its first head: 'cls' of kind 'mean_pooled'"):
        generate(classifier, input_ids=torch.ones(1, 3, dtype=torch.long))
    with pytest.raises(ConfigError, match="its first head: none"):
        generate(DecoderModel(tiny_config()), input_ids=torch.ones(1, 3, dtype=torch.long))

    class PositionScores(torch.nn.Module):  # reads where it is told, but three scores, not the vocabulary
        def __init__(self, config, spec):
            super().__init__()
            self.out = torch.nn.Linear(config.hidden_size, 3)

        def forward(self, inputs):
            at = inputs.masked_positions
            return self.out(inputs.hidden[at[:, 0], at[:, 1]])

    register_head("test_position_scores", PositionScores, reads="masked_positions")
    scorer = DecoderModel(tiny_config(), [HeadSpec("scores", "test_position_scores")])
    with pytest.raises(ConfigError, match=r"logits over the vocabulary .* 'scores' gave shape \(1, 3\)"):
        generate(scorer, input_ids=torch.ones(1, 3, dtype=torch.long))
    no_start = Seq2SeqModel(tiny_config(decoder_start_token_id=None, positions="relative"), [HeadSpec("lm", "tied_lm")])
    with pytest.raises(ConfigError, match="decoder_start_token_id is not set"):
        generate(no_start, input_ids=torch.ones(1, 3, dtype=torch.long))


@pytest.mark.parametrize("options", [dict(num_beams=3, num_return_sequences=3),
                                     dict(num_beams=4, num_return_sequences=2, length_penalty=0.5),
                                     dict(num_beams=3, num_return_sequences=2, early_stopping=True)],
                         ids=search_id)
def test_several_beams_per_prompt_are_transformers_num_return_sequences(t5, options):
    hf, ours, src, mask, eos_choices = t5
    for eos in eos_choices:
        expected = hf.generate(src, attention_mask=mask, max_new_tokens=NEW, do_sample=False, eos_token_id=eos,
                               **options)
        got = generate(ours, input_ids=src, attention_mask=mask, max_new_tokens=NEW,
                       eos_token_id=eos if eos is not None else [], **options)
        assert got.shape[0] == src.shape[0] * options["num_return_sequences"]
        assert torch.equal(got, expected), (eos, got, expected)


def test_a_decoder_returns_several_beams_per_prompt_as_transformers_does(gpt2):
    hf, ours, ids, mask, eos_choices = gpt2
    for eos in eos_choices:
        expected = hf.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=PAD,
                               eos_token_id=eos, num_beams=3, num_return_sequences=2)
        got = generate(ours, input_ids=ids, attention_mask=mask, max_new_tokens=NEW, pad_token_id=PAD,
                       eos_token_id=eos if eos is not None else [], num_beams=3, num_return_sequences=2)
        assert got.shape[0] == 2 * ids.shape[0] and torch.equal(got, expected), (eos, got, expected)


@pytest.mark.parametrize("options", [dict(num_return_sequences=2), dict(num_beams=2, num_return_sequences=3),
                                     dict(num_return_sequences=2, do_sample=True), dict(num_return_sequences=0)],
                         ids=search_id)
def test_more_sequences_than_beams_are_refused_naming_the_option(t5, options):
    _, ours, src, mask, _ = t5
    with pytest.raises(ConfigError, match="num_return_sequences"):
        generate(ours, input_ids=src, attention_mask=mask, max_new_tokens=NEW, **options)
