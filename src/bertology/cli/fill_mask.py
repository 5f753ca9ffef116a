"""`bertology fill-mask`: the top predictions of a masked-LM model at each mask token of a text, or an
encoder-decoder's generated fillings (T5's sentinel spans, BART's text at its <mask> tokens)."""

from __future__ import annotations

import argparse

from bertology.device import add_device_arguments, placement_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "fill-mask",
        help="predict the tokens at the mask tokens of a text",
        description="Print the most probable tokens (with probabilities) at each mask token of TEXT; use the "
        "model's own mask token ([MASK] for BERT, <mask> for RoBERTa). An encoder-decoder generates the fillings by "
        "beam search: T5 a span of any length at each sentinel (<extra_id_0>, <extra_id_1>, ...), BART the whole "
        "text with its <mask> spans filled; each filling is listed once (an empty span as '(empty filling)'), with "
        "the probability of the most probable generated sequence that gives it.",
    )
    parser.add_argument("text", metavar="TEXT")
    parser.add_argument("--model", required=True, metavar="PATH", help="model directory with its tokenizer")
    parser.add_argument("--top-k", type=int, default=5, help="predictions per mask (default: 5)")
    parser.add_argument("--max-new-tokens", type=int, default=20,
                        help="an encoder-decoder's longest generated sequence, in tokens (default: 20)")
    add_device_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertology.errors import CheckpointError
    from bertology.model.checkpoint import load
    from bertology.objectives.fill_mask import fill_mask

    where = placement_from_args(args)
    pretrained = load(args.model)
    if pretrained.tokenizer is None:
        raise CheckpointError(f"{args.model}: no tokenizer files next to the model")
    results = fill_mask(pretrained.model, pretrained.tokenizer, args.text, top_k=args.top_k, device=where.device,
                        dtype=where.dtype, max_new_tokens=args.max_new_tokens)
    for number, predictions in enumerate(results, start=1):
        if len(results) > 1:
            print(f"mask {number}:")
        for prediction in predictions:
            # A generated span can be empty (a T5 that emits the next sentinel at once): say so, not a blank cell.
            filling = prediction.token if prediction.token.strip() else "(empty filling)"
            print(f"{prediction.probability:.4f}\t{filling}\t{prediction.sequence}")
    return 0
