"""The generate stage: task -> workspace -> sandbox -> harness <-> gateway <-> engine -> rollout records."""
