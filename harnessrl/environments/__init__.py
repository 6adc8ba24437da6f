"""Environments: what a task is, what the harness sees, and what a finished rollout earns (base.py), by name
(registry.py). Built in: `swe` (swe.py), `instruction` (instruction/), `kernel` (kernel/: its own workspace,
graded in a sandbox), `search` (search/: host-side tools on a BM25 index) and `procedural` (procedural/:
reasoning-gym); docs/environments.md."""
