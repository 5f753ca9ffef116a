"""A tiny random BERT with a WordPiece vocabulary of the given words, saved as a model directory: the base that the
fine-tuning tests train (a cue word decides each label, so a 2-layer model learns it in seconds)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertology.model import EncoderModel, Pretrained, preset
from bertology.tokenization import train_tokenizer


# The cue words: a sentence is positive when it holds a GOOD word, negative when it holds a BAD one.
GOOD, BAD, FILL = ["good", "great", "nice"], ["bad", "awful", "dull"], ["the", "film", "plot", "was", "very", "a"]


def cue_sentence(rng, positive) -> str:
    """2-6 filler words with one cue word of the label's kind inserted at a random place."""
    words = list(rng.choice(FILL, int(rng.integers(2, 7))))
    words.insert(int(rng.integers(len(words) + 1)), str(rng.choice(GOOD if positive else BAD)))
    return " ".join(words)


def cue_sst2(root: Path, seed: int = 0, sizes: tuple[tuple[str, int], ...] = (("train", 160), ("dev", 32))) -> Path:
    """SST-2's files (root/SST-2/{train,dev}.tsv) of cue sentences with random labels; returns `root`."""
    rng = np.random.default_rng(seed)
    (root / "SST-2").mkdir(parents=True, exist_ok=True)
    for split, n in sizes:
        rows = [(cue_sentence(rng, label), label) for label in rng.integers(0, 2, n)]
        (root / "SST-2" / f"{split}.tsv").write_text(
            "sentence\tlabel\n" + "".join(f"{s} \t{label}\n" for s, label in rows), encoding="utf-8")
    return root


def strategy_trains_saves_and_predicts(run: Any, data: Path, scratch: Path) -> Any:
    """Fine-tune SST-2 by `run` (a FinetuneConfig naming its strategy) on the files of `cue_sst2(data)`: a part of
    the model trains, not all of it, and `bertology predict` on the saved model repeats the run's dev predictions
    (written under `scratch`). Returns the run's result."""
    from bertology.cli.main import main
    from bertology.recipes.finetune import finetune

    result = finetune(run)
    assert 0 < result.trainable.trainable < result.trainable.total, (run.strategy.kind, result.trainable)
    out = Path(run.run.output_dir)
    assert main(["predict", "--model", str(out / "model"), "--task", "sst2", "--input",
                 str(data / "SST-2" / "dev.tsv"), "--output", str(scratch / "p.tsv")]) == 0
    assert (scratch / "p.tsv").read_text() == (out / "dev_predictions.tsv").read_text()
    return result


def save_tiny_model(directory: Path, words: Iterable[str], vocab_size: int = 40) -> Path:
    tokenizer = train_tokenizer(iter(list(words)), "wordpiece", vocab_size, show_progress=False, min_frequency=1)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=2, hidden_size=32, num_heads=2,
                    intermediate_size=64, max_position_embeddings=64)
    model = EncoderModel(config)
    model.init_weights(torch.Generator().manual_seed(0))
    Pretrained(model, tokenizer).save(directory)
    return directory


