"""What a step measures, launched on the training thread without reading a value."""
