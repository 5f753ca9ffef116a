"""Reading text: the corpus formats (bert, text, jsonl, brown, glue), the sentence splitter, GLUE's files and the
typed examples of the tasks' files. Below the tokenizers (which train on corpora) and the data and tasks packages
(which read them); imports nothing of bertology but its errors and input checks."""
