"""What a pretrained T5 fills in, and whether its decoder reads its encoder.

    python benchmarks/t5_fillings.py --model runs/t5-tiny/model            # the model configs/t5-tiny.yaml writes
    python benchmarks/t5_fillings.py --model DIR --heldout FILE --sentences 100

Three measurements, printed as markdown:

1. **Source sensitivity**: held-out sentences span-corrupted as in pretraining (15 % noise, spans of mean 3, seed
   fixed), the decoder's cross-entropy on the span tokens (sentinels and ``</s>`` left out) given each row's own
   source and given the next row's. A decoder that ignores its encoder scores both alike; the gap is what the
   source tells it.
2. **Cloze fillings**: ``fill_mask``'s five best fillings of ``<extra_id_0>`` in five sentences (``CLOZE``), and
   whether one of the words each expects is among them.
3. **Held-out words**: ``--sentences`` sentences of the held-out text (6 to 30 words) with one word (letters only,
   drawn with ``--seed``) replaced by ``<extra_id_0>``: how often ``fill_mask``'s first filling is that word
   (lower-cased, surrounding spaces dropped), and how often it is among the five.

The held-out text defaults to the document the run held out (its ``run_config.json`` beside the model directory
or a checkpoint's folder:
the corpus files in reading order and ``data.heldout_documents`` drawn with ``run.seed``, as ``prepare_corpus``
draws them). Everything runs on ``--threads`` threads (default 1); CPU seconds are printed.
"""

from __future__ import annotations

# bertology before numpy and torch (OpenMP's waiting policy; see benchmarks/common.py).
import bertology  # isort: skip

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from common import to_batch  # noqa: E402

from bertology.data.shards import select_heldout  # noqa: E402
from bertology.data.span_corruption import SpanCorruptionConfig, corrupt  # noqa: E402
from bertology.data.span_masking import row_key_generator  # noqa: E402
from bertology.objectives.fill_mask import fill_mask  # noqa: E402
from bertology.text.corpus import list_corpus_files, read_documents  # noqa: E402

# Five cloze sentences in the books' English, each with the words that fit it.
CLOZE = (
    ("The old man <extra_id_0> to the house and sat down.", ("went", "came", "walked", "returned", "ran")),
    ("It was a dark and cold <extra_id_0>.", ("night", "day", "morning", "evening", "winter")),
    ("She opened the <extra_id_0> and looked out.", ("door", "window", "gate", "box", "letter")),
    ("He took off his <extra_id_0> and laid it on the table.", ("hat", "coat", "cap", "sword", "gloves")),
    ("I do not know what you <extra_id_0>.", ("mean", "say", "want", "think", "are", "do")),
)
WORD = re.compile(r"[A-Za-z]+")


def heldout_file(model_dir: Path) -> Path:
    """The document the run that wrote ``model_dir`` held out (one file is one document in the text format), as
    its run_config.json records the corpus and the draw."""
    found = [d / "run_config.json" for d in (model_dir.parent, model_dir.parent.parent)
             if (d / "run_config.json").is_file()]  # a run's model/ or checkpoints/step-N/
    if not found:
        raise SystemExit(f"{model_dir}: no run_config.json beside it or its folder; give --heldout FILE")
    config = json.loads(found[0].read_text())
    data = config["data"]
    count = data.get("heldout_documents")
    if not count:
        raise SystemExit(f"{found[0]}: data.heldout_documents is not set; give --heldout FILE")
    root = found[0].parent
    corpus = data["corpus"] if isinstance(data["corpus"], list) else [data["corpus"]]
    files = list_corpus_files(corpus, data.get("format"))
    mask = select_heldout(len(files), count, int(config["run"]["seed"]))
    held = [f for f, m in zip(files, mask) if m]
    if len(held) != 1:
        raise SystemExit(f"{root}: {len(held)} held-out documents; give --heldout FILE")
    return Path(held[0])


def sentences_of(path: Path, encoding: str) -> list[str]:
    """The sentences of a text file as the corpus reader splits them (format text), 6 to 30 words each, with a
    word of letters."""
    return [sentence for document in read_documents(str(path), format="text", encoding=encoding)
            for sentence in document if 6 <= len(sentence.split()) <= 30 and WORD.search(sentence)]


