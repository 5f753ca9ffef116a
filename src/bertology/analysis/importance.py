"""Head importance and head pruning (Michel et al. 2019, "Are Sixteen Heads Really Better than One?").

Each head's output is multiplied by a mask variable xi_h (the encoder's `head_mask`); its importance is the
expected absolute gradient of the loss with respect to xi_h, I_h = E_x |dL(x)/dxi_h|, taken per example (one
backward pass per example, as the definition says; transformers' old script took it per batch), then divided by
the L2 norm of its layer's importances. Pruning is iterative: remove the least important remaining heads in steps
of a share of all heads, recompute the importances with them masked, and measure the metric after each step.

The loss and the metric come from a fine-tuned classifier and its task's data (`TaskData`: importances on the
first examples of train, the metric, accuracy, on dev), or from the masked-LM head on texts (`MaskedLMData`:
masked-token cross-entropy and accuracy at a fixed, seeded 15 % of the tokens). `prune_model` then removes the
chosen heads for good: the query, key, value and attention output projections shrink (EncoderModel.prune_heads)
and the model saves in transformers' layout with `pruned_heads` in config.json.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from bertology.analysis.base import Section, shell_command, write_numbers
from bertology.errors import ConfigError, DataError
from bertology.io import check_output_directory, files_into
from bertology.model.checkpoint import Pretrained
from bertology.model.encoder import EncoderModel
from bertology.model.protocol import BLOCKS, HEAD_MASK, capabilities, model_kind, require


class ImportanceData(Protocol):
    """Where the loss (for importances) and the metric (for the pruning curve) come from. `loss` and `metric` run
    the model where it is: they move their batches and `head_mask` to its device."""

    metric_name: str

    def importance_batches(self) -> Iterator[Any]:
        """Batches of one example each (importance is an expectation over examples of an absolute gradient)."""
        ...

    def loss(self, model: EncoderModel, batch: Any, head_mask: Tensor) -> Tensor:
        """The mean loss of `batch` with the heads scaled by `head_mask`."""
        ...

    def metric(self, model: EncoderModel, head_mask: Tensor) -> float:
        """The metric (higher is better) on the evaluation data with the heads scaled by `head_mask`."""
        ...


@dataclass
class _Rows:
    input_ids: Tensor
    attention_mask: Tensor
    token_type_ids: Tensor
    labels: Tensor | None = None
    positions: Tensor | None = None  # [N, 2] masked positions (masked LM)


def _rows_of(batch: Any, labels: Tensor | None = None) -> _Rows:
    return _Rows(batch.input_ids, batch.attention_mask, batch.token_type_ids, labels)


def _moved(model: EncoderModel, *tensors: Tensor | None) -> tuple[Any, ...]:
    """`tensors` on `model`'s device (the same tensors when they are there already; None stays None)."""
    from bertology.device import model_device

    device = model_device(model)
    return tuple(None if t is None else t.to(device) for t in tensors)


