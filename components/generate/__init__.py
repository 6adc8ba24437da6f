"""KFP component of the generate stage (the rollout runner lives in harnessrl.rollout)."""
