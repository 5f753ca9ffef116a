"""Recall@k of the dev split's questions against every paragraph of a SQuAD file's dense index, retrieved by the
query encoders of RAG runs (``finetune --task rag``: ``OUT/model/query_encoder``) and by the encoder they started
from: what fine-tuning RAG end to end did to retrieval (docs/RETRIEVAL.md, the RAG section).

    python benchmarks/rag_recall.py --index runs/squad-a-minilm --squad SQUAD_FILE --encoder MINILM_DIR \\
        runs/rag-token/model runs/rag-sequence/model
"""

from __future__ import annotations

import argparse
import json

from bertology.retrieval import recall_at_k, squad_questions  # bertology before torch: its OpenMP policy applies
from bertology.retrieval.rag import QUERY_ENCODER_DIR, open_retriever


def recall(encoder: str, index: str, questions, ks=(1, 5, 20), batch_size: int = 64) -> dict[str, float]:
    import torch

    retriever = open_retriever(encoder, index)
    retriever.eval()
    ks = tuple(k for k in ks if k <= len(retriever)) or (len(retriever),)
    rows = []
    with torch.no_grad():
        for start in range(0, len(questions), batch_size):
            texts = [q.question for q in questions[start:start + batch_size]]
            rows.extend(retriever.scores(*retriever.encoder.tokenize(texts), max(ks))[1].tolist())
    scores = recall_at_k(questions, retriever.passages, rows, ks=ks)
    return {f"recall@{k}": round(scores.recall[k], 2) for k in ks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", help="RAG model directories (OUT/model)")
    parser.add_argument("--index", required=True)
    parser.add_argument("--squad", required=True)
    parser.add_argument("--split", default="dev", choices=("train", "dev", "all"))
    parser.add_argument("--encoder", help="the query encoder the runs started from")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    questions = squad_questions(args.squad, None if args.split == "all" else args.split)
    encoders = ([("start", args.encoder)] if args.encoder else []) + \
        [(run, f"{run}/{QUERY_ENCODER_DIR}") for run in args.runs]
    for name, encoder in encoders:
        print(json.dumps({"query_encoder": name, "questions": len(questions), **recall(encoder, args.index,
                                                                                        questions)}), flush=True)


if __name__ == "__main__":
    main()
