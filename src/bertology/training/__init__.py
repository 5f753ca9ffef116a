"""Training: the run config (dataclasses), the training loop shared by pretraining and fine-tuning, atomic
checkpoints, DDP/FSDP."""

from bertology.training.checkpoint import TrainingState, latest_checkpoint, list_checkpoints
from bertology.training.config import PretrainConfig, TrainConfig, apply_overrides, load_config
from bertology.training.distributed import DistEnv, init_distributed
from bertology.training.trainer import (
    BatchSource,
    Evaluator,
    Schedule,
    StepReport,
    Trainer,
    check_output_dir,
    plot_metrics,
    read_metrics,
)

__all__ = [
    "BatchSource",
    "Evaluator",
    "Schedule",
    "check_output_dir",
    "DistEnv",
    "PretrainConfig",
    "StepReport",
    "TrainConfig",
    "Trainer",
    "TrainingState",
    "apply_overrides",
    "init_distributed",
    "latest_checkpoint",
    "list_checkpoints",
    "load_config",
    "plot_metrics",
    "read_metrics",
]
