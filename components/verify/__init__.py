"""KFP component of the verify stage (diff filtering, fresh tree and grading live in harnessrl.verify)."""
