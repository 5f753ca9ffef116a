"""XLM-RoBERTa: RoBERTa's layout and heads under its own model_type and class names."""

from dataclasses import replace

from bertology.model.families import roberta

FAMILY = replace(roberta.FAMILY, model_type="xlm-roberta", class_stem="XLMRoberta", family="xlm-roberta")
