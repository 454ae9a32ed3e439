"""Timers, statistics, memory probes and the environment fingerprint."""