def source_sensitivity(model, tokenizer, sentences: list[str], rows: int, seed: int) -> tuple[float, float, int]:
    """(loss with the own source, loss with the next row's source, span tokens scored) on ``rows`` sentences."""
    framing = tokenizer.framing
    sentinels = np.asarray(framing.sentinels, dtype=np.int64)
    special = set(int(s) for s in sentinels) | {tokenizer.sep_id}
    config = SpanCorruptionConfig(noise_density=0.15, mean_noise_span_length=3.0)
    sources, targets = [], []
    for i, sentence in enumerate(sentences[:rows]):
        ids = np.asarray(tokenizer.encode(sentence).ids, dtype=np.int64)
        text = ids[:-1] if len(ids) and ids[-1] == tokenizer.sep_id else ids
        if len(text) < 4:
            continue
        source, target = corrupt(text, config, sentinels, row_key_generator(seed * 100_003 + i))
        sources.append(np.append(source, tokenizer.sep_id))
        targets.append(np.append(target, tokenizer.sep_id))

    source_batch = to_batch([s.tolist() for s in sources], tokenizer.pad_id)
    target_batch = to_batch([s.tolist() for s in targets], tokenizer.pad_id)
    src, src_mask = source_batch.input_ids, source_batch.attention_mask
    tgt, tgt_mask = target_batch.input_ids, target_batch.attention_mask
    labels = tgt.masked_fill(tgt_mask == 0, -100)
    scored = (tgt_mask == 1) & ~torch.isin(tgt, torch.tensor(sorted(special)))

    def loss(source: torch.Tensor, mask: torch.Tensor) -> float:
        with torch.no_grad():
            logits = model(source, mask, labels=labels).logits
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels.clamp(min=0), reduction="none")
        return float(nll[scored].mean())

    return loss(src, src_mask), loss(src.roll(1, 0), src_mask.roll(1, 0)), int(scored.sum())


def fillings(model, tokenizer, text: str, max_new_tokens: int) -> list[str]:
    return [p.token.strip() for p in fill_mask(model, tokenizer, text, top_k=5, max_new_tokens=max_new_tokens)[0]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path, help="a T5 model directory (a run's model/)")
    parser.add_argument("--heldout", type=Path, help="the held-out text (default: the run's held-out document)")
    parser.add_argument("--encoding", default="latin-1")
    parser.add_argument("--sentences", type=int, default=100, help="held-out sentences with one word to fill")
    parser.add_argument("--rows", type=int, default=256, help="held-out rows for the source sensitivity")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=20, help="the longest target fill-mask generates")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.process_time()
    pretrained = bertology.load(args.model)
    model, tokenizer = pretrained.model.eval(), pretrained.tokenizer
    heldout = args.heldout or heldout_file(args.model)
    sentences = sentences_of(heldout, args.encoding)
    if len(sentences) < max(args.sentences, 2):
        raise SystemExit(f"{heldout}: {len(sentences)} sentences of 6 to 30 words; fewer than --sentences")
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(sentences))

    own, other, tokens = source_sensitivity(model, tokenizer, [sentences[i] for i in order[-args.rows:]],
                                            args.rows, args.seed)
    print(f"## T5 fillings: {args.model} (held-out text {heldout.name})\n")
    print(f"Source sensitivity ({tokens} span tokens of {min(args.rows, len(sentences))} held-out rows): "
          f"cross-entropy {own:.3f} with the own source, {other:.3f} with the next row's (gap {other - own:.3f})\n")

    print("| cloze sentence | five best fillings | an expected word among them |")
    print("|---|---|---|")
    hits = 0
    for text, expected in CLOZE:
        found = fillings(model, tokenizer, text, args.max_new_tokens)
        hit = any(f.lower() in expected for f in found)
        hits += hit
        shown = " / ".join(f'"{f}"' if f else "(empty filling)" for f in found)
        print(f"| {text.replace('<extra_id_0>', '___')} | {shown} | {'yes' if hit else 'no'} |")
    print(f"\nCloze: {hits} of {len(CLOZE)} sentences with an expected word in the top five\n")

    rank1 = top5 = 0
    distinct_first: set[str] = set()
    for i in order[:args.sentences]:
        words = list(WORD.finditer(sentences[i]))
        pick = words[int(rng.integers(len(words)))]
        text = sentences[i][:pick.start()] + "<extra_id_0>" + sentences[i][pick.end():]
        found = [f.lower() for f in fillings(model, tokenizer, text, args.max_new_tokens)]
        distinct_first.add(found[0] if found else "")
        rank1 += bool(found) and found[0] == pick.group().lower()
        top5 += pick.group().lower() in found
    print(f"Held-out words: {rank1} of {args.sentences} at rank 1, {top5} in the top five; "
          f"{len(distinct_first)} distinct first fillings\n")
    print(f"CPU seconds: {time.process_time() - start:.1f} ({args.threads} thread(s))")


if __name__ == "__main__":
    main()
