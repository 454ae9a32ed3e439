"""Launching worker processes: one fresh process (group) per run."""
