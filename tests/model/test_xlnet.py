"""The xlnet checkpoint family: small random XLNet models of every supported architecture, built and saved by
transformers, load into an XLNetModel whose outputs equal transformers' within 1e-5 (left padding, segments, memory,
perm_mask with target_mapping, "uni" attention, bi_data, clamped distances); saved back by bertology, transformers
loads the same weights. Bad config.json values and inputs are clear errors naming the key."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from bertology.errors import CheckpointError, ConfigError, InputError  # noqa: E402
from bertology.model import load_model, save_model  # noqa: E402
from bertology.model.xlnet import XLNetConfig, XLNetModel, rel_shift  # noqa: E402

TOL = 1e-5
VOCAB, PAD = 53, 5
ARCHITECTURES = ["Model", "LMHeadModel", "ForSequenceClassification", "ForTokenClassification",
                 "ForQuestionAnsweringSimple"]
HEADS = {"Model": (), "LMHeadModel": ("lm",), "ForSequenceClassification": ("classifier",),
         "ForTokenClassification": ("token_classifier",), "ForQuestionAnsweringSimple": ("qa",)}


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


def xlnet_config(**overrides):
    values = dict(vocab_size=VOCAB, d_model=16, n_layer=2, n_head=2, d_inner=24, dropout=0.0, mem_len=6,
                  summary_last_dropout=0.0, num_labels=3, pad_token_id=PAD)
    values.update(overrides)
    return transformers.XLNetConfig(**values)


def saved(tmp_path, suffix: str, **overrides):
    if suffix == "ForQuestionAnsweringSimple":  # start and end logits
        overrides.setdefault("num_labels", 2)
    hf = getattr(transformers, f"XLNet{suffix}")(xlnet_config(**overrides)).eval()
    hf.save_pretrained(tmp_path / "hf")
    return hf, load_model(tmp_path / "hf").eval()


def left_padded(lengths=(9, 5, 9, 3)):
    """Rows of these lengths, padded on the left (XLNet's side) with PAD; segment 0, then 1 for the last 3 real
    tokens (the second text and <sep> <cls>)."""
    ids = torch.randint(6, VOCAB, (len(lengths), max(lengths)))
    mask = torch.zeros_like(ids)
    types = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        mask[row, mask.shape[1] - n:] = 1
        types[row, -3:] = 1
    return ids.masked_fill(mask == 0, PAD), mask, types


def close(got, expected):
    torch.testing.assert_close(got, expected, atol=TOL, rtol=TOL)


def permutation_inputs(batch: int, length: int, predict: int):
    """A random factorisation order per row, the last `predict` positions of it as targets: perm_mask (1 where
    query i may not see token j: j comes at or after i in the order, for targets) and target_mapping."""
    rank = torch.stack([torch.randperm(length) for _ in range(batch)])  # rank[b, j]: j's place in the order
    target = rank >= length - predict
    later_or_same = rank[:, None, :] >= rank[:, :, None]
    perm = (later_or_same & target[:, None, :]).float()
    positions = (~target).long().sort(dim=1, stable=True).indices[:, :predict]
    mapping = torch.nn.functional.one_hot(positions, length).float()
    return perm, mapping


@pytest.mark.parametrize("suffix", ARCHITECTURES)
def test_every_architecture_loads_with_transformers_outputs(tmp_path, suffix):
    hf, model = saved(tmp_path, suffix)
    assert isinstance(model, XLNetModel)
    assert tuple(spec.name for spec in model.head_specs) == HEADS[suffix]
    ids, mask, types = left_padded()
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
        out = model(ids, mask, token_type_ids=types, output_hidden_states=True)
    if suffix == "Model":
        close(out.last_hidden_state, expected.last_hidden_state)
        assert len(out.hidden_states) == len(expected.hidden_states) == 3
        for ours, theirs in zip(out.hidden_states, expected.hidden_states):
            close(ours, theirs)
    elif suffix == "ForQuestionAnsweringSimple":
        close(out.logits[..., 0], expected.start_logits)
        close(out.logits[..., 1], expected.end_logits)
    else:
        close(out.logits, expected.logits)
    if suffix == "ForSequenceClassification":
        assert out.logits.shape == (4, 3)
    for ours, theirs in zip(out.mems, expected.mems):
        close(ours, theirs)


@pytest.mark.parametrize("options", [{}, {"attn_type": "uni"}, {"bi_data": True}, {"clamp_len": 3},
                                     {"attn_type": "uni", "same_length": True}, {"reuse_len": 4, "mem_len": 0}],
                         ids=["bi", "uni", "bi_data", "clamp", "same_length", "reuse"])
def test_memory_and_two_streams_match_transformers(tmp_path, options):
    """Two calls, the second reading the first's memory, with perm_mask, target_mapping and segments: logits and
    the memory equal transformers'."""
    hf, model = saved(tmp_path, "LMHeadModel", **options)
    # transformers' "uni" attention cannot add a padding or permutation mask to a batch of more than one row.
    uni = options.get("attn_type") == "uni"
    rows = 1 if uni else 4
    ids, mask, types = left_padded((7,) if uni else (7, 7, 5, 7))
    mask = None if uni else mask
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, use_mems=True)
        out = model(ids, mask, token_type_ids=types, use_mems=True)
        close(out.logits, expected.logits)
        assert [m.shape for m in out.mems] == [m.shape for m in expected.mems]
        for ours, theirs in zip(out.mems, expected.mems):
            close(ours, theirs)
        following = torch.randint(6, VOCAB, (rows, 6))
        perm, mapping = permutation_inputs(rows, 6, 2)
        second = dict(input_ids=following, perm_mask=perm, target_mapping=mapping, token_type_ids=torch.ones_like(
            following), use_mems=True)
        expected = hf(mems=expected.mems, **second)
        got = model(following, mems=out.mems, **{k: v for k, v in second.items() if k != "input_ids"})
    assert got.logits.shape == (rows, 2, VOCAB)
    close(got.logits, expected.logits)
    for ours, theirs in zip(got.mems, expected.mems):
        close(ours, theirs)


