"""Measuring a run: the profile and its waste budget, the run's own signals, the paired
benchmark and its interval, the measured/predicted record of rules, non-finite evidence."""
