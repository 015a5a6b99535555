"""The optimizer's hooks, and what the probe sees around its step: several optimizers,
gradient clearing, clipping, AMP's scaler, the learning-rate experiment."""
