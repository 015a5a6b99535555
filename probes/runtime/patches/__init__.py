"""The one registry of what traintop changes in torch and in the user's objects: every
process-global patch, and the hooks it puts on modules."""
