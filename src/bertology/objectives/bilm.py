"""ELMo's pretraining: a forward and a backward LM over word streams, with truncated backpropagation.

    L = sum over forward targets of -log P(w_{t+1} | w_<=t)  +  sum over backward targets of -log P(w_{t-1} | w_>=t)

divided by the number of targets of both (the mean of the two directions' losses), a full softmax over the word
vocabulary shared by both directions (the model's `lm` head, `tied_lm_bias`), on the top LSTM layer of each
direction after dropout; with `sampled: K`, training uses a sampled softmax over K negatives a batch instead (for
large vocabularies; its accuracy is then among the label and the negatives), evaluation the full one. Each batch
(`bertology.data.word_streams.BiLMBatch`) continues the previous one: the LSTMs start from the state the last batch
left (detached: gradients stop at the window's edge), and from zeros in the rows where a document starts (`reset`).
The training state is a buffer of this module, so it is saved in every checkpoint with the trainer state and a
resumed run continues bit for bit; evaluation keeps a state of its own.

Stats: ``{name}_forward_units``/``_loss_sum``/``_correct`` and the same for ``backward``; metrics: each direction's
loss, accuracy and perplexity, and ``{name}_loss`` (both directions' mean)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from bertology.errors import ConfigError
from bertology.model.dropout import fast_dropout
from bertology.model.heads import HeadSpec
from bertology.model.protocol import CHARACTERS, require
from bertology.objectives.base import Objective, ObjectiveOutput, Passes, check_objective, ratio, safe_exp
from bertology.objectives.mlm import linear_prediction_applies, linear_token_prediction, token_prediction


@dataclass(eq=False)
class BidirectionalLM(nn.Module, Objective):
    weight: float = 1.0
    # > 0: training uses a sampled softmax over this many negative words a batch (see `sampled_softmax_loss`);
    # held-out metrics always use the full softmax. 0: the full softmax in training too.
    sampled: int = 0
    name: str = "bilm"
    trains: ClassVar[tuple[str, ...]] = ("elmo",)

    def __post_init__(self) -> None:
        nn.Module.__init__(self)
        check_objective(self)
        if self.sampled < 0:
            raise ConfigError(f"objectives.{self.name}.sampled: must be >= 0, got {self.sampled}")
        # The LSTM state the next training batch starts from (sized on first use and on loading a checkpoint).
        self.register_buffer("h", torch.zeros(0))
        self.register_buffer("c", torch.zeros(0))
        self.eval_state: Any = None

    def check_vocabulary(self, vocab_size: int) -> None:
        """A sampled softmax draws fewer negatives than there are words (its [tokens, 1 + sampled] logits would
        otherwise outgrow the full softmax's [tokens, vocabulary]): a ConfigError naming the key, before the first
        step, otherwise."""
        if self.sampled >= vocab_size:
            raise ConfigError(f"objectives.{self.name}.sampled: {self.sampled} negatives for a vocabulary of "
                              f"{vocab_size} words; a sampled softmax draws fewer than the vocabulary (use 0 for the "
                              "full softmax)")

    def heads(self) -> Sequence[HeadSpec]:
        return (HeadSpec("lm", "tied_lm_bias"),)

    def reads(self, batch: Any) -> Tensor:
        return torch.zeros(0, 2, dtype=torch.long)  # it runs passes of its own (with the carried state)

    def units(self, batch: Any) -> Tensor:
        return (batch.forward_targets.ne(-100).sum() + batch.backward_targets.ne(-100).sum()).to(torch.int64)

    def _state(self, batch: Any) -> Any:
        from bertology.model.elmo import ElmoState

        state = (ElmoState(self.h, self.c) if self.h.numel() else None) if self.training else self.eval_state
        if state is None or state.h.shape[1] != batch.reset.shape[0]:
            return None  # the first batch (a different batch size: a new stream)
        keep = (~batch.reset).to(state.h.dtype)[None, :, None]  # zeros where a document starts
        return ElmoState(state.h * keep, state.c * keep)

    def forward(self, passes: Passes, batch: Any) -> ObjectiveOutput:
        model = passes.model
        require(model, CHARACTERS, f"objective {self.name!r} (ELMo's biLM: model.elmo)")
        out = passes.run(batch.input_ids, batch.attention_mask, backward_input_ids=batch.backward_input_ids,
                         backward_attention_mask=batch.backward_attention_mask, state=self._state(batch))
        state = out.state.detach()
        if self.training:
            self.h, self.c = state.h, state.c
        else:
            self.eval_state = state
        p = model.config.dropout
        sampled = self.sampled if self.training else 0
        if sampled:
            self.check_vocabulary(model.config.vocab_size)
        negatives = log_uniform_sample(self.sampled, model.config.vocab_size, out.forward_top.device) \
            if sampled else None
        weight, bias = model.word_embeddings.weight, model.heads["lm"].bias
        # On CPU in fp32 the full softmax's loss makes the logits in cache-sized pieces (linear_token_prediction)
        fused = linear_prediction_applies(weight)
        stats: dict[str, Tensor] = {}
        total: Tensor | None = None
        for direction, top, targets in (("forward", out.forward_top, batch.forward_targets),
                                        ("backward", out.backward_top, batch.backward_targets)):
            real = targets.ne(-100)
            states, labels = fast_dropout(top[real], p, self.training), targets[real]
            key = f"{self.name}_{direction}"
            if negatives is not None:  # the label is candidate 0 among the label and the negatives
                part = token_prediction(key, sampled_logits(states, labels, negatives, weight, bias),
                                        torch.zeros_like(labels))
            elif fused:
                part = linear_token_prediction(key, states, weight, bias, labels)
            else:
                part = token_prediction(key, model.lm_logits(states), labels)
            total = part.loss_sum if total is None else total + part.loss_sum
            stats.update(part.stats)
        assert total is not None
        return ObjectiveOutput(total, stats)

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for direction in ("forward", "backward"):
            key = f"{self.name}_{direction}"
            loss = ratio(totals.get(f"{key}_loss_sum", 0.0), totals.get(f"{key}_units", 0.0))
            metrics[f"{key}_loss"] = loss
            metrics[f"{key}_accuracy"] = ratio(totals.get(f"{key}_correct", 0.0), totals.get(f"{key}_units", 0.0))
            metrics[f"{key}_perplexity"] = safe_exp(loss)
        units = totals.get(f"{self.name}_forward_units", 0.0) + totals.get(f"{self.name}_backward_units", 0.0)
        metrics[f"{self.name}_loss"] = ratio(totals.get(f"{self.name}_forward_loss_sum", 0.0)
                                             + totals.get(f"{self.name}_backward_loss_sum", 0.0), units)
        return metrics

    def _load_from_state_dict(self, state_dict: Mapping[str, Any], prefix: str, *args: Any) -> None:
        for name in ("h", "c"):  # the saved state's shape (batch rows, layers) is the one to continue
            saved = state_dict.get(prefix + name)
            if isinstance(saved, Tensor):
                setattr(self, name, torch.zeros(saved.shape, dtype=saved.dtype, device=getattr(self, name).device))
        super()._load_from_state_dict(state_dict, prefix, *args)

    def extra_repr(self) -> str:
        return f"weight={self.weight}, sampled={self.sampled}"


def log_uniform_sample(count: int, vocab_size: int, device: torch.device) -> Tensor:
    """`count` word ids drawn with replacement from the log-uniform (Zipfian) distribution over a vocabulary ranked by
    frequency, P(i) = log((i + 2) / (i + 1)) / log(V + 1), as TensorFlow's log_uniform_candidate_sampler (bilm-tf's
    sampler), from torch's default generator (saved with every checkpoint)."""
    u = torch.rand(count, dtype=torch.float64).to(device)
    return (torch.exp(u * math.log(vocab_size + 1)) - 1).long().clamp(0, vocab_size - 1)


def log_uniform_log_prob(ids: Tensor, vocab_size: int) -> Tensor:
    return torch.log(torch.log1p(1.0 / (ids.double() + 1)) / math.log(vocab_size + 1)).float()


def sampled_logits(states: Tensor, labels: Tensor, negatives: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """The sampled softmax's logits [N, 1 + K] (Jean et al. 2015): the label's logit, then each of the K negatives'
    less the log of its expected count K * P(i), a negative equal to the row's label masked out (an accidental hit).
    The softmax over these candidates then has exp(label's logit) plus an unbiased estimate of the other words' sum
    as its normaliser, so cross-entropy with label 0 tends to the full softmax's as K grows. (TensorFlow's
    sampled_softmax_loss, which bilm-tf used, also subtracts log(K * P(label)) from the label's logit.)"""
    vocab_size, count = weight.shape[0], negatives.shape[0]
    true = (states * weight[labels]).sum(-1) + bias[labels]
    negative = states @ weight[negatives].T + bias[negatives] - log_uniform_log_prob(negatives, vocab_size) \
        - math.log(count)
    negative = negative.masked_fill(negatives[None] == labels[:, None], float("-inf"))
    return torch.cat([true[:, None], negative], 1)
