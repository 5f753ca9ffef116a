"""Every built-in bertology ships, registered here and nowhere else: model classes of the native format, head kinds,
checkpoint families, special-token framings, extension factories, fine-tuning tasks and objectives.

Each registry is a `Registry` owned by the module that defines its extension point (`bertology.model.heads` owns the
head kinds, `bertology.tasks.base` the tasks...). The modules that define a built-in only define it; the table below
names it, by registry, as ``(name, "module:attribute", options)``, and the registry registers its built-ins, through
its own `register` function and in the table's order, on its first use (a lookup, a listing, or a registration of
someone else's). So every lookup sees every built-in whatever was imported first, and `import bertology` stays
cheap. A name is looked up in the table only by its registry, so this module imports nothing of bertology.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, TypeVar

Value = TypeVar("Value")

BUILT_IN: dict[str, tuple[tuple[str, str, dict[str, Any]], ...]] = {
    # bertology.model.registry.MODELS: what bertology.json's "model" names (register_model).
    "models": (
        # encoder-stack: the name of an encoder holding the token table in the model (T5's encoder alone,
        # ModernBERT) before there was one bidirectional model; a run config naming it built ModernBERT.
        ("encoder", "bertology.model.encoder:EncoderModel", {"aliases": {"encoder-stack": {"family": "modernbert"}}}),
        ("decoder", "bertology.model.transformer:DecoderModel", {}),
        ("seq2seq", "bertology.model.transformer:Seq2SeqModel", {}),
        ("xlnet", "bertology.model.xlnet:XLNetModel", {}),
        ("longformer", "bertology.model.longformer:LongformerModel", {}),
        ("elmo", "bertology.model.elmo:ElmoModel", {}),
    ),
    # bertology.model.registry.RUN_CONFIGS: how an architecture a run config names builds its config
    # (register_run_config).
    "run_configs": (
        ("encoder", "bertology.model.run_configs:encoder_config", {}),
        ("decoder", "bertology.model.run_configs:decoder_config", {}),
        ("seq2seq", "bertology.model.run_configs:seq2seq_config", {}),
        ("xlnet", "bertology.model.run_configs:xlnet_config", {}),
        ("elmo", "bertology.model.run_configs:elmo_config", {}),
    ),
    # bertology.model.heads.HEAD_REGISTRY: a HeadSpec's kind (register_head).
    "heads": (
        ("masked_lm", "bertology.model.heads:MaskedLMHead", {"reads": "masked_positions"}),
        ("prediction_pooled", "bertology.model.heads:PredictionHead", {}),
        ("prediction_token", "bertology.model.heads:PredictionHead", {}),
        ("pooled", "bertology.model.heads:LinearHead", {"reads": "pooler"}),
        ("first_token", "bertology.model.heads:FirstTokenHead", {"reads": "first_token"}),
        ("mean_pooled", "bertology.model.heads:MeanPooledHead", {}),
        ("max_pooled", "bertology.model.heads:MaxPooledHead", {}),
        ("segment_cosine", "bertology.model.heads:SegmentCosineHead", {}),
        ("token", "bertology.model.heads:TokenLinearHead", {}),
        ("token_mlp", "bertology.model.heads:TokenMLPHead", {}),
        ("span", "bertology.model.heads:SpanHead", {}),
        ("span_attention", "bertology.model.heads:SpanHead", {}),
        ("span_boundary", "bertology.model.heads:SpanBoundaryHead", {}),
        ("tied_lm", "bertology.model.heads:TiedLMHead", {"reads": "masked_positions"}),
        ("last_token", "bertology.model.heads:LastTokenHead", {}),
        ("lm", "bertology.model.heads:LMHead", {"reads": "masked_positions"}),
        ("tied_lm_bias", "bertology.model.heads:TiedLMBiasHead", {"reads": "masked_positions"}),
        ("eos_token", "bertology.model.heads:EosTokenHead", {}),
        ("bilstm_crf", "bertology.model.crf:BiLSTMCRFHead", {}),
        ("bilstm_max", "bertology.model.crf:BiLSTMMaxHead", {}),
        ("summary_last", "bertology.model.xlnet:SequenceSummaryHead", {}),
    ),
    # bertology.model.convert.REGISTRY: a config.json's model_type (register_family).
    "families": (
        ("bert", "bertology.model.families.bert:FAMILY", {}),
        ("roberta", "bertology.model.families.roberta:FAMILY", {}),
        ("xlm-roberta", "bertology.model.families.xlm_roberta:FAMILY", {}),
        ("electra", "bertology.model.families.electra:FAMILY", {}),
        ("albert", "bertology.model.families.albert:FAMILY", {}),
        ("distilbert", "bertology.model.families.distilbert:FAMILY", {}),
        ("gpt2", "bertology.model.families.gpt2:FAMILY", {}),
        ("t5", "bertology.model.families.t5:FAMILY", {}),
        ("bart", "bertology.model.families.bart:FAMILY", {}),
        ("xlnet", "bertology.model.families.xlnet:FAMILY", {}),
        ("longformer", "bertology.model.families.longformer:FAMILY", {}),
        ("modernbert", "bertology.model.families.modernbert:FAMILY", {}),
        ("deberta-v2", "bertology.model.families.deberta_v2:FAMILY", {}),
    ),
    # bertology.tokenization.framing.FRAMINGS: a tokenizer's style (register_framing).
    "framings": (
        ("bert", "bertology.tokenization.framing:BERT", {}),
        ("roberta", "bertology.tokenization.framing:ROBERTA", {}),
        ("bart", "bertology.tokenization.framing:BART", {}),
        ("gpt2", "bertology.tokenization.framing:GPT2", {}),
        ("t5", "bertology.tokenization.framing:T5", {}),
        ("xlnet", "bertology.tokenization.framing:XLNET", {}),
        ("deberta", "bertology.tokenization.framing:DEBERTA", {}),
    ),
    # bertology.model.extensions.EXTENSIONS: a factory that add_extension plugs in and bertology.json records
    # (register_extension).
    "extensions": (
        ("lora", "bertology.peft.lora:lora_factory", {}),
        ("bottleneck_adapter", "bertology.peft.adapters:adapter_factory", {}),
        ("prefix", "bertology.peft.prefix:prefix_factory", {}),
        ("span_classifier", "bertology.model.heads:span_heads", {}),
        ("scalar_mix", "bertology.peft.scalar_mix:scalar_mix_extension", {}),
    ),
    # bertology.tasks.base.TASKS: `bertology finetune --task NAME` (register_task).
    "tasks": (
        ("conll2003", "bertology.tasks.tagging:CONLL2003", {}),
        ("sst2", "bertology.tasks.glue:SST2", {}),
        ("cola", "bertology.tasks.glue:COLA", {}),
        ("mrpc", "bertology.tasks.glue:MRPC", {}),
        ("rte", "bertology.tasks.glue:RTE", {}),
        ("stsb", "bertology.tasks.glue:STSB", {}),
        ("squad", "bertology.tasks.qa:SQUAD", {}),
        ("squad-article", "bertology.tasks.qa:SQUAD_ARTICLE", {}),
        ("conll2003-spans", "bertology.tasks.spans:CONLL2003_SPANS", {}),
        ("sst2-cloze", "bertology.tasks.cloze:SST2_CLOZE", {}),
        ("rte-cloze", "bertology.tasks.cloze:RTE_CLOZE", {}),
        ("retrieval", "bertology.retrieval.retriever_task:RETRIEVAL", {}),
        ("retrieval-dot", "bertology.retrieval.retriever_task:RETRIEVAL_DOT", {}),
        ("rerank", "bertology.retrieval.reranker_task:RERANK", {}),
        ("rerank-cls", "bertology.retrieval.reranker_task:RERANK_CLS", {}),
        ("rag", "bertology.retrieval.rag_task:RAG", {}),
    ),
    # bertology.retrieval.kinds.INDEX_KINDS: the kind an index.json records (register_index_kind).
    "index_kinds": (
        ("dense", "bertology.retrieval.index:Index", {}),
        ("bm25", "bertology.retrieval.sparse:SparseIndex", {}),
        ("hybrid", "bertology.retrieval.hybrid:HybridIndex", {}),
    ),
    # bertology.objectives.OBJECTIVES: a run config's objectives section, by name.
    "objectives": (
        ("mlm", "bertology.objectives.mlm:MaskedLM", {}),
        ("nsp", "bertology.objectives.nsp:NextSentence", {}),
        ("electra", "bertology.objectives.electra:Electra", {}),
        ("distill", "bertology.objectives.distill:Distillation", {}),
        ("sop", "bertology.objectives.sop:SentenceOrder", {}),
        ("span_boundary", "bertology.objectives.span:SpanBoundary", {}),
        ("plm", "bertology.objectives.plm:PermutationLM", {}),
        ("bilm", "bertology.objectives.bilm:BidirectionalLM", {}),
        ("clm", "bertology.objectives.clm:CausalLM", {}),
        ("denoise", "bertology.objectives.denoise:Denoising", {}),
        ("prefixlm", "bertology.objectives.prefixlm:PrefixLM", {}),
    ),
}


def resolve(target: str) -> Any:
    """The object a table entry names ("package.module:attribute")."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


