"""KFP component and CLI of the task-family stage: which tasks the RL loop trains on and the evaluation holds out."""