class TaskData:
    """A fine-tuned classifier's task (`bertology finetune --task NAME`): the loss is the cross-entropy of the
    model's primary head; importances on the first `importance_examples` of train, accuracy (x100) on dev (the
    first `eval_examples` of it when given)."""

    metric_name = "accuracy"

    def __init__(self, pretrained: Pretrained, task: str, data: str | Path, *, importance_examples: int = 256,
                 eval_examples: int | None = None, max_length: int = 128, batch_size: int = 64) -> None:
        from bertology.tasks.lookup import get_task

        self.task = get_task(task)
        if self.task.label_names() is None:
            raise ConfigError(f"task {task!r} is a regression task; head importance here needs a classifier "
                              "(cross-entropy loss, accuracy)")
        model, tokenizer = pretrained.model, pretrained.tokenizer
        if tokenizer is None:
            raise DataError("head importance on a task needs the model's tokenizer; the model directory has none")
        if not model.head_specs or model.head_specs[0].num_labels != len(self.task.label_names()):
            heads = ", ".join(f"{s.name} ({s.num_labels} labels)" for s in model.head_specs) or "none"
            raise ConfigError(f"the model's heads ({heads}) are not a classifier for task {task!r} with "
                              f"{len(self.task.label_names())} labels: fine-tune it first (bertology finetune)")
        self.batch_size = batch_size
        max_length = min(max_length, model.config.max_length)
        train = self.task.read(self.task.path(str(data), "train"), limit=importance_examples)
        dev = self.task.read(self.task.path(str(data), "dev"), limit=eval_examples)
        self.train = self.task.encode(tokenizer, train, max_length, train=False)
        self.dev = self.task.encode(tokenizer, dev, max_length, train=False)
        self.counts = {"importance_examples": len(train), "eval_examples": len(dev)}

    def importance_batches(self) -> Iterator[Any]:
        return self.train.batches(0, 1, drop_last=False)

    def loss(self, model: EncoderModel, batch: Any, head_mask: Tensor) -> Tensor:
        ids, mask, types, labels, head_mask = _moved(model, batch.input_ids, batch.attention_mask,
                                                     batch.token_type_ids, batch.labels, head_mask)
        out = model(ids, mask, types, head_mask=head_mask, last_layer_at=ids.new_zeros(0, 2))
        return F.cross_entropy(out.logits.float(), labels)

    @torch.no_grad()
    def metric(self, model: EncoderModel, head_mask: Tensor) -> float:
        correct = total = 0
        for batch in self.dev.batches(0, self.batch_size, drop_last=False):
            ids, mask, types, labels, moved_mask = _moved(model, batch.input_ids, batch.attention_mask,
                                                          batch.token_type_ids, batch.labels, head_mask)
            out = model(ids, mask, types, head_mask=moved_mask, last_layer_at=ids.new_zeros(0, 2))
            correct += int((out.logits.argmax(-1) == labels).sum())
            total += len(batch.labels)
        return 100.0 * correct / total


class MaskedLMData:
    """The masked-LM head on texts: a fixed, seeded 15 % of each text's non-special tokens (at least one) replaced
    by [MASK]; the loss is their cross-entropy, the metric their accuracy (x100). Importances on the first
    `importance_examples` texts, the metric on the others."""

    metric_name = "masked-token accuracy"

    def __init__(self, pretrained: Pretrained, texts: Sequence[str], *, importance_examples: int = 256,
                 max_length: int = 128, batch_size: int = 64, seed: int = 0) -> None:
        model, tokenizer = pretrained.model, pretrained.tokenizer
        self.head = next((s.name for s in model.head_specs if s.kind == "masked_lm"), None)
        if self.head is None:
            raise ConfigError("the model has no masked-LM head: give a fine-tuning task (--task) instead")
        if tokenizer is None:
            raise DataError("head importance needs the model's tokenizer; the model directory has none")
        texts = [t for t in texts if t.strip()]
        if len(texts) <= importance_examples:
            raise DataError(f"{len(texts)} non-empty texts: need more than the {importance_examples} used for "
                            "importances, to leave texts to measure the metric on")
        generator = torch.Generator().manual_seed(seed)
        max_length = min(max_length, model.config.max_length)
        specials = tokenizer.special_ids
        self.rows: list[_Rows] = []
        for start in range(0, len(texts), batch_size):
            batch = tokenizer.encode_batch(texts[start:start + batch_size], max_length=max_length)
            ids = batch.input_ids.clone()
            candidates = batch.attention_mask.bool() & ~torch.isin(ids, torch.tensor(sorted(specials)))
            chosen = (torch.rand(ids.shape, generator=generator) < 0.15) & candidates
            for row in range(len(ids)):  # at least one masked token in every text that has one
                if not chosen[row].any() and candidates[row].any():
                    chosen[row, int(candidates[row].nonzero()[0])] = True
            positions = chosen.nonzero()
            labels = ids[chosen]
            ids[chosen] = tokenizer.mask_id
            types = getattr(batch, "token_type_ids", None)
            self.rows.append(_Rows(ids, batch.attention_mask, types if types is not None else torch.zeros_like(ids),
                                   labels, positions))
        self.importance_count = importance_examples
        self.batch_size = batch_size
        self.counts = {"importance_examples": importance_examples, "eval_examples": len(texts) - importance_examples,
                       "masked_tokens": sum(len(r.labels) for r in self.rows)}  # type: ignore[arg-type]

    def _single_rows(self) -> Iterator[_Rows]:
        for rows in self.rows:
            for r in range(len(rows.input_ids)):
                positions = rows.positions[rows.positions[:, 0] == r]  # type: ignore[index]
                labels = rows.labels[rows.positions[:, 0] == r]  # type: ignore[index]
                yield _Rows(rows.input_ids[r:r + 1], rows.attention_mask[r:r + 1], rows.token_type_ids[r:r + 1],
                            labels, torch.stack([torch.zeros_like(positions[:, 1]), positions[:, 1]], 1))

    def importance_batches(self) -> Iterator[_Rows]:
        for k, row in enumerate(self._single_rows()):
            if k >= self.importance_count:
                return
            yield row

    def _logits(self, model: EncoderModel, rows: _Rows, head_mask: Tensor) -> Tensor:
        ids, mask, types, positions, head_mask = _moved(model, rows.input_ids, rows.attention_mask,
                                                        rows.token_type_ids, rows.positions, head_mask)
        out = model(ids, mask, types, masked_positions=positions, head_mask=head_mask,
                    last_layer_at=ids.new_zeros(0, 2))
        return out.head_logits[self.head].float()

    def loss(self, model: EncoderModel, batch: _Rows, head_mask: Tensor) -> Tensor:
        return F.cross_entropy(self._logits(model, batch, head_mask), *_moved(model, batch.labels))

    @torch.no_grad()
    def metric(self, model: EncoderModel, head_mask: Tensor) -> float:
        correct = total = 0
        for k, row in enumerate(self._single_rows()):
            if k < self.importance_count:
                continue
            correct += int((self._logits(model, row, head_mask).argmax(-1) == _moved(model, row.labels)[0]).sum())
            total += len(row.labels)  # type: ignore[arg-type]
        return 100.0 * correct / max(total, 1)