def test_perm_mask_without_target_mapping_runs_the_content_stream(tmp_path):
    hf, model = saved(tmp_path, "Model")
    ids, mask, _ = left_padded()
    perm, _ = permutation_inputs(4, ids.shape[1], 3)
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask, perm_mask=perm)
        out = model(ids, mask, perm_mask=perm)
    close(out.last_hidden_state, expected.last_hidden_state)


def test_language_model_loss_and_gradients_match(tmp_path):
    hf, model = saved(tmp_path, "LMHeadModel")
    ids, mask, _ = left_padded((8, 8, 6, 8))
    perm, mapping = permutation_inputs(4, 8, 3)
    labels = (mapping @ ids[..., None].float()).squeeze(-1).long()
    labels[2, 0] = -100
    expected = hf(input_ids=ids, attention_mask=mask, perm_mask=perm, target_mapping=mapping, labels=labels)
    out = model(ids, mask, perm_mask=perm, target_mapping=mapping, labels=labels)
    close(out.loss, expected.loss)
    backward_and_compare_gradients(out.loss, expected.loss, model, hf)


def backward_and_compare_gradients(loss, expected_loss, model, hf) -> None:
    """Backward through both losses; the gradients of the embeddings, the mask embedding, a relative-position bias
    and a query projection equal transformers'."""
    expected_loss.backward()
    loss.backward()
    close(model.embeddings.weight.grad, hf.transformer.word_embedding.weight.grad)
    close(model.mask_embedding.grad, hf.transformer.mask_emb.grad.flatten())
    close(model.layers[0].position_bias.grad, hf.transformer.layer[0].rel_attn.r_r_bias.grad)
    close(model.layers[1].query.weight.grad, hf.transformer.layer[1].rel_attn.q.grad.flatten(1).T)


def test_packed_language_model_loss_and_gradients_match(tmp_path):
    """Without a memory the streams run on the real tokens alone (rows of four lengths, padded on the left, two
    segments, a permutation over the real tokens, an empty target slot): loss and gradients equal transformers'."""
    hf, model = saved(tmp_path, "LMHeadModel")
    lengths = (9, 5, 9, 7)
    ids, mask, types = left_padded(lengths)
    perm = torch.ones(4, 9, 9)
    mapping = torch.zeros(4, 2, 9)
    for row, n in enumerate(lengths):  # each row's own order over its real tokens, its last two predicted
        real_perm, real_mapping = permutation_inputs(1, n, 2)
        perm[row, 9 - n:, 9 - n:] = real_perm[0]
        mapping[row, :, 9 - n:] = real_mapping[0]
    mapping[1, 1] = 0  # an empty slot
    labels = (mapping @ ids[..., None].float()).squeeze(-1).long().masked_fill(mapping.sum(-1) == 0, -100)
    inputs = dict(attention_mask=mask, token_type_ids=types, perm_mask=perm, target_mapping=mapping, labels=labels,
                  use_mems=False)
    assert model.layout(mask, 0, False, False) is not None  # the packed path runs
    expected = hf(input_ids=ids, **inputs)
    out = model(ids, **inputs)
    close(out.logits[mapping.sum(-1) > 0], expected.logits[mapping.sum(-1) > 0])
    close(out.loss, expected.loss)
    backward_and_compare_gradients(out.loss, expected.loss, model, hf)
    close(model.layers[0].segment_embeddings.grad, hf.transformer.layer[0].rel_attn.seg_embed.grad)
    close(model.layers[0].ffn_in.weight.grad, hf.transformer.layer[0].ff.layer_1.weight.grad)


