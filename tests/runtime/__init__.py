"""The probe inside a training process: watch(), the step API, hooks and patches,
measurements, checks, in this test process.
"""
