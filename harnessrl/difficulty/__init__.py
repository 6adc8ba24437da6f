"""Task difficulty: selection rules from Best-of-N pass counts and the pass-rate history (dynamic sampling)."""
