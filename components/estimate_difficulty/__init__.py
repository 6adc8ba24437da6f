"""KFP component of the estimate_difficulty stage: Best-of-N generate + verify, pass counts per task."""