def existing_heads(model: EncoderModel) -> Tensor:
    """A bool [layer calls, heads] mask: True where the model has the head (False where it was pruned)."""
    require(model, HEAD_MASK, "head importance and pruning (head masks, pruned heads)")
    calls, _ = model.attention_heads()
    present = torch.zeros(len(calls), model.config.num_heads, dtype=torch.bool)
    for call, heads in enumerate(calls):
        present[call, heads] = True
    return present


def head_importance(model: EncoderModel, data: ImportanceData, head_mask: Tensor | None = None, *,
                    normalize: bool = True, show_progress: bool = False, device: Any = None,
                    dtype: str = "float32") -> Tensor:
    """I_h = mean over `data.importance_batches()` of |dL/dxi_h| at `head_mask` (ones by default), [layers, heads];
    with `normalize`, divided by the L2 norm of its layer (Michel et al.). Masked and pruned heads get 0.
    `device` (None: where the model is) and `dtype` say where and how the model runs (`bertology.device`); the
    importances come back on the CPU."""
    from tqdm.auto import tqdm

    from bertology.device import place

    where = place(model, device, dtype)
    present = existing_heads(model)
    mask = present.float() if head_mask is None else head_mask.detach().float() * present
    was_training = model.training
    model.eval()  # no dropout: the gradient of the model as it predicts
    total = torch.zeros_like(mask, dtype=torch.float64)
    count = 0
    for batch in tqdm(data.importance_batches(), desc="head importance", unit="example", disable=not show_progress):
        xi = mask.clone().requires_grad_(True)
        with where.autocast():
            loss = data.loss(model, batch, xi)
        (grad,) = torch.autograd.grad(loss, xi)
        total += grad.abs().double()
        count += 1
    model.train(was_training)
    if count == 0:
        raise DataError("no examples to compute head importances on")
    importance = (total / count) * (mask > 0)
    if normalize:
        norms = importance.pow(2).sum(-1, keepdim=True).sqrt()
        importance = importance / norms.clamp(min=1e-20)
    return importance.float()


@dataclass
class PruningStep:
    share: float  # of the model's heads removed so far
    removed: list[tuple[int, int]]  # (layer, head) removed at this step
    metric: float
    heads: int  # the model's heads before pruning


