"""Dense retrieval: passages embedded as normalised sentence vectors by one model, in a faiss index searched by inner
product (cosine similarity), and open-retrieval evaluation on SQuAD.

Python API::

    from bertology.retrieval import Index, Structure

    index = Index.build("path/to/model", "passages.jsonl")          # exact search (faiss IndexFlatIP)
    index = Index.build(pretrained, [{"id": "a", "text": "..."}],    # a loaded model, passages in memory,
                        structure=Structure("hnsw", ef_search=128))  # approximate search (HNSW or IVF)
    index.save("my-index")                                           # a directory, written atomically

    index = Index.load("my-index", model=pretrained)   # or a model directory; refused (IndexMismatchError) if
                                                       # it is not the model that built the index
    hits = index.search(["who wrote Hamlet?"], k=10)   # one list of Hit(id, score, text, row) per query, best first
    hits = index.search(query_vectors, k=10)           # or vectors [N, D] from the same model and options

    index = Index.load("my-index")                     # no model: vector queries only ...
    index.attach(index.model_path)                     # ... until a model is attached (the recorded one here)

    index = Index.from_vectors(pretrained, passages, vectors)  # vectors embedded elsewhere (a corpus run);
                                                               # a sample is embedded again and compared

- Passages file: JSON lines ``{"id": str or int, "text": str, ...}``, ids unique (see `bertology.retrieval.passages`).
- Embedding options (`EmbeddingOptions`, recorded in the index and used for queries too) default to what the model
  was trained for: a sentence-transformers directory's pooling (mean or CLS) and ``max_seq_length`` (truncation),
  else the mean of the last layer with long texts in windows (`model_options`).
- The index records the model's fingerprint (`model_fingerprint`, which is `bertology.model.fingerprint`: encoder
  config, encoder weights, tokenizer).
- `evaluate_squad(index, squad_file)`: recall@k of every question against all paragraphs (`bertology evaluate
  --task retrieval`); `recall_at_k` scores any ranking (a BM25 baseline, say) by the same rules.

Index kinds (`bertology.retrieval.kinds`): ``dense`` (`Index`), ``bm25`` (`SparseIndex`, through bm25s) and
``hybrid`` (`HybridIndex`: both, fused by reciprocal rank or by interpolated normalised scores, `Fusion`);
`load_index(path)` opens any of them by the kind its index.json records, `load_index(path, kind=...)` refuses
another kind (`IndexKindError`).

faiss is imported only when an index is built, read or searched (``pip install 'bertology[index]'``).
"""

from bertology.retrieval.evaluate import (
    RetrievalScores,
    dpr_tokens,
    evaluate_squad,
    has_answer,
    recall_at_k,
    squad_questions,
)
from bertology.retrieval.index import (
    EmbeddingOptions,
    Hit,
    Index,
    IndexMismatchError,
    Structure,
    corpus_vectors,
    encode,
    model_fingerprint,
    model_options,
    normalize,
)
from bertology.retrieval.passages import Passage, as_passages, read_passages, squad_passages, write_passages
from bertology.retrieval.kinds import IndexKindError, index_kinds, load_index, open_index, register_index_kind
from bertology.retrieval.sparse import BM25Options, SparseIndex
from bertology.retrieval.hybrid import Fusion, HybridIndex, fuse

__all__ = [
    "BM25Options",
    "Fusion",
    "HybridIndex",
    "IndexKindError",
    "SparseIndex",
    "fuse",
    "index_kinds",
    "load_index",
    "open_index",
    "register_index_kind",
    "EmbeddingOptions",
    "Hit",
    "Index",
    "IndexMismatchError",
    "Passage",
    "RetrievalScores",
    "Structure",
    "as_passages",
    "corpus_vectors",
    "dpr_tokens",
    "encode",
    "evaluate_squad",
    "has_answer",
    "model_fingerprint",
    "model_options",
    "normalize",
    "read_passages",
    "recall_at_k",
    "squad_passages",
    "squad_questions",
    "write_passages",
]
