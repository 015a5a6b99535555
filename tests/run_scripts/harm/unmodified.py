"""Way 3 (``traintop run``): the do-no-harm loop with no traintop line at all; run
bare with plain ``python`` and watched as ``traintop --headless run python unmodified.py``.

``python unmodified.py OUT [ACTION ...]`` writes ``OUT/summary.json``."""

import common

if __name__ == "__main__":  # a spawned DataLoader worker imports this file again
    common.main(common.Watching)
