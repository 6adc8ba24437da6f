"""Instruction following with programmatically verifiable constraints: `checks` (kinds, checkers, scoring)
and `prompts` (task rows: generated, JSONL, IFEval's file)."""
