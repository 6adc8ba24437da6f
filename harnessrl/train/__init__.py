"""Training: samples + rewards -> rollout-level advantages -> GRPO/PPO updates -> checkpoint (docs/train.md)."""
