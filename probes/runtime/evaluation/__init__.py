"""Evaluations, declared (``probe.evaluate()``) or found in a loop with no step API."""