def pruning_curve(model: EncoderModel, data: ImportanceData, *, step: float = 0.1, max_share: float = 0.9,
                  show_progress: bool = False, device: Any = None, dtype: str = "float32") -> list[PruningStep]:
    """Iterative pruning by masking: the metric with no head removed, then after removing, at each step, the least
    important remaining heads (importances recomputed with the removed ones masked) until `max_share` of the
    model's heads are gone. `device` (None: where the model is) and `dtype` say where and how the model runs
    (`bertology.device`)."""
    if not 0 < step <= 1 or not 0 < max_share <= 1:
        raise ConfigError(f"step {step} and max_share {max_share} must lie in (0, 1]")
    from bertology.device import place

    where = place(model, device, dtype)

    def metric(mask: Tensor) -> float:
        with where.autocast():
            return data.metric(model, mask)

    present = existing_heads(model)
    total = int(present.sum())
    mask = present.float()
    steps = [PruningStep(0.0, [], metric(mask), total)]
    removed = 0
    k = 1
    while True:
        target = min(int(round(min(k * step, max_share) * total)), total)
        if target <= removed:
            if k * step >= max_share:
                break
            k += 1
            continue
        importance = head_importance(model, data, mask, show_progress=show_progress, dtype=where.dtype)
        importance[mask == 0] = math.inf
        order = torch.argsort(importance.flatten())[: target - removed]
        chosen = [(int(i) // mask.shape[1], int(i) % mask.shape[1]) for i in order]
        for layer, head in chosen:
            mask[layer, head] = 0.0
        removed = target
        steps.append(PruningStep(removed / total, chosen, metric(mask), total))
        if k * step >= max_share - 1e-9:
            break
        k += 1
    return steps


def heads_removed_at(steps: Sequence[PruningStep], share: float) -> dict[int, list[int]]:
    """The heads the curve had removed once `share` of them were gone: the steps up to round(share x heads)."""
    removed: dict[int, list[int]] = {}
    count = 0
    for s in steps:
        count += len(s.removed)
        if count > round(share * s.heads):
            break
        for layer, head in s.removed:
            removed.setdefault(layer, []).append(head)
    return {layer: sorted(heads) for layer, heads in sorted(removed.items())}


def prunable_share(steps: Sequence[PruningStep], keep: float = 0.99) -> float:
    """The largest share removed while the metric stays at least `keep` times the unpruned one."""
    base = steps[0].metric
    best = 0.0
    for s in steps:
        if s.metric >= keep * base:
            best = max(best, s.share)
        else:
            break
    return best


def prune_model(pretrained: Pretrained, heads: dict[int, list[int]], out_dir: str | Path | None = None) -> Pretrained:
    """Remove `heads` (layer -> heads, original numbering) from the model for good, and save it to `out_dir` when
    given (transformers' layout when it applies, `pruned_heads` in config.json) by `save_pruned`, whose rules for
    the folder are checked before the model is changed."""
    if out_dir is not None:
        check_pruned_output(out_dir)
    pretrained.model.prune_heads(heads)
    if out_dir is not None:
        save_pruned(pretrained, out_dir, {"pruned_heads": {str(k): v for k, v in heads.items()}})
    return pretrained


PRUNING_FILE = "pruning.json"
# Files of a model directory in either layout: one left beside a pruned model of the other layout would make the
# directory ambiguous, so writing into a folder that holds one is refused rather than mixing two models.
MODEL_FILES = ("config.json", "bertology.json", "model.safetensors", "model.safetensors.index.json",
               "pytorch_model.bin", "tokenizer.json", "vocab.txt", "vocab.json", "merges.txt",
               "tokenizer_config.json", "special_tokens_map.json")


def check_pruned_output(out_dir: str | Path, overwrite: bool = False) -> Path:
    """Where `save_pruned` may write, checked before any work (see `bertology.io.check_output_directory`)."""
    return check_output_directory(out_dir, PRUNING_FILE, "a pruned model of `bertology heads prune`", overwrite)


def save_pruned(pretrained: Pretrained, out_dir: str | Path, record: dict[str, Any], overwrite: bool = False) -> Path:
    """Write a pruned model and its `pruning.json` (`record` plus the names of the files written) into `out_dir`:
    a new or empty directory, an earlier output of this function (whose files it replaces), or with `overwrite` any
    directory, whose other files are kept. Files are renamed in one by one (`bertology.io.files_into`), so no file
    this function did not write is ever removed; `--out .` works."""
    from bertology.model.checkpoint import write_model_files

    out = check_pruned_output(out_dir, overwrite)
    previous: list[str] = []
    if (out / PRUNING_FILE).is_file():
        try:
            listed = json.loads((out / PRUNING_FILE).read_text(encoding="utf-8")).get("files", [])
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            listed = []
        previous = [name for name in listed if isinstance(name, str) and "/" not in name and name not in ("..", ".")]
    with files_into(out) as tmp:
        write_model_files(pretrained.model, tmp)
        if pretrained.tokenizer is not None:
            pretrained.tokenizer.save(tmp)
        written = sorted(p.name for p in tmp.iterdir())
        stale = [name for name in MODEL_FILES if (out / name).exists() and name not in written and name not in previous]
        if stale:
            raise ConfigError(f"--out {out}: holds {', '.join(stale)} of another model, which this pruned model "
                              "would not replace; choose a new or empty directory")
        write_numbers(tmp / PRUNING_FILE, {**record, "files": [*written, PRUNING_FILE]})
    for name in previous:  # what an earlier prune wrote there and this one did not
        if name not in written and name != PRUNING_FILE and (out / name).is_file():
            (out / name).unlink()
    return out


def parameter_count(model: EncoderModel) -> int:
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------------------------------ outputs


def plot_curve(steps: Sequence[PruningStep], metric_name: str, path: str | Path, importance: Tensor) -> Path:
    """One PNG: the metric against the share of heads removed, beside the importance heat map."""
    from bertology.analysis.attention import head_heat_map, pyplot, save_png

    fig, (left, right) = pyplot().subplots(1, 2, figsize=(10, 3.6), dpi=80)
    left.plot([100 * s.share for s in steps], [s.metric for s in steps], marker="o")
    left.set_xlabel("heads removed (%)")
    left.set_ylabel(metric_name)
    left.set_title("iterative pruning by importance")
    left.grid(alpha=0.3)
    head_heat_map(fig, right, importance.numpy(), "head importance (layer-normalised)")
    return save_png(fig, path)


def analyze_importance(pretrained: Pretrained, data: ImportanceData, out_dir: str | Path, *, step: float = 0.1,
                       max_share: float = 0.9, keep: float = 0.99, show_progress: bool = False, device: Any = None,
                       dtype: str = "float32") -> dict[str, Any]:
    """Importances at the full model, the pruning curve, and the share prunable at `keep` x the unpruned metric;
    writes `importance.json` and `importance.png` to `out_dir`. `device` (None: where the model is) and `dtype`
    say where and how the model runs (`bertology.device`)."""
    from bertology.device import place

    model = pretrained.model
    where = place(model, device, dtype)
    importance = head_importance(model, data, show_progress=show_progress, dtype=where.dtype)
    steps = pruning_curve(model, data, step=step, max_share=max_share, show_progress=show_progress,
                          dtype=where.dtype)
    present = existing_heads(model)
    grid = [[round(float(v), 6) if bool(p) else None for v, p in zip(row, prow)]
            for row, prow in zip(importance.tolist(), present)]
    numbers = {
        "metric": data.metric_name,
        "data": getattr(data, "counts", {}),
        "heads": int(present.sum()),
        "importance": grid,
        "indexing": "layers and heads are 0-based",
        "curve": [{"share_removed": round(s.share, 4), "metric": round(s.metric, 4),
                   "removed": [f"{layer}-{head}" for layer, head in s.removed]} for s in steps],
        "keep": keep,
        "prunable_share": prunable_share(steps, keep),
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_numbers(out / "importance.json", numbers)
    plot_curve(steps, data.metric_name, out / "importance.png", importance)
    return numbers


def report_section(pretrained: Pretrained, out_dir: str | Path, data_dir: str | Path, *, quick: bool = False,
                   model_dir: str | None = None, task: str | None = None, show_progress: bool = False) -> Section:
    """Head importance and the pruning curve: on `task` (a fine-tuned classifier; GLUE under `data_dir/glue`), or
    with the masked-LM head on UD English-EWT dev texts; otherwise there is nothing to take a gradient of."""
    from bertology.analysis.report import AnalysisUnavailable

    if BLOCKS not in capabilities(pretrained.model):
        raise AnalysisUnavailable(f"the model ({model_kind(pretrained.model)}) has no attention heads (no "
                                  "transformer blocks)")
    model = pretrained.model
    out = Path(out_dir) / "importance"
    examples = 64 if quick else 256
    step = 0.25 if quick else 0.1
    model_arg = model_dir or "MODEL"
    if task is not None:
        glue = Path(data_dir) / "glue"
        data: ImportanceData = TaskData(pretrained, task, glue, importance_examples=examples,
                                        eval_examples=200 if quick else None)
        command = shell_command("bertology", "heads", "importance", "--model", model_arg, "--task", task, "--data",
                                glue, "--out", out, "--examples", examples, "--step", step)
    elif any(s.kind == "masked_lm" for s in model.head_specs):
        from bertology.analysis.ud import read_split

        ud = Path(data_dir) / "ud-english-ewt"
        if not ud.is_dir():
            raise FileNotFoundError(f"{ud}: UD English-EWT (the texts for the masked-LM loss) is not there")
        texts = [s.text for s in read_split(ud, "dev", examples * 2)]
        data = MaskedLMData(pretrained, texts, importance_examples=examples)
        command = shell_command("bertology", "heads", "importance", "--model", model_arg, "--ud", ud, "--out", out,
                                "--examples", examples, "--step", step)
    else:
        from bertology.analysis.report import AnalysisUnavailable

        raise AnalysisUnavailable("the model has neither a fine-tuned classifier (give its task: bertology analyze --task "
                          "NAME) nor a masked-LM head: no loss to take the gradient of")
    numbers = analyze_importance(pretrained, data, out, step=step, show_progress=show_progress)
    return Section(
        headline={"heads": numbers["heads"], "metric": numbers["metric"],
                  f"share of heads prunable at >= {numbers['keep']:.0%} of the unpruned metric":
                      numbers["prunable_share"]},
        name="importance",
        title="Head importance and pruning (Michel et al. 2019)",
        numbers={"metric": numbers["metric"], "data": numbers["data"], "heads": numbers["heads"],
                 "metric by share of heads removed": {f"{c['share_removed']:.0%}": c["metric"]
                                                      for c in numbers["curve"]},
                 f"share prunable at >= {numbers['keep']:.0%} of the unpruned metric": numbers["prunable_share"]},
        figures=[out / "importance.png"],
        command=command,
        notes=["Importance: mean absolute gradient of the loss w.r.t. each head's mask variable, per example, "
               "normalised by layer (L2). Pruning masks the least important remaining heads step by step, "
               "recomputing importances after each step.",
               f"Full numbers, with the heads removed at each step, in {out / 'importance.json'}; a model with "
               "them removed for good: bertology heads prune."],
    )


def parse_heads(text: str) -> dict[int, list[int]]:
    """"LAYER:HEAD,HEAD;LAYER:HEAD" (0-based) as a layer -> heads mapping; a ConfigError naming the bad part."""
    heads: dict[int, list[int]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        layer, sep, rest = part.partition(":")
        try:
            if not sep:
                raise ValueError
            heads.setdefault(int(layer), []).extend(int(h) for h in rest.split(",") if h.strip())
        except ValueError:
            raise ConfigError(f"--heads: {part!r} is not LAYER:HEAD,HEAD (0-based integers)") from None
    if not heads:
        raise ConfigError(f"--heads: {text!r} names no head")
    return heads


__all__ = ["TaskData", "MaskedLMData", "head_importance", "pruning_curve", "heads_removed_at", "prunable_share",
           "prune_model", "analyze_importance", "parse_heads", "existing_heads", "save_pruned",
           "check_pruned_output"]
