"""ELMo: characters, the character CNN + biLSTM, its three layers, the fused and the exact LSTM paths, carried state,
heads and the scalar mix, the native format."""

from __future__ import annotations

import warnings

import pytest
import torch

import bertology
from bertology.errors import ConfigError, InputError
from bertology.model import HeadSpec, save_model
from bertology.model.elmo import (
    CharacterMapper,
    ElmoConfig,
    ElmoModel,
    ElmoState,
    batch_to_ids,
    tiny_config,
    word_to_char_ids,
)
from bertology.model.protocol import PRUNES_HEADS, Model, require
from numerics import assert_as_accurate, assert_within_scale, float64

SENTENCES = [["The", "cat", "sat", "."], ["Über", "naïve", "tests"], ["a"]]


def model(std: float = 0.3, heads=(HeadSpec("lm", "tied_lm_bias"),), **overrides) -> ElmoModel:
    torch.manual_seed(0)
    built = ElmoModel(tiny_config(vocab_size=40, dropout=0.0, **overrides), heads)
    built.init_weights(torch.Generator().manual_seed(1))
    with torch.no_grad():  # larger weights than the initialisation's, so that every nonlinearity and clip matters
        for name, parameter in built.named_parameters():
            if "weight" in name:
                parameter.normal_(0.0, std, generator=torch.Generator().manual_seed(len(name)))
    return built.eval()


def test_character_ids_follow_the_released_convention():
    ids = word_to_char_ids("ab")
    assert len(ids) == 50
    assert ids[:4] == [259, 98, 99, 260] and set(ids[4:]) == {261}  # begin, bytes, end, padding; all + 1
    assert word_to_char_ids("<S>")[:3] == [259, 257, 260] and word_to_char_ids("</S>")[:3] == [259, 258, 260]
    assert word_to_char_ids("é")[1:3] == [0xC3 + 1, 0xA9 + 1]  # UTF-8 bytes
    chars, mask = batch_to_ids(SENTENCES)
    assert chars.shape == (3, 6, 50) and mask.tolist()[2] == [1, 1, 1, 0, 0, 0]
    assert chars[2, 3:].eq(0).all()  # padded words are all 0


def test_long_words_are_truncated_with_one_warning():
    mapper = CharacterMapper(10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        long = mapper.word("x" * 30)
        mapper.word("y" * 30)
    assert len(caught) == 1 and "truncated" in str(caught[0].message)
    assert long == [259] + [ord("x") + 1] * 8 + [260]


def test_characters_outside_the_byte_range_are_refused():
    with pytest.raises(InputError, match="has no UTF-8 bytes"):
        word_to_char_ids("ok\ud800")
    elmo = model()
    chars, mask = batch_to_ids(SENTENCES)
    chars[0, 1, 3] = 262
    with pytest.raises(InputError, match=r"character ids\) must lie in \[0, 262\)"):
        elmo(chars, mask)
    with pytest.raises(InputError, match=r"\[batch, words, 50\]"):
        elmo(chars[..., :20], mask)


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="filters"):
        ElmoConfig(filters=[[60, 4]])
    with pytest.raises(ConfigError, match="cell_clip"):
        ElmoConfig(cell_clip=-1.0)
    with pytest.raises(ConfigError, match="unknown elmo config key"):
        ElmoConfig.from_dict({"cells": 3})


