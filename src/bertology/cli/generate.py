"""`bertology generate`: continue texts with a decoder, or transform them with an encoder-decoder
(bertology.generate)."""

from __future__ import annotations

import argparse

from bertology.cli._types import seed
from bertology.device import add_device_arguments, placement_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="generate text from a decoder (GPT-style) or an encoder-decoder (T5/BART-style)",
        description="Print one generated text per TEXT, on one line each (line breaks written as \\n and \\r): "
        "a decoder's prompt and its continuation, an encoder-decoder's output. Greedy by default; --num-beams for "
        "beam search, --do-sample for sampling. Stops at the model's EOS token or after --max-new-tokens.",
    )
    parser.add_argument("texts", nargs="+", metavar="TEXT")
    parser.add_argument("--model", required=True, metavar="DIR", help="model directory with its tokenizer")
    parser.add_argument("--max-new-tokens", type=int, default=20, metavar="N",
                        help="at most N new tokens (default: 20)")
    parser.add_argument("--num-beams", type=int, default=1, metavar="N", help="beam search with N beams (default: 1)")
    parser.add_argument("--length-penalty", type=float, default=1.0,
                        help="beam search: a finished beam's log-probability / length ** this (default: 1.0)")
    parser.add_argument("--early-stopping", action="store_true",
                        help="beam search: stop a text once it has --num-beams finished hypotheses")
    parser.add_argument("--do-sample", action="store_true", help="sample the tokens instead of choosing the best")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling: divide the logits by this")
    parser.add_argument("--top-k", type=int, default=None, help="sampling: only from the K most probable tokens")
    parser.add_argument("--top-p", type=float, default=None,
                        help="sampling: only from the most probable tokens holding probability P (0 < P <= 1)")
    parser.add_argument("--seed", type=seed, default=None, help="sampling: the random seed (default: unseeded)")
    parser.add_argument("--prefix-lm", action="store_true",
                        help="a decoder trained as a prefix LM: read the prompt in both directions")
    parser.add_argument("--index", metavar="DIR", help="a RAG model (finetune --task rag): search this dense index "
                        "instead of the one its rag.json records; each TEXT is a question")
    parser.add_argument("--k", type=int, metavar="N", help="a RAG model: passages per question (default: its k)")
    parser.add_argument("--marginalise", choices=("token", "sequence"),
                        help="a RAG model: RAG-token (the marginal next-token distribution, greedy or beam search) "
                        "or RAG-sequence (thorough decoding: a beam search per passage, the candidates rescored by "
                        "the marginal); default: as it was trained")
    add_device_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from bertology.errors import CheckpointError, ConfigError
    from bertology.generation import generate_texts
    from bertology.model import GENERATES, capabilities, load_model
    from bertology.model.checkpoint import TOKENIZER_FILES
    from bertology.tokenization import load_tokenizer

    from bertology.retrieval.rag import is_rag

    where = placement_from_args(args)
    if is_rag(args.model):
        return run_rag(args, where)
    for flag, value in (("--index", args.index), ("--k", args.k), ("--marginalise", args.marginalise)):
        if value is not None:
            raise ConfigError(f"{flag}: for a RAG model (finetune --task rag); {args.model} has no rag.json")
    model = load_model(args.model)
    if GENERATES not in capabilities(model):  # before the tokenizer: ELMo's is a word list
        raise ConfigError(f"--model {args.model}: generation needs a decoder (GPT-2) or an encoder-decoder (T5, "
                          f"BART); this is a {getattr(model.config, 'family', type(model).__name__)} model "
                          f"({type(model).__name__})")
    if not any((Path(args.model) / name).is_file() for name in TOKENIZER_FILES):
        raise CheckpointError(f"{args.model}: no tokenizer files next to the model")
    tokenizer = load_tokenizer(args.model)
    where.move(model)
    with where.autocast():
        texts = generate_texts(model, tokenizer, args.texts, max_new_tokens=args.max_new_tokens,
                               num_beams=args.num_beams, do_sample=args.do_sample, temperature=args.temperature,
                               top_k=args.top_k, top_p=args.top_p, length_penalty=args.length_penalty,
                               early_stopping=args.early_stopping, seed=args.seed, prefix_lm=args.prefix_lm)
    for text in texts:
        print(text.replace("\r", "\\r").replace("\n", "\\n"))
    return 0


def run_rag(args: argparse.Namespace, where: object) -> int:
    """A RAG model's answers to the questions: retrieval, then RAG-token or RAG-sequence decoding."""
    from bertology.errors import ConfigError
    from bertology.retrieval.rag import load_rag

    unused = [flag for flag, on in (("--do-sample", args.do_sample), ("--top-k", args.top_k is not None),
                                    ("--top-p", args.top_p is not None), ("--prefix-lm", args.prefix_lm),
                                    ("--temperature", args.temperature != 1.0),
                                    ("--length-penalty", args.length_penalty != 1.0),
                                    ("--early-stopping", args.early_stopping), ("--seed", args.seed is not None)) if on]
    if unused:
        raise ConfigError(f"{unused[0]}: a RAG model ({args.model}) decodes by greedy or beam search only "
                          "(--num-beams, --max-new-tokens, --k, --marginalise)")
    rag = load_rag(args.model, args.index)
    where.move(rag.generator)  # type: ignore[attr-defined]
    where.move(rag.retriever)  # type: ignore[attr-defined]
    with where.autocast():  # type: ignore[attr-defined]
        answers = rag.answer(args.texts, k=args.k, marginalise=args.marginalise, num_beams=args.num_beams,
                             max_new_tokens=args.max_new_tokens)
    for answer in answers:
        print(answer.text.replace("\r", "\\r").replace("\n", "\\n"))
    return 0
