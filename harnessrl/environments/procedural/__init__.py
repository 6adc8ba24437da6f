"""Procedural reasoning tasks (reasoning-gym datasets, optional dependency): `source` (rows, extraction,
scoring with each dataset's own `score_answer`) and `env` (the `Environment`, `harnessrl tasks procedural`)."""
