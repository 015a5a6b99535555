"""``traintop run``'s side in the training process: a probe attached to each model and
optimizer an unmodified script builds (``bootstrap`` waits for torch without importing
it; ``attach`` finds what to watch)."""
