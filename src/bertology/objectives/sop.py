"""ALBERT's sentence-order prediction (Lan et al. 2020): cross-entropy of the pooled [CLS] head ``sop`` against
the order of two consecutive segments of one document (0 = in order, 1 = swapped, transformers'
``sentence_order_label`` convention). The instances come from ``data.instances.kind: sop``
(``bertology.data.instances``); on an ALBERT encoder the model is saved as transformers' ``AlbertForPreTraining``
(``predictions`` + ``sop_classifier``), on a BERT encoder in bertology's native format."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from bertology.objectives.nsp import NextSentence


@dataclass
class SentenceOrder(NextSentence):
    """SOP on the pooled head ``sop``. Stats: ``sop_units`` (sequences), ``sop_loss_sum``, ``sop_correct``."""

    weight: float = 1.0
    name: str = "sop"
    label_kind: ClassVar[str] = "sentence-order"
    instance_kind: ClassVar[str] = "sop"
