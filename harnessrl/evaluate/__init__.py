"""Evaluation: did training help? pass@k (unbiased), Wilson intervals, paired bootstrap over tasks.

stats.pass_at_k / wilson_interval / paired_bootstrap
results.score_run(rollouts, rewards, policy, mode, k, calls) -> dict;  results.compare(a, b) -> dict
results.group_figures (held-out groups apart), results.side_by_side (one request answered by each policy)
"""
