"""Train stage: samples + rewards → rollout-level advantages → GRPO/PPO updates → checkpoint (see docs/train.md)."""
