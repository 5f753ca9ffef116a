"""A linear-chain CRF and the BiLSTM-CRF tagger head (kind "bilstm_crf"): the NER setup of Peters et al. (2018)
(after Lample et al. 2016 and Peters et al. 2017), usable on any model's features; and the BiLSTM-max sentence
classifier (kind "bilstm_max") on the same BiLSTM over the real tokens.

A tag sequence y_1..y_n of a sentence with emission scores e_t (one row of T scores per word) scores

    s(y) = start[y_1] + sum_t e_t[y_t] + sum_{t>1} trans[y_{t-1}, y_t] + end[y_n]

and log p(y) = s(y) - log Z, log Z = logsumexp over all T^n sequences, computed exactly by the forward algorithm in
log space (one [B, T, T] logsumexp per word, vectorised over the batch). Viterbi gives argmax_y s(y), optionally
under `allowed` transitions (BIO: I-X only after B-X or I-X, never first), as AllenNLP constrains decoding only.

Sequences are given as `[B, W, T]` scores and a `[B, W]` mask whose real words come first in each row
(`compact` brings the words of a token-level mask there); a padded word changes nothing in its row.

The head: the hidden states of the real tokens (every token the model's mask keeps, whatever its padding side)
go through a 2-layer bidirectional LSTM of `hidden_size // 2` per direction (so its output is as wide as its
input), dropout, and a linear layer to T emission scores per token; the CRF's parameters are the head's
(`head.crf`). The head's logits are the emissions; the objective (`bertology.tasks.tagging.CRFTagging`) takes the
CRF likelihood at the labelled tokens, and prediction decodes with `head.decode`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from bertology.errors import InputError
from bertology.model.dropout import fast_dropout
from bertology.model.heads import HeadInputs, HeadSpec


def compact(values: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    """The positions of `keep` [B, L] (bool) moved to the front of each row, in order: `values` [B, L, ...] ->
    [B, W, ...] with W the most kept in a row, and the new mask [B, W] (padded places hold row 0's first value)."""
    counts = keep.sum(1)
    width = int(counts.max()) if keep.numel() else 0
    # A stable sort of (not kept) puts each row's kept positions first, in their order.
    order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices[:, :width]
    mask = torch.arange(width, device=keep.device)[None, :] < counts[:, None]
    index = order.reshape(*order.shape, *([1] * (values.dim() - 2))).expand(-1, -1, *values.shape[2:])
    return values.gather(1, index), mask


class LinearChainCRF(nn.Module):
    """Transition scores trans[i, j] (tag i then tag j), start and end scores; see the module docstring."""

    def __init__(self, num_tags: int) -> None:
        super().__init__()
        self.num_tags = num_tags
        self.transitions = nn.Parameter(torch.zeros(num_tags, num_tags))
        self.start = nn.Parameter(torch.zeros(num_tags))
        self.end = nn.Parameter(torch.zeros(num_tags))

    def _check(self, emissions: Tensor, mask: Tensor) -> None:
        if emissions.dim() != 3 or emissions.shape[-1] != self.num_tags:
            raise InputError(f"CRF: emissions must be [batch, words, {self.num_tags}], got {tuple(emissions.shape)}")
        if mask.shape != emissions.shape[:2]:
            raise InputError(f"CRF: mask {tuple(mask.shape)} must be [batch, words] {tuple(emissions.shape[:2])}")

    def log_partition(self, emissions: Tensor, mask: Tensor) -> Tensor:
        """log Z [B] of each row (0 for a row without words)."""
        self._check(emissions, mask)
        emissions, mask = emissions.float(), mask.bool()
        if emissions.shape[1] == 0:
            return emissions.new_zeros(emissions.shape[0])
        alpha = self.start + emissions[:, 0]  # [B, T]
        for t in range(1, emissions.shape[1]):
            step = torch.logsumexp(alpha[:, :, None] + self.transitions[None], dim=1) + emissions[:, t]
            alpha = torch.where(mask[:, t, None], step, alpha)
        return torch.where(mask[:, 0], torch.logsumexp(alpha + self.end, dim=1), 0.0)

    def score(self, emissions: Tensor, tags: Tensor, mask: Tensor) -> Tensor:
        """s(y) [B] of the tag sequences `tags` [B, W] (0 for a row without words)."""
        self._check(emissions, mask)
        emissions, mask = emissions.float(), mask.bool()
        if emissions.shape[1] == 0:
            return emissions.new_zeros(emissions.shape[0])
        tags = tags.masked_fill(~mask, 0)
        real = mask.float()
        emitted = (emissions.gather(2, tags[..., None]).squeeze(-1) * real).sum(1)
        moved = (self.transitions[tags[:, :-1], tags[:, 1:]] * real[:, 1:]).sum(1)
        last = tags.gather(1, (mask.sum(1) - 1).clamp(min=0)[:, None]).squeeze(1)
        return torch.where(mask[:, 0], self.start[tags[:, 0]] + emitted + moved + self.end[last], 0.0)

    def log_likelihood(self, emissions: Tensor, tags: Tensor, mask: Tensor) -> Tensor:
        """log p(tags) [B] = s(tags) - log Z."""
        return self.score(emissions, tags, mask) - self.log_partition(emissions, mask)

    @torch.no_grad()
    def viterbi(self, emissions: Tensor, mask: Tensor, allowed: Tensor | None = None,
                allowed_start: Tensor | None = None) -> Tensor:
        """The best tag sequence [B, W] of each row (entries past a row's words repeat its last tag). `allowed`
        [T, T] (bool): which transitions may be taken; `allowed_start` [T]: which tags may come first."""
        self._check(emissions, mask)
        emissions, mask = emissions.float(), mask.bool()
        batch, words, tags = emissions.shape
        if words == 0:
            return torch.zeros(batch, 0, dtype=torch.long, device=emissions.device)
        forbidden = torch.tensor(float("-inf"), device=emissions.device)
        transitions = self.transitions if allowed is None else torch.where(allowed, self.transitions, forbidden)
        start = self.start if allowed_start is None else torch.where(allowed_start, self.start, forbidden)
        score = start + emissions[:, 0]
        stay = torch.arange(tags, device=emissions.device).expand(batch, tags)
        pointers = []
        for t in range(1, words):
            best, came_from = (score[:, :, None] + transitions[None]).max(dim=1)
            real = mask[:, t, None]
            score = torch.where(real, best + emissions[:, t], score)
            pointers.append(torch.where(real, came_from, stay))
        path = [(score + self.end).argmax(1)]
        for came_from in reversed(pointers):
            path.append(came_from.gather(1, path[-1][:, None]).squeeze(1))
        return torch.stack(path[::-1], dim=1)


def bilstm(lstm: nn.LSTM, hidden: Tensor, keep: Tensor, dropout: float, training: bool) -> tuple[Tensor, Tensor]:
    """`lstm` (batch first) over the tokens `keep` [B, L] of `hidden` [B, L, H], moved to the front of each row
    (whichever side the padding was on), dropped out and packed: outputs [B, W, out] (zeros past a row's tokens)
    and their mask [B, W]."""
    words, real = compact(hidden, keep)
    lengths = real.sum(1).clamp(min=1).cpu()
    words = fast_dropout(words, dropout, training)
    packed = nn.utils.rnn.pack_padded_sequence(words, lengths, batch_first=True, enforce_sorted=False)
    out, _ = lstm(packed)
    out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=words.shape[1])
    return out, real


