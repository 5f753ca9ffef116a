"""Causal-LM batches: the batch maker of decoder pretraining (GPT-2).

Instances of kind ``packed-documents`` (``bertology.data.instances``) fill every row with documents laid end to
end; the batch keeps each token's document id, so that the model attends only within a document
(``bertology.model.packing``: each document is a sequence of the packed layout, its positions counted from 0) and
a position predicts the next token only when that token is of the same document (``objectives.clm.lm_batch``).
Other instance kinds give one document part per row. Nothing is random: a batch is a function of its instances.
"""

from __future__ import annotations

from bertology.data.dataset import InstanceBatch
from bertology.objectives.clm import LMBatch, lm_batch


class CausalBatches:
    """Collated instances -> next-token targets (``LMBatch``), confined to documents when rows carry their ids."""

    needs_position = False

    def __call__(self, instances: InstanceBatch) -> LMBatch:
        return lm_batch(instances.input_ids, instances.attention_mask, instances.documents, instances.instance_ids)
