"""Fine-tuning tasks and their evaluation."""

from bertology.tasks.metrics import (
    ConllevalResult,
    SquadResult,
    accuracy,
    conlleval,
    conlleval_file,
    evaluate_files,
    f1_binary,
    matthews_corrcoef,
    normalize_answer,
    pearson,
    read_conlleval,
    spearman,
    squad_v1,
)

__all__ = [
    "ConllevalResult",
    "SquadResult",
    "accuracy",
    "conlleval",
    "conlleval_file",
    "evaluate_files",
    "f1_binary",
    "matthews_corrcoef",
    "normalize_answer",
    "pearson",
    "read_conlleval",
    "spearman",
    "squad_v1",
]