class BiLSTMCRFHead(nn.Module):
    """Kind "bilstm_crf": a 2-layer BiLSTM over the real tokens' hidden states, then emission scores per token, and
    a linear-chain CRF over the tags (`crf`); see the module docstring."""

    def __init__(self, config: Any, spec: HeadSpec) -> None:
        super().__init__()
        width = max(1, config.hidden_size // 2)
        self.dropout = config.head_dropout
        self.lstm = nn.LSTM(config.hidden_size, width, num_layers=2, batch_first=True, bidirectional=True,
                            dropout=self.dropout)
        self.out = nn.Linear(2 * width, spec.num_labels)
        self.crf = LinearChainCRF(spec.num_labels)

    def forward(self, inputs: HeadInputs) -> Tensor:
        h, keep = inputs.hidden, inputs.attention_mask.bool()
        out, real = bilstm(self.lstm, h, keep, self.dropout, self.training)
        emissions = self.out(fast_dropout(out, self.dropout, self.training))
        # Back to the token positions (padding scores 0).
        full = emissions.new_zeros(*h.shape[:2], emissions.shape[-1])
        full[keep] = emissions[real]
        return full

    def decode(self, emissions: Tensor, at: Tensor, allowed: Tensor | None = None,
               allowed_start: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Viterbi over the tokens `at` [B, L] (bool; a word's first token) of the head's emissions [B, L, T]: the
        best tags [B, W] of each row's words in order, and their mask [B, W]."""
        scores, mask = compact(emissions, at)
        return self.crf.viterbi(scores, mask, allowed, allowed_start), mask



class BiLSTMMaxHead(nn.Module):
    """Kind "bilstm_max": a sentence classifier that reads the words, not their average (InferSent's encoder): a
    1-layer BiLSTM of `hidden_size // 2` per direction over the real tokens, the element-wise max of its outputs,
    dropout and a linear layer."""

    def __init__(self, config: Any, spec: HeadSpec) -> None:
        super().__init__()
        width = max(1, config.hidden_size // 2)
        self.dropout = config.head_dropout
        self.lstm = nn.LSTM(config.hidden_size, width, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * width, spec.num_labels)

    def forward(self, inputs: HeadInputs) -> Tensor:
        out, real = bilstm(self.lstm, inputs.hidden, inputs.attention_mask.bool(), self.dropout, self.training)
        pooled = out.masked_fill(~real[..., None], float("-inf")).amax(1)
        pooled = torch.where(torch.isfinite(pooled), pooled, 0.0)  # a row without tokens reads zeros
        return self.out(fast_dropout(pooled, self.dropout, self.training))

