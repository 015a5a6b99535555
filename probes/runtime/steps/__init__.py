"""The step boundary and its parts: where a step begins and ends, whoever owns the loop."""
