"""KFP component of the synthesize stage (stage logic lives in harnessrl.dataprep.synthesize)."""
