"""The training-side runtime: the probe, its step boundary, measurement, sender and control."""
