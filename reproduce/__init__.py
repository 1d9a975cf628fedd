"""Reproduce the paper: experiment registry, profiles and the runner (python -m reproduce)."""
