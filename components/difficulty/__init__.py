"""Best-of-N difficulty estimation, task selection, and the pass-rate history used by dynamic sampling."""
