"""The stdlib kernel that both processes import.

The wire, the record schema, thinning, the replay history and the diagnosis: pure Python,
never torch, numpy, textual or rich (``tests/repo/test_imports.py`` checks it), so the monitor
runs where torch is not installed.
"""
