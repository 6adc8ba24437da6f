"""KFP component of the select stage: training task set and held-out split from pass counts."""
