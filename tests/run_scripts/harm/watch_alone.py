"""Way 2: ``probes.watch(model, optimizer)`` and nothing else: the loop is unchanged, the
steps and evaluations inferred. With ``HARM_BARE=1`` no probe (``probes`` never imported).

``python watch_alone.py OUT [ACTION ...]`` writes ``OUT/summary.json``."""

import os
from typing import Any

import common


class WatchAlone(common.Watching):
    def __init__(self, model: Any, optimizer: Any) -> None:
        import probes

        self.probe = probes.watch(model, optimizer, run="harm-watch-alone", sample_every=3)

    def close(self) -> None:
        self.probe.close()


if __name__ == "__main__":  # a spawned DataLoader worker imports this file again
    common.main(common.Watching if os.environ.get("HARM_BARE") else WatchAlone)
