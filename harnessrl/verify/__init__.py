"""Verification: framework-computed diff, filtered, applied to a fresh bug-commit tree, tested in a new
sandbox, graded with SWE-bench 5.x rules.

    verifier.verify_workspace(taskset, row, workspace) -> VerifyResult
    verifier.verify_patch(taskset, row, patch_text) -> VerifyResult
    rollouts.run_verify(tasks, rollouts, out, workers) -> summary dict
"""
