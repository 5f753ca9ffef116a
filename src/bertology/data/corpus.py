"""The corpus readers, defined in ``bertology.text.corpus`` (below the tokenizers, which train on corpora) and named
here too."""

from bertology.text.corpus import (CORPUS_FORMATS, GLUE_TASKS, CorpusFormat, CorpusSource, GlueTask, PathsLike,
                                   glue_task, jsonl_text, list_corpus_files, read_documents, read_glue, read_lines,
                                   read_sources)

__all__ = ["CORPUS_FORMATS", "GLUE_TASKS", "CorpusFormat", "CorpusSource", "GlueTask", "PathsLike", "glue_task",
           "jsonl_text", "list_corpus_files", "read_documents", "read_glue", "read_lines", "read_sources"]
