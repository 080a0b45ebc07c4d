"""Faults, exits, recovery, fuzzing, soak, multi-host: every rank raises in time, no hang."""
