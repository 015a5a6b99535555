"""Way 1: ``probe = probes.watch(model, optimizer)`` and ``with probe.step():`` each
step, ``with probe.evaluate():`` each evaluation, ``probe.log(...)``. With ``HARM_BARE=1``
the same loop runs with no probe (and ``probes`` never imported).

``python step_api.py OUT [ACTION ...]`` writes ``OUT/summary.json``."""

import os
from typing import Any

import common


class StepApi(common.Watching):
    def __init__(self, model: Any, optimizer: Any) -> None:
        import probes

        self.probe = probes.watch(model, optimizer, run="harm-step-api", sample_every=3)

    def step(self) -> Any:
        return self.probe.step()

    def evaluate(self) -> Any:
        return self.probe.evaluate()

    def log(self, **scalars: Any) -> None:
        self.probe.log(**scalars)

    def close(self) -> None:
        self.probe.close()


if __name__ == "__main__":  # a spawned DataLoader worker imports this file again
    common.main(common.Watching if os.environ.get("HARM_BARE") else StepApi)