def test_packed_content_stream_equals_the_padded_one(tmp_path):
    """The hidden states of the real tokens (and every head's logits there) are the same packed (use_mems=False)
    and padded (with a memory kept); padding is zero when packed."""
    _, model = saved(tmp_path, "ForTokenClassification")
    ids, mask, types = left_padded()
    with torch.no_grad():
        padded = model(ids, mask, token_type_ids=types, use_mems=True, output_hidden_states=True)
        packed = model(ids, mask, token_type_ids=types, use_mems=False, output_hidden_states=True)
    real = mask.bool()
    for ours, theirs in zip(packed.hidden_states, padded.hidden_states, strict=True):
        close(ours[real], theirs[real])
        assert not ours[~real].any()
    close(packed.logits[real], padded.logits[real])


@pytest.mark.parametrize("suffix", ARCHITECTURES)
def test_saved_back_transformers_loads_the_same_model(tmp_path, suffix):
    hf, model = saved(tmp_path, suffix, mem_len=None, bi_data=True)
    assert model.config.mem_len is None and model.config.bi_data
    save_model(model, tmp_path / "back")
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["model_type"] == "xlnet" and config["architectures"] == [f"XLNet{suffix}"]
    assert config["mem_len"] is None and config["n_head"] == 2 and config["d_inner"] == 24
    back = getattr(transformers, f"XLNet{suffix}").from_pretrained(tmp_path / "back").eval()
    theirs, ours = hf.state_dict(), back.state_dict()
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        assert torch.equal(ours[key], value), key


def test_native_format_round_trips(tmp_path):
    config = XLNetConfig(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=24,
                         hidden_dropout=0.0, attn_type="uni", mem_len=4)
    from bertology.model import HeadSpec
    model = XLNetModel(config, [HeadSpec("lm", "tied_lm_bias")]).eval()
    model.init_weights(torch.Generator().manual_seed(1))
    model.add_extension("layers.0.query", "lora", rank=2, alpha=4)
    save_model(model, tmp_path / "native")
    assert (tmp_path / "native" / "bertology.json").is_file()
    back = load_model(tmp_path / "native").eval()
    ids = torch.randint(0, 40, (2, 5))
    with torch.no_grad():
        assert torch.equal(back(ids).logits, model(ids).logits)


def test_rel_shift_reads_the_distance_between_query_and_key():
    """Entry (i, j) of the shifted scores is the column of distance (M + i) - j, columns counting down from K."""
    queries, memory = 3, 2
    keys = memory + queries
    distances = torch.arange(keys, -queries, -1).float()  # K, ..., -L + 1
    scores = distances.expand(1, 1, queries, -1).contiguous()
    shifted = rel_shift(scores, keys)[0, 0]
    expected = (torch.arange(queries)[:, None] + memory - torch.arange(keys)[None, :]).float()
    assert torch.equal(shifted, expected)


def write_config(tmp_path, **changes):
    hf, _ = saved(tmp_path, "Model")
    path = tmp_path / "hf" / "config.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))
    return tmp_path / "hf"


@pytest.mark.parametrize(("changes", "message"), [
    ({"mem_len": -1}, "mem_len: expected a length >= 0 or null, got -1"),
    ({"reuse_len": -2}, "reuse_len: expected a length >= 0 or null, got -2"),
    ({"attn_type": "sideways"}, "attn_type: expected one of 'bi', 'uni', got 'sideways'"),
    ({"d_head": 4}, "d_head 4 is not d_model / n_head = 16 / 2"),
    ({"ff_activation": "swiglu"}, "ff_activation: 'swiglu' is not supported"),
])
def test_bad_config_values_name_the_key(tmp_path, changes, message):
    directory = write_config(tmp_path, **changes)
    with pytest.raises(ConfigError, match=message) as error:
        load_model(directory)
    assert "config.json" in str(error.value)


def test_unbuilt_summary_and_architecture_are_refused(tmp_path):
    directory = write_config(tmp_path, summary_type="mean")
    with pytest.raises(CheckpointError, match="config.json: summary_type 'mean' is not supported"):
        load_model(directory)
    directory = write_config(tmp_path, summary_type="last", architectures=["XLNetForMultipleChoice"])
    with pytest.raises(CheckpointError, match="unsupported architecture 'XLNetForMultipleChoice'"):
        load_model(directory)


def test_negative_memory_length_in_our_config():
    with pytest.raises(ConfigError, match="mem_len: expected a length >= 0 or null, got -3"):
        XLNetConfig(mem_len=-3)


