"""KFP component and CLI of the sft (cold start) stage (the work is in stage.py and demos.py)."""