class Registry(MutableMapping[str, Value]):
    """A name -> value mapping that registers `BUILT_IN[kind]` on its first use, each entry as
    ``register(name, value, **options)`` (the owner's register function, which validates it; by default the entry
    is stored as it is). Reads and writes alike come after the built-ins, so they keep the table's order."""

    def __init__(self, kind: str, register: Callable[..., Any] | None = None) -> None:
        if kind not in BUILT_IN:
            raise KeyError(f"no built-ins of kind {kind!r}; kinds: {', '.join(BUILT_IN)}")
        self.kind = kind
        self._register = register
        self._entries: dict[str, Value] = {}
        self._loaded = False
        self._loading = False
        self._lock = threading.RLock()  # a service's threads may look a name up first at the same time

    def _load(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded or self._loading:  # loading: the register functions read and write this registry
                return
            self._loading = True
            try:
                for name, target, options in BUILT_IN[self.kind]:
                    value = resolve(target)
                    if self._register is None:
                        self._entries[name] = value
                    else:
                        self._register(name, value, **options)
            finally:
                self._loading = False
            self._loaded = True  # not after a failed import: the next use tries again, and says why again

    def __getitem__(self, name: str) -> Value:
        self._load()
        return self._entries[name]

    def __setitem__(self, name: str, value: Value) -> None:
        self._load()
        self._entries[name] = value

    def __delitem__(self, name: str) -> None:
        self._load()
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        self._load()
        return iter(list(self._entries))

    def __len__(self) -> int:
        self._load()
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self)})"
