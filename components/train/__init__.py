"""KFP component of the train stage (the trainer and RL math live in harnessrl.train)."""
