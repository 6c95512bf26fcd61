"""Scaling sweeps: which device counts to run, running them, showing progress."""
