"""KFP component of the validate stage (stage logic lives in harnessrl.dataprep.validate)."""