def test_bad_inputs_name_the_argument():
    model = XLNetModel(XLNetConfig(vocab_size=30, hidden_size=8, num_layers=2, num_heads=2, intermediate_size=8,
                                   bi_data=True)).eval()
    ids = torch.randint(0, 30, (2, 4))
    with pytest.raises(InputError, match=r"perm_mask must be \[2, 4, 4\]"):
        model(ids, perm_mask=torch.zeros(2, 4, 3))
    with pytest.raises(InputError, match=r"target_mapping must be \[batch, num_predict, length\]"):
        model(ids, target_mapping=torch.zeros(2, 1, 5))
    soft = torch.full((2, 1, 4), 0.25)
    with pytest.raises(InputError, match="target_mapping: each row must be one-hot"):
        model(ids, target_mapping=soft)
    twice = torch.nn.functional.one_hot(torch.tensor([[1, 1], [0, 2]]), 4).float()
    with pytest.raises(InputError, match="no token predicted twice"):
        model(ids, target_mapping=twice)
    with pytest.raises(InputError, match=r"token_type_ids must be \[2, 4\]"):
        model(ids, token_type_ids=torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(InputError, match=r"mems\[1\] must be \[memory length, batch, hidden\]"):
        model(ids, mems=[torch.zeros(3, 2, 8), torch.zeros(3, 1, 8)])
    with pytest.raises(InputError, match="mems holds 1 layers' memory; the model has 2 layers"):
        model(ids, mems=[torch.zeros(3, 2, 8)])
    with pytest.raises(InputError, match="bi_data .* the batch size must be even, got 3"):
        model(torch.randint(0, 30, (3, 4)))
    with pytest.raises(InputError, match=r"input_ids must lie in \[0, 30\)"):
        model(ids + 30)


def test_attention_probabilities_match_transformers(tmp_path):
    """output_attentions: the content stream's probabilities per layer (left padding, segments, then a memory)
    equal transformers' attentions; with target_mapping they are refused, naming the reason."""
    hf, model = saved(tmp_path, "Model")
    ids, mask, types = left_padded()
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, output_attentions=True,
                      use_mems=True)
        out = model(ids, mask, token_type_ids=types, output_attentions=True, use_mems=True)
        assert len(out.attentions) == len(expected.attentions) == 2
        for ours, theirs in zip(out.attentions, expected.attentions):
            assert ours.shape == (4, 2, 9, 9)
            close(ours, theirs)
        following = torch.randint(6, VOCAB, (4, 5))
        expected = hf(input_ids=following, mems=expected.mems, output_attentions=True)
        out = model(following, mems=out.mems, output_attentions=True)
    for ours, theirs in zip(out.attentions, expected.attentions):
        assert ours.shape == (4, 2, 5, 6 + 5)  # mem_len 6, then the input
        close(ours, theirs)
    perm, mapping = permutation_inputs(4, 9, 2)
    with pytest.raises(InputError, match="output_attentions gives the content stream's probabilities"):
        model(ids, perm_mask=perm, target_mapping=mapping, output_attentions=True)


def test_an_attention_mask_over_the_memory_hides_it_per_row(tmp_path):
    """attention_mask [B, M + L]: ones equal the input's mask alone (transformers' memory, always seen); a row whose
    memory is all hidden gives what that row gives without memory (both streams); memory_mask follows cache."""
    _, model = saved(tmp_path, "LMHeadModel", mem_len=5, reuse_len=4)
    ids, mask, types = left_padded((7, 7, 7, 7))
    with torch.no_grad():
        first = model(ids, mask, token_type_ids=types, use_mems=True)
        following = torch.randint(6, VOCAB, (4, 6))
        perm, mapping = permutation_inputs(4, 6, 2)
        inputs = dict(token_type_ids=torch.ones_like(following), perm_mask=perm, target_mapping=mapping,
                      use_mems=True)
        seen = model(following, mems=first.mems, **inputs)
        ones = model(following, torch.ones(4, 4 + 6), mems=first.mems, **inputs)
        hidden = torch.ones(4, 4 + 6)
        hidden[1, :4] = 0
        reset = model(following, hidden, mems=first.mems, **inputs)
        alone = model(following, **inputs)
    close(ones.logits, seen.logits)
    close(reset.logits[1], alone.logits[1])
    close(reset.logits[[0, 2, 3]], seen.logits[[0, 2, 3]])
    assert (seen.logits[1] - alone.logits[1]).abs().max() > 1e-4  # the memory mattered
    # The next memory's mask: the first reuse_len positions appended, the last mem_len kept.
    assert [m.shape[0] for m in first.mems] == [4, 4] and seen.mems[0].shape[0] == 5
    previous = model.memory_mask(None, mask)
    assert previous.tolist() == mask[:, :4].tolist()
    assert model.memory_mask(previous, torch.ones(4, 6)).tolist() == \
        torch.cat([mask[:, 1:4], torch.ones(4, 2, dtype=mask.dtype)], 1).tolist()
    with pytest.raises(InputError, match="attention_mask must be"):
        model(following, torch.ones(4, 3), mems=first.mems)
