"""Parameter-efficient fine-tuning on bertology's extension points (bertology.model.register_extension): LoRA,
bottleneck adapters, prefix tuning, and the scalar mix of a frozen encoder's layers. Importing this package registers
the extension factories ("lora", "bottleneck_adapter", "prefix") that native checkpoints of such models name.

    share = apply_lora(model, rank=8, alpha=16, targets=("query", "value"))   # freezes the rest
    ... train ...
    save_trained(model, "run/lora")                   # only what trained, and the recipe
    model = load_trained("base-model-dir", "run/lora")
    save_lora_peft(model, "run/peft", base_model_name_or_path="bert-base-uncased")   # peft's files
"""

from bertology.peft.adapters import Adapter, apply_adapters
from bertology.peft.common import Trainable, freeze_base, trainable_parameters
from bertology.peft.lora import LoRALinear, apply_lora, fold_lora, merge_lora, unmerge_lora
from bertology.peft.peft_format import load_lora_peft, peft_architecture, save_lora_peft
from bertology.peft.prefix import Prefix, apply_prefix
from bertology.peft.scalar_mix import ScalarMix, scalar_mix_for
from bertology.peft.trained import load_trained, save_trained

__all__ = [
    "Adapter",
    "LoRALinear",
    "Prefix",
    "ScalarMix",
    "Trainable",
    "apply_adapters",
    "apply_lora",
    "apply_prefix",
    "fold_lora",
    "freeze_base",
    "load_lora_peft",
    "load_trained",
    "merge_lora",
    "peft_architecture",
    "save_lora_peft",
    "save_trained",
    "scalar_mix_for",
    "trainable_parameters",
    "unmerge_lora",
]
