"""Screens pushed over the monitor."""
