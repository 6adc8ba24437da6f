"""Test support: shared fixtures and test doubles (never imported by the package)."""