def test_three_layers_token_layer_twice_then_each_bilstm_layer():
    elmo = model()
    chars, mask = batch_to_ids(SENTENCES)
    with torch.no_grad():
        out = elmo(chars, mask, output_hidden_states=True)
        states = elmo.layer_states(chars, mask)
    assert len(states) == 3 and all(s.shape == (3, 6, 128) for s in states)
    assert torch.equal(states[0][..., :64], states[0][..., 64:])
    assert torch.equal(out.last_hidden_state, states[2])
    assert torch.equal(states[2][..., :64], out.forward_top) and torch.equal(states[2][..., 64:], out.backward_top)
    assert states[1][mask == 0].eq(0).all()
    # Each row alone (no padding) gives the same vectors: padding and batch neighbours change nothing. Another batch
    # shape, other kernels: float32 lies up to ~1.3e-4 from float64 on the top layer (values up to 6), so the identity
    # is checked in float64 (~1e-12 expected; a neighbour leaking in moves vectors by ~1), float32 as accurate as it.
    double = float64(elmo)
    with torch.no_grad():
        states64 = double.layer_states(chars, mask)
    for row, sentence in enumerate(SENTENCES):
        alone, alone_mask = batch_to_ids([sentence])
        with torch.no_grad():
            single, single64 = elmo.layer_states(alone, alone_mask), double.layer_states(alone, alone_mask)
        n = alone.shape[1]
        for layer in range(3):
            torch.testing.assert_close(single64[layer][0], states64[layer][row, :n], atol=1e-9, rtol=0)
            assert_as_accurate(single[layer][0], states[layer][row, :n], states64[layer][row, :n], what=str(layer))
    assert isinstance(elmo, Model)
    with pytest.raises(ConfigError, match="head pruning needs a model that prunes attention heads \\(capability "
                                          "'prunes-heads'\\); the model \\(ElmoModel, registered as 'elmo'\\) "
                                          "does not declare it"):
        require(elmo, PRUNES_HEADS, "head pruning")


def test_forward_is_causal_and_backward_anticausal():
    elmo = model()
    chars, mask = batch_to_ids([["one", "two", "three", "four"]])
    changed = chars.clone()
    changed[0, 3] = torch.tensor(word_to_char_ids("other"))  # the word at position 3 (after <S>: "three")
    with torch.no_grad():
        a, b = elmo(chars, mask), elmo(changed, mask)
    assert torch.equal(a.forward_top[0, :3], b.forward_top[0, :3])  # the forward LM has not read it yet
    assert not torch.allclose(a.forward_top[0, 3], b.forward_top[0, 3])
    assert torch.equal(a.backward_top[0, 4:], b.backward_top[0, 4:])  # nor has the backward LM, from the right
    assert not torch.allclose(a.backward_top[0, 3], b.backward_top[0, 3])


def test_fused_lstm_equals_the_step_loop_without_clipping():
    elmo = model(cell_clip=None, proj_clip=None)
    assert all(layer.fused for layer in elmo.forward_layers)
    chars, mask = batch_to_ids(SENTENCES)

    def both(elmo):
        with torch.no_grad():
            fused = elmo(chars, mask, output_hidden_states=True)
            for layer in (*elmo.forward_layers, *elmo.backward_layers):
                layer.fused = False
            return fused, elmo(chars, mask, output_hidden_states=True)

    # Two orders of summation over states that reach about 10: float32 lies up to ~1.1e-4 from float64, on either
    # path, so the identity is checked in float64 (~1e-12 expected), and the fused float32 path is as accurate as
    # the loop's.
    fused, loop = both(elmo)
    fused64, loop64 = both(float64(model(cell_clip=None, proj_clip=None)))
    pairs = [*zip(fused.hidden_states, loop.hidden_states, loop64.hidden_states),
             (fused.state.h, loop.state.h, loop64.state.h), (fused.state.c, loop.state.c, loop64.state.c)]
    pairs64 = [*zip(fused64.hidden_states, loop64.hidden_states), (fused64.state.h, loop64.state.h),
               (fused64.state.c, loop64.state.c)]
    for a, b in pairs64:
        torch.testing.assert_close(a, b, atol=1e-9, rtol=0)
    for a, b, reference in pairs:
        assert_as_accurate(a, b, reference)


