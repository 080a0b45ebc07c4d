"""Observers, the flight recorder, statistics and `commlib trace`."""
