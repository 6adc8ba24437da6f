"""KFP component of the validate stage (stage logic lives in dataprep.validate)."""