def test_clipping_bounds_the_cell_and_the_projection():
    clipped = model(std=1.5, cell_clip=0.5, proj_clip=0.25)
    assert not any(layer.fused for layer in clipped.forward_layers)
    free = model(std=1.5, cell_clip=None, proj_clip=None)
    chars, mask = batch_to_ids(SENTENCES)
    with torch.no_grad():
        out, unclipped = clipped(chars, mask), free(chars, mask)
    assert out.state.c.abs().max() <= 0.5 and unclipped.state.c.abs().max() > 0.5
    assert out.state.h.abs().max() <= 0.25
    with pytest.raises(ConfigError, match="cannot clip"):
        clipped.forward_layers[0].fused = True
        clipped(chars, mask)


@pytest.mark.parametrize("clip", [None, 3.0])
def test_state_carried_across_windows_equals_one_pass(clip):
    """Truncated backpropagation's windows: the forward LM reads the document in order, the backward LM from its end,
    each starting from the state the previous window left; together they equal one pass over the whole."""
    words = "a b c d e f g h".split()
    chars, mask = batch_to_ids([words], boundaries=False)

    def windows(elmo):
        with torch.no_grad():
            whole = elmo(chars, mask)
            first = elmo(chars[:, :4], backward_input_ids=chars[:, 4:])
            second = elmo(chars[:, 4:], backward_input_ids=chars[:, :4], state=first.state)
        return (whole, first, second, torch.cat([first.forward_top, second.forward_top], 1),
                torch.cat([second.backward_top, first.backward_top], 1))

    # Windows of 4 words against one of 8: other shapes, other kernels; float32 lies ~1e-4 from float64 at these
    # weights, so the identity is checked in float64 (~1e-12 expected), float32 as accurate as the one pass.
    whole, first, second, forward, backward = windows(model(cell_clip=clip, proj_clip=clip))
    whole64, _, _, forward64, backward64 = windows(float64(model(cell_clip=clip, proj_clip=clip)))
    torch.testing.assert_close(forward64, whole64.forward_top, atol=1e-9, rtol=0)
    torch.testing.assert_close(backward64, whole64.backward_top, atol=1e-9, rtol=0)
    assert_as_accurate(forward, whole.forward_top, whole64.forward_top, what="forward")
    assert_as_accurate(backward, whole.backward_top, whole64.backward_top, what="backward")
    assert isinstance(second.state, ElmoState) and second.state.h.shape == (4, 1, 64)


def test_heads_scalar_mix_and_native_format(tmp_path):
    elmo = model(heads=(HeadSpec("lm", "tied_lm_bias"), HeadSpec("tags", "token", num_labels=5)))
    mix = elmo.add_extension("mix", "scalar_mix")
    with torch.no_grad():
        mix.scalars.copy_(torch.tensor([0.5, -1.0, 2.0]))
    chars, mask = batch_to_ids(SENTENCES)
    with torch.no_grad():
        out = elmo(chars, mask, output_hidden_states=True)
    weights = torch.tensor([0.5, -1.0, 2.0]).softmax(0)
    expected = sum(w * h for w, h in zip(weights, out.hidden_states))
    torch.testing.assert_close(out.last_hidden_state, expected)
    assert out.logits.shape == (3, 6, 5) and "lm" not in out.head_logits
    assert elmo.lm_logits(out.forward_top).shape == (3, 6, 40)
    save_model(elmo, tmp_path / "elmo")
    loaded = bertology.load(tmp_path / "elmo").model
    assert isinstance(loaded, ElmoModel) and loaded.config == elmo.config
    with torch.no_grad():
        again = loaded(chars, mask)
    assert torch.equal(again.logits, out.logits)


