"""The verify stage: framework-computed diff, filtered, applied to a fresh bug-commit tree, tested in a new
sandbox, graded with SWE-bench 5.x rules.

    verify.verify_workspace(taskset, row, workspace) -> VerifyResult
    verify.verify_patch(taskset, row, patch_text) -> VerifyResult
    stage.run_verify(tasks, rollouts, out, workers) -> summary dict
"""
