"""`bertology wsd fit | predict | score`: word sense disambiguation by the nearest sense vector (LMMS 1-NN)."""

from __future__ import annotations

import argparse
import json
import sys

from bertology.cli.embed import layers_argument
from bertology.device import add_device_arguments, device_options


def register(subparsers: argparse._SubParsersAction) -> None:
    from bertology.analysis import wsd as defaults  # numpy only; torch is imported by the commands that run

    parser = subparsers.add_parser(
        "wsd",
        help="word sense disambiguation by the nearest sense vector (LMMS 1-NN)",
        description="Fit sense vectors on SemCor, disambiguate a WSD framework data file, score a key file.",
    )
    commands = parser.add_subparsers(dest="wsd_command", required=True)

    fit = commands.add_parser(
        "fit", help="mean contextual vector of each SemCor-tagged sense",
        description="A sense's vector is the mean contextual vector of the SemCor tokens tagged with its key "
        "(subword tokens averaged). The propagation, gloss and standardisation options are stored with the "
        "vectors as the defaults of `wsd predict`; the defaults are the configuration that scored best on "
        "senseval2 + semeval2007 with all-MiniLM-L6-v2 (docs/analysis/wsd.md).")
    fit.add_argument("--model", required=True, help="model directory")
    fit.add_argument("--semcor", required=True, help="SemCor 3.0 directory (brown*/tagfiles/br-*)")
    fit.add_argument("--wordnet", required=True, help="WordNet 3.0 database directory (index.sense, data.*)")
    fit.add_argument("--out", required=True, help="OUT.npz")
    fit.add_argument("--layers", type=layers_argument, default=defaults.DEFAULT_LAYERS,
                     help="as for `bertology embed` (default: %(default)s)")
    fit.add_argument("--combine", choices=("sum", "mean", "concat"), default=None,
                     help="how explicit layer indices are combined (default: mean)")
    _options(fit, defaults.DEFAULT_PROPAGATE, defaults.DEFAULT_GLOSS_WEIGHT, defaults.DEFAULT_STANDARDIZE,
             defaults.DEFAULT_FIRST_SENSE_BONUS)
    fit.add_argument("--max-sentences", type=int, default=None, help="use only the first N sentences")
    fit.add_argument("--batch-size", type=int, default=64)
    fit.add_argument("--quiet", action="store_true", help="no progress bar")
    add_device_arguments(fit)
    fit.set_defaults(func=run_fit)

    pred = commands.add_parser(
        "predict", help="disambiguate every instance of a framework .data.xml file",
        description="For each instance, the candidate WordNet senses of its lemma and POS nearest by cosine; "
        "WordNet's first sense when no candidate has a vector. Writes `id key` lines and prints a JSON "
        "summary of the counts. Options not given take the values stored by `wsd fit`.")
    pred.add_argument("--model", required=True, help="the model directory the senses were fitted with")
    pred.add_argument("--senses", required=True, help="the .npz written by `wsd fit`")
    pred.add_argument("--wordnet", required=True, help="WordNet 3.0 database directory")
    pred.add_argument("--data", required=True, help="X.data.xml of the WSD evaluation framework")
    pred.add_argument("--output", required=True, help="PRED.key")
    _options(pred, None, None, None, None)
    pred.add_argument("--batch-size", type=int, default=64)
    pred.add_argument("--quiet", action="store_true", help="no progress bar")
    add_device_arguments(pred)
    pred.set_defaults(func=run_predict)

    scorer = commands.add_parser(
        "score", help="the framework scorer: P, R, F1 overall and per part of speech",
        description="A predicted key is right when it is among the instance's gold keys; P = right / answered, "
        "R = right / all, F1; percentages. Prints one JSON object.")
    scorer.add_argument("--gold", required=True, help="GOLD.key")
    scorer.add_argument("--predictions", required=True, help="PRED.key")
    scorer.set_defaults(func=run_score)


def _options(parser: argparse.ArgumentParser, propagate, gloss_weight, standardize, first_sense_bonus) -> None:
    from bertology.analysis.wsd import PROPAGATIONS

    stored = " (default: the value stored by `wsd fit`)" if propagate is None else " (default: %(default)s)"
    parser.add_argument("--propagate", choices=PROPAGATIONS, default=propagate,
                        help="vectors for senses SemCor does not tag: through the synset, then hypernyms, then "
                        "the lexicographer file; none: first-sense fallback only" + stored)
    parser.add_argument("--gloss-weight", type=float, default=gloss_weight,
                        help="weight w of the gloss vector: score = (1 - w) cos(t, v) + w cos(t, gloss); 0.5 is "
                        "LMMS's concatenation, 0 no gloss" + stored)
    parser.add_argument("--standardize", action=argparse.BooleanOptionalAction, default=standardize,
                        help="z-score every dimension (mean and deviation over the SemCor tokens) before the "
                        "cosine" + stored)
    parser.add_argument("--first-sense-bonus", type=float, default=first_sense_bonus,
                        help="added to the score of WordNet's first sense: another sense must be nearer by more "
                        "than this" + stored)


def _progress(args: argparse.Namespace) -> bool:
    return not args.quiet and sys.stderr.isatty()


def run_fit(args: argparse.Namespace) -> int:
    from bertology.analysis.wsd import fit_senses
    from bertology.errors import ConfigError

    from bertology.io import check_output_file

    if not args.out.endswith(".npz"):
        raise ConfigError(f"--out {args.out}: sense vectors are written to a .npz file")
    check_output_file(args.out, "--out")  # not a directory, not below a file: before the fitting work
    senses = fit_senses(args.model, args.semcor, args.wordnet, layers=args.layers, combine=args.combine,
                        propagate=args.propagate, gloss_weight=args.gloss_weight, standardize=args.standardize,
                        first_sense_bonus=args.first_sense_bonus, batch_size=args.batch_size,
                        max_sentences=args.max_sentences, show_progress=_progress(args), **device_options(args))
    senses.save(args.out)
    print(json.dumps({"out": args.out, "config": senses.config, "stats": senses.stats}))
    return 0


def run_predict(args: argparse.Namespace) -> int:
    from bertology.analysis.wsd import predict

    _, summary = predict(args.model, args.senses, args.wordnet, args.data, args.output,
                         propagate=args.propagate, gloss_weight=args.gloss_weight, standardize=args.standardize,
                         first_sense_bonus=args.first_sense_bonus, batch_size=args.batch_size,
                         show_progress=_progress(args), **device_options(args))
    summary["output"] = args.output
    print(json.dumps(summary))
    return 0


def run_score(args: argparse.Namespace) -> int:
    from bertology.analysis.wsd import score

    print(json.dumps(score(args.gold, args.predictions)))
    return 0