@pytest.mark.parametrize("lengths1, lengths2", [([5, 2, 0], [5, 5, 3]), ([2, 5, 0], [1, 4, 3]), ([0, 3, 0], [0, 2, 0])])
def test_both_directions_stepped_together_equal_each_alone(lengths1, lengths2):
    """Rows in any order of length (taken longest first inside), directions of different lengths, rows without
    words: outputs, final states and every gradient."""
    from bertology.model.elmo import ProjectedLSTM, paired_loop

    torch.manual_seed(0)
    layers = [ProjectedLSTM(6, 10, 4, cell_clip=0.5, proj_clip=0.3) for _ in range(2)]
    for layer in layers:
        for parameter in layer.parameters():
            torch.nn.init.normal_(parameter, 0.0, 0.8)
    x1, x2 = torch.randn(3, 5, 6, requires_grad=True), torch.randn(3, 5, 6, requires_grad=True)
    lengths1, lengths2 = torch.tensor(lengths1), torch.tensor(lengths2)
    states = [(torch.randn(3, 4, requires_grad=True), torch.randn(3, 10, requires_grad=True)), None]
    weights = torch.randn(3, 5, 4)  # a loss that reads every output and state

    def loss(pairs):
        return sum((out * weights).sum() + h.sum() * 0.3 + c.sum() * 0.7 for out, (h, c) in pairs)

    together = paired_loop(*layers, x1, x2, lengths1, lengths2, *states)
    alone = [layer(x, lengths, state) for layer, x, lengths, state in zip(layers, (x1, x2), (lengths1, lengths2),
                                                                           states)]
    for (out, (h, c)), (out_alone, (h_alone, c_alone)) in zip(together, alone):
        torch.testing.assert_close(out, out_alone)
        torch.testing.assert_close(h, h_alone)
        torch.testing.assert_close(c, c_alone)
    assert torch.equal(together[0][1][0][2], states[0][0][2])  # a row without words keeps its state
    leaves = [x1, x2, *states[0], *(p for layer in layers for p in layer.parameters())]
    for a, b in zip(torch.autograd.grad(loss(together), leaves), torch.autograd.grad(loss(alone), leaves)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("clip", [None, 0.5])
def test_inference_equals_the_training_path(clip):
    """Without gradients (embed, frozen features) the character CNN runs once per distinct word and the clipped
    layers step both directions together: the same layers and state as with gradients. In float64: the two paths'
    batch shapes differ, and so do their kernels' rounding, which these std-1.5 weights amplify ~10^8-fold (float32
    is off float64 by up to 5 on outputs of 50, on any path); on 1e-16 that gain leaves ~1e-8, 10^2 below the bound."""
    elmo = float64(model(std=1.5, cell_clip=clip, proj_clip=None if clip is None else 0.25))
    chars, mask = batch_to_ids(SENTENCES + [["The", "cat", "The", "cat", "ran"]])
    with torch.no_grad():
        inference = elmo(chars, mask, output_hidden_states=True)
    with torch.enable_grad():
        training = elmo(chars, mask, output_hidden_states=True)
    for a, b in zip(inference.hidden_states, training.hidden_states):
        torch.testing.assert_close(a, b.detach(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(inference.state.h, training.state.h.detach(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(inference.state.c, training.state.c.detach(), atol=1e-6, rtol=1e-5)


def test_info_describes_an_elmo_model():
    from bertology.info import describe
    from bertology.model.checkpoint import Pretrained

    text = describe(Pretrained(model(), None)).format()
    assert "cell 256 -> projection 64, residual" in text and "softmax         40 words" in text
    assert "backward LSTM" in text and "none (no word vocabulary in the directory)" in text


def test_distinct_rows_index_each_rows_first_twin():
    from bertology.model.elmo import distinct_rows

    chars, mask = batch_to_ids([["a", "bb", "a", "c", "bb", "a"]], boundaries=False)
    rows = chars[0]
    first, inverse = distinct_rows(rows)
    assert len(first) == 3 and torch.equal(rows[first][inverse], rows)
    assert inverse[0] == inverse[2] == inverse[5] and inverse[1] == inverse[4] != inverse[3]


@pytest.mark.usefixtures("one_thread")
def test_token_layer_once_per_distinct_word_keeps_every_gradient():
    """The character CNN runs once per distinct word in training too: the token layer and the CNN's gradients equal
    running it on every word (a word's gradients from its occurrences summed)."""
    elmo = model(std=0.5).train()
    chars, mask = batch_to_ids([["the", "cat", "the", "the", "dog"], ["cat", "a", "the"]])
    weights = torch.randn(*chars.shape[:2], elmo.config.projection_dim, generator=torch.Generator().manual_seed(3))
    tokens = elmo.tokens(chars, mask)
    (tokens * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in elmo.characters.named_parameters()}
    elmo.zero_grad(set_to_none=True)
    real = mask.bool()
    each = torch.zeros_like(tokens)
    each[real] = elmo.characters(chars[real])
    (each * weights).sum().backward()
    # another batch of words, another kernel's order of sums: float32 rounding of the largest terms (float32 lies
    # ~5e-7 of the scale from float64 here), so relative to the scale
    assert_within_scale(tokens, each, 1e-5, "token layer")
    for name, parameter in elmo.characters.named_parameters():  # sums in another order: relative to the largest
        scale = parameter.grad.abs().max()
        assert (grads[name] - parameter.grad).abs().max() <= 1e-5 * scale, name


@pytest.mark.usefixtures("one_thread")
def test_backward_window_read_with_the_forward_one_equals_each_alone():
    """Truncated backpropagation: the forward and the backward window's words go through the CNN in one call; the
    outputs equal reading each window separately. The batch shapes differ, and so do the kernels and their rounding
    (which ones depends on the CPU); these std-0.5 weights amplify float32 rounding ~10^3-fold (each float32 read lies
    up to ~6e-4 from float64 on outputs of 6). So the identity is checked in float64 (the same ~10^3 gain on 1e-16
    gives ~1e-12; 1e-9 leaves a margin of 10^3, and a window read wrong moves outputs by ~1), and in float32 the read
    together is as close to float64 as each read alone."""
    chars, mask = batch_to_ids([["the", "cat", "sat"], ["a", "dog", "ran"]], boundaries=False)
    back, back_mask = batch_to_ids([["ran", "dog", "the"], ["sat", "the", "a"]], boundaries=False)

    def reads(elmo):
        with torch.no_grad():
            together = elmo(chars, mask, backward_input_ids=back, backward_attention_mask=back_mask)
            return together, elmo(back, back_mask), elmo(chars, mask)

    together, alone, first = reads(model(std=0.5))
    together64, alone64, first64 = reads(float64(model(std=0.5)))
    torch.testing.assert_close(together64.forward_top, first64.forward_top, atol=1e-9, rtol=0)
    torch.testing.assert_close(together64.backward_top, alone64.backward_top, atol=1e-9, rtol=0)
    # floored at the weights' ~10^3 gain: a read alone that happens to round well (1.2e-4 off float64 once in CI,
    # against 6.2e-4 for the read together) does not make the bound tighter than float32 allows here
    assert_as_accurate(together.forward_top, first.forward_top, first64.forward_top, what="forward", gain=1e3)
    assert_as_accurate(together.backward_top, alone.backward_top, alone64.backward_top, what="backward", gain=1e3)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("words", [["a", "cat", "sat"], ["tiny", "x" * 40, "of"], ["y" * 48, "z"]])
def test_character_cnn_reads_only_the_positions_it_needs(words):
    """On the CPU the character CNN cuts the padding past the longest word plus its widest filter: the same token
    vectors and gradients as reading all max_characters positions (every window of padding alone is alike)."""
    elmo = model(std=0.5).train()
    encoder = elmo.characters
    chars = torch.tensor([word_to_char_ids(w, elmo.config.max_characters_per_token) for w in words])
    out = encoder(chars)
    out.square().sum().backward()
    grads = {n: p.grad.clone() for n, p in encoder.named_parameters()}
    encoder.zero_grad(set_to_none=True)
    widest = encoder.widest
    encoder.widest = elmo.config.max_characters_per_token  # no cut: every position read
    try:
        full = encoder(chars)
        full.square().sum().backward()
    finally:
        encoder.widest = widest
    assert_within_scale(out, full, 1e-5, "cut CNN")  # relative to the scale, as the gradients below
    for name, parameter in encoder.named_parameters():
        assert (grads[name] - parameter.grad).abs().max() <= 1e-5 * parameter.grad.abs().max(), name
