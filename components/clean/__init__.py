"""KFP component of the clean stage (stage logic lives in dataprep.clean)."""
