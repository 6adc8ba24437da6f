"""KFP component of the run summary: the run's numbers so far, after each training round."""
