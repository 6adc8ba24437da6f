"""KFP component, CLI and stage of evaluate (the statistics live in harnessrl.evaluate)."""
