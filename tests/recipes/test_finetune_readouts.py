"""What a classifier reads besides [CLS]: the mean of the real tokens (`task.pooling: mean`), and ELMo's scalar mix
of a frozen encoder's layers (`strategy.kind: scalar-mix`). Each is checked against a hand computation, on the
packed and padded paths, through the native format's save and load, and end to end in `finetune`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertology.errors import ConfigError
from bertology.model import EncoderModel, HeadSpec, Pretrained, load, preset
from bertology.recipes.finetune import FinetuneConfig, finetune, predict_file
from bertology.tasks.lookup import get_task
from bertology.tasks.metrics import evaluate_files
from finetune_helpers import BAD, FILL, GOOD, save_tiny_model
from finetune_helpers import cue_sentence as _sentence

def _model(heads, seed=0):
    config = preset("tiny", vocab_size=30, num_layers=3, hidden_size=16, num_heads=2, intermediate_size=32,
                    max_position_embeddings=32, hidden_dropout=0.0, attention_dropout=0.0)
    model = EncoderModel(config, heads)
    model.init_weights(torch.Generator().manual_seed(seed))
    return model.eval()


def _batch():
    ids = torch.tensor([[2, 5, 6, 7, 8, 3], [2, 9, 10, 3, 0, 0], [2, 11, 3, 0, 0, 0]])
    return ids, (ids != 0).long()


def test_mean_pooled_head_is_a_linear_layer_on_the_mean_of_the_real_tokens():
    model = _model([HeadSpec("classifier", "mean_pooled", 3)])
    ids, mask = _batch()
    with torch.no_grad():
        out = model(ids, mask, output_hidden_states=True)
        padded = model(ids, mask, packed=False)
        # the last layer is never pruned for it: it reads every token
        pruned = model(ids, mask, last_layer_at=torch.tensor([[0, 0], [1, 0], [2, 0]]))
    h = out.last_hidden_state
    mean = torch.stack([h[i, : int(mask[i].sum())].mean(0) for i in range(3)])
    head = model.heads["classifier"].out
    expected = mean @ head.weight.T + head.bias
    torch.testing.assert_close(out.logits, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded.logits, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pruned.logits, expected, atol=1e-5, rtol=1e-5)


def test_scalar_mix_heads_read_the_softmax_weighted_sum_of_all_hidden_states(tmp_path):
    model = _model([HeadSpec("token_classifier", "token", 4)])
    mix = model.add_extension("mix", "scalar_mix")
    with torch.no_grad():
        mix.scalars.copy_(torch.tensor([0.3, -1.0, 2.0, 0.5]))
        mix.gamma.fill_(1.7)
    ids, mask = _batch()
    with torch.no_grad():
        plain = _model([HeadSpec("token_classifier", "token", 4)])
        plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("mix.")})
        states = plain(ids, mask, output_hidden_states=True).hidden_states
        out = model(ids, mask)
        padded = model(ids, mask, packed=False)
    assert len(states) == 4 and out.hidden_states is None  # only returned when asked for
    weights = torch.softmax(torch.tensor([0.3, -1.0, 2.0, 0.5]), 0)
    mixed = 1.7 * sum(w * s for w, s in zip(weights, states))
    head = model.heads["token_classifier"].out
    real = mask.bool()
    expected = mixed @ head.weight.T + head.bias
    torch.testing.assert_close(out.logits[real], expected[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded.logits[real], expected[real], atol=1e-5, rtol=1e-5)
    # The native format records the mix and rebuilds it on load.
    Pretrained(model, None).save(tmp_path / "mixed")
    again = load(tmp_path / "mixed").model.eval()
    assert again.mix is not None
    with torch.no_grad():
        torch.testing.assert_close(again(ids, mask).logits, out.logits, atol=1e-6, rtol=1e-6)


def test_a_second_mix_is_refused():
    model = _model([])
    model.add_extension("mix", "scalar_mix")
    with pytest.raises(ConfigError, match="already has a mix"):
        model.add_extension("mix", "scalar_mix")


# --------------------------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def glue(tmp_path_factory):
    root = tmp_path_factory.mktemp("glue")
    rng = np.random.default_rng(1)
    (root / "SST-2").mkdir()
    for split, n in (("train", 160), ("dev", 48)):
        rows = [(_sentence(rng, label), label) for label in rng.integers(0, 2, n)]
        (root / "SST-2" / f"{split}.tsv").write_text(
            "sentence\tlabel\n" + "".join(f"{s} \t{label}\n" for s, label in rows), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("base") / "model", GOOD + BAD + FILL, vocab_size=40)


def _config(glue, model_dir, out, **sections):
    raw = {"model": str(model_dir), "task": {"name": "sst2", "data": str(glue), "epochs": 6},
           "optim": {"batch_size": 16, "lr": 3e-3, "warmup_ratio": 0.1},
           "run": {"output_dir": str(out), "log_every": 10, "progress": False},
           "speed": {"threads": 1, "prefetch": 0}}
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return FinetuneConfig.from_dict(raw)


def test_mean_pooling_finetunes_saves_natively_and_predicts(glue, model_dir, tmp_path):
    out = tmp_path / "mean"
    result = finetune(_config(glue, model_dir, out, task={"pooling": "mean"}))
    assert result.best["value"] > 90  # the cue word decides the label
    reloaded = load(out / "model")
    assert [(s.name, s.kind) for s in reloaded.model.head_specs] == [("classifier", "mean_pooled")]
    assert (out / "model" / "bertology.json").is_file()  # no transformers class reads a mean-pooled classifier
    predict_file(out / "model", "sst2", glue / "SST-2" / "dev.tsv", tmp_path / "pred.tsv")
    scores = evaluate_files("sst2", tmp_path / "pred.tsv", gold=glue / "SST-2" / "dev.tsv")
    assert scores == result.dev_metrics


def test_scalar_mix_trains_only_the_mix_and_the_head(glue, model_dir, tmp_path):
    out = tmp_path / "mix"
    base = load(model_dir).model
    # The random encoder's [CLS] carries little of the cue word; the mean of the mixed states (the embedding layer's
    # among them) carries it linearly.
    result = finetune(_config(glue, model_dir, out, strategy={"kind": "scalar-mix"},
                              optim={"lr": 1e-2}, task={"epochs": 8, "pooling": "mean"}))
    # Chance is 50. 87.5 in every process and test order since WordPiece training (the base model's vocabulary)
    # became deterministic; before, the base was numbered anew in each process and this moved from 75 to 92.
    assert result.best["value"] > 80
    trained = load(out / "model").model
    assert trained.mix is not None and [s.kind for s in trained.head_specs] == ["mean_pooled"]
    for name, value in base.encoder.state_dict().items():  # the encoder is frozen
        if not name.startswith("pooler."):
            torch.testing.assert_close(trained.encoder.state_dict()[name], value)
    assert not torch.equal(trained.mix.scalars.detach(), torch.zeros(3))  # the mix learnt its weights
    heads = sum(p.numel() for p in trained.heads.parameters())
    assert result.trainable.trainable == heads + 3 + 1  # head, one scalar per state (embeddings + 2 layers), gamma


def test_under_a_scalar_mix_a_pooled_classifier_reads_the_mix_at_cls(model_dir):
    from bertology.recipes.finetune import task_heads

    config = load(model_dir).model.config
    assert [(h.kind, h.activation) for h in task_heads(get_task("sst2"), config, scalar_mix=True)] == \
        [("first_token", "tanh")]  # BERT's pooler reads the last layer, so dense-tanh-linear on the mix instead
    assert [h.kind for h in task_heads(get_task("conll2003"), config, scalar_mix=True)] == ["token"]


def test_mean_pooling_of_a_tagging_task_is_refused(model_dir, tmp_path):
    from bertology.recipes.finetune import task_heads

    config = load(model_dir).model.config
    with pytest.raises(ConfigError, match="task.pooling: 'mean' applies to sentence tasks"):
        task_heads(get_task("conll2003"), config, pooling="mean")
