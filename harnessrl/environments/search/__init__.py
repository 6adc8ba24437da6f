"""The `search` environment: answer questions by searching a local corpus built offline from the package
metadata installed with Python.

- `corpus.py`: passages (card + description chunks) from `*.dist-info/METADATA`, JSONL on disk.
- `index.py`: BM25 (bm25s) `search(query, k)` / `read(doc_id)`, the agent's tools.
- `questions.py`: deterministic questions whose answers are verbatim in one passage.
- `score.py`: answer extraction, SQuAD-style normalization, exact match and token F1.
- `env.py`: the `Environment` (task rows with their corpus, host tools, rewards) and `harnessrl tasks search`.
"""
