"""Rollouts: task -> workspace -> sandbox -> harness <-> gateway <-> engine -> rollout records and samples."""
