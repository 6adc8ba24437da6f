"""KFP component of the synthesize stage (stage logic lives in dataprep.synthesize)."""