def family_tokenizer(style: str, texts: list[str]):
    """A byte-level BPE (gpt2, bart) or Unigram (t5, with three sentinels; xlnet, with its seven specials first)
    tokenizer of the family's framing, trained in memory on `texts`."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from bertology.tokenization import Tokenizer
    from framing_helpers import specials

    if style == "xlnet":  # a Unigram model of the texts' words and letters (the trainer keeps letters alone here)
        words = sorted({word for text in texts for word in text.split()})
        letters = sorted({letter for word in words for letter in word})
        pieces = ["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "\u2581", *letters,
                  *(f"\u2581{word}" for word in words)]
        backend = tokenizers.Tokenizer(models.Unigram([(piece, -1.0) for piece in pieces], unk_id=0))
        backend.pre_tokenizer = pre_tokenizers.Metaspace()
        backend.decoder = decoders.Metaspace()
        backend.add_special_tokens(pieces[:7])
    elif style == "t5":  # bertology's trainer: its Unigram pieces are scored in a fixed order, so the vocabulary
        # (and the random T5 built on it) is the same in every process, as the raw trainer's is not
        from bertology.tokenization import train_tokenizer

        return train_tokenizer(iter(texts), "unigram", 200, style="t5", sentinels=3, show_progress=False)
    else:
        names = ["<|endoftext|>"] if style == "gpt2" else ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        backend = tokenizers.Tokenizer(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        backend.train_from_iterator(texts, trainers.BpeTrainer(
            vocab_size=300, special_tokens=names, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False))
    return Tokenizer(backend, style=style, specials=specials(style))


def save_family_model(directory: Path, style: str, texts: list[str], positions: int = 64) -> Path:
    """A tiny random GPT-2, BART, T5 or XLNet (its LM head model) built and saved by transformers, with a tokenizer
    trained on `texts`, as a bertology model directory (loaded from transformers' files, saved with the tokenizer)."""
    import transformers

    from bertology.model import load_model

    tokenizer = family_tokenizer(style, texts)
    framing, vocab = tokenizer.framing, tokenizer.vocab_size
    torch.manual_seed(0)
    if style == "gpt2":
        hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=vocab, n_positions=positions, n_embd=32, n_layer=2, n_head=2, bos_token_id=framing.pad_id,
            eos_token_id=framing.pad_id, pad_token_id=framing.pad_id))
    elif style == "bart":
        hf = transformers.BartForConditionalGeneration(transformers.BartConfig(
            vocab_size=vocab, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=positions,
            pad_token_id=framing.pad_id, bos_token_id=framing.cls_id, eos_token_id=framing.sep_id,
            decoder_start_token_id=framing.sep_id, forced_bos_token_id=None))
    elif style == "xlnet":
        hf = transformers.XLNetLMHeadModel(transformers.XLNetConfig(
            vocab_size=vocab, d_model=32, n_layer=2, n_head=2, d_inner=64, pad_token_id=framing.pad_id,
            bos_token_id=1, eos_token_id=2, mem_len=None))
    else:
        hf = transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=vocab, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
            relative_attention_num_buckets=8, pad_token_id=framing.pad_id, eos_token_id=framing.sep_id,
            decoder_start_token_id=framing.pad_id))
    hf.save_pretrained(directory / "hf")
    Pretrained(load_model(directory / "hf"), tokenizer).save(directory / "model")
    return directory / "model"


def toy_conll(root, seed=0, sizes=(("eng.train", 160), ("eng.testa", 40))):
    """CoNLL-2003-style files where fixed words are entities: 'Paris'/'Berlin' LOC, 'John Smith' a two-word PER."""
    import numpy as np

    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for name, n in sizes:
        lines = ["-DOCSTART- -X- O O", ""]
        for _ in range(n):
            words = [(w, "O") for w in rng.choice(["the", "a", "visit", "to", "met", "in", "said"], 4)]
            entity = [[("Paris", "I-LOC")], [("Berlin", "I-LOC")], [("John", "I-PER"), ("Smith", "I-PER")]][
                int(rng.integers(3))]
            at = int(rng.integers(len(words) + 1))
            lines += [f"{w} X X {t}" for w, t in words[:at] + entity + words[at:]] + [""]
        (root / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def name_conll(root, seed=1, words=(2, 8), sizes=(("eng.train", 160), ("eng.testa", 24))):
    """CoNLL-2003-style files of filler words with one lower-cased name each: john and mary are I-PER, paris and
    london I-LOC. `words`: the filler count, a fixed int or a (low, high) range drawn per sentence."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for split, n in sizes:
        lines = ["-DOCSTART- -X- -X- O", ""]
        for _ in range(n):
            count = words if isinstance(words, int) else int(rng.integers(*words))
            sentence = list(rng.choice(["the", "film", "was", "met", "went", "to", "in", "a"], count))
            name = str(rng.choice(["john", "mary", "paris", "london"]))
            sentence.insert(int(rng.integers(len(sentence) + 1)), name)
            tag = "I-PER" if name in ("john", "mary") else "I-LOC"
            lines += [f"{w} NN I-NP {tag if w == name else 'O'}" for w in sentence] + [""]
        (root / split).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def key_squad(path: Path, fill: list[str], cities: list[str], words: tuple[int, int], articles: int,
              paragraphs: int, seed: int = 0) -> Path:
    """A SQuAD v1.1 file whose answer is the city after 'key is' in a paragraph of `words` (low, high) filler words
    (the cities occur nowhere else): a question a small model learns in a few steps."""
    rng = np.random.default_rng(seed)
    data = []
    for a in range(articles):
        paras = []
        for p in range(paragraphs):
            context_words = list(rng.choice(fill, int(rng.integers(*words))))
            city = str(rng.choice(cities))
            context_words[int(rng.integers(len(context_words) + 1)):0] = ["key", "is", city]
            context = " ".join(context_words)
            start = context.index(f"key is {city}") + len("key is ")
            paras.append({"context": context, "qas": [{"id": f"{a}-{p}", "question": "what is the key",
                                                       "answers": [{"text": city, "answer_start": start}]}]})
        data.append({"title": f"article {a}", "paragraphs": paras})
    path.write_text(json.dumps({"version": "1.1", "data": data}, ensure_ascii=False), encoding="utf-8")
    return path
