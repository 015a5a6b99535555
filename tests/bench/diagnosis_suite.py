"""Diagnosis benchmark: documented bugs on models the rules never saw, and their twins.

    python tests/bench/diagnosis_suite.py                 # every case, table at the end
    python tests/bench/diagnosis_suite.py --case NAME     # some cases (repeatable)
    python tests/bench/diagnosis_suite.py --train NAME [--twin] [--delay S]
                                           # one case as a plain training script, for a
                                           # monitor you run yourself (traintop --headless)
    python tests/bench/diagnosis_suite.py --reference NAME
                                           # an exploding case's norms measured directly

Each case (``tests/bench/diagnosis_cases.py``) trains its buggy loop and its healthy
twin twice: once with every step sent as its own record (what a run at up to 60 steps/s
sends) and once at full speed with the probe's default thinning (60 records a second,
each standing for several steps; these small models run at 100 to 700 steps/s here).
A third column thins the every-step records 50 to 1, as the sender would for a run at
3,000 steps/s: the same run, at two speeds. The frames go to an in-process stand-in
monitor and then through the monitor's own state and rules, exactly as ``traintop
--headless`` applies them: an ALERT line is one ``AlertRaised``.

The table gives, per case: the expected kind and first layer, whether it was raised
with that subject, the step it was raised at, the ALERT lines of the buggy run, and the
false alarms (ALERT lines) of the twin. Targets: every case raised with the right kind
and first layer, no false alarm, at most 3 ALERT lines per root cause, the same result
at full speed (within 2 steps).

It runs against whatever ``probes`` and ``tui`` come first on the path, so the same
cases can measure another checkout's rules (``PYTHONPATH=/other/checkout``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: this checkout unless PYTHONPATH says
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import torch

import probes
from probes.kernel.schema import check_frame
from tests.bench.diagnosis_cases import CASES, Case
from tests.collector import FrameCollector
from tui.events import AlertRaised
from tui.state import MonitorState

try:
    from tui.headless import causes_line
except ImportError:  # an older monitor
    causes_line = None  # type: ignore[assignment]

try:
    from probes.kernel.thinning import Thinner  # noqa: F401  (the sender's policy, here)
    from tests.frames import thinned_as_sent as thin_records
except ImportError:  # an older probes: its own thinning (keep the last of each group)
    from probes.kernel.replay import merge_steps, thin  # type: ignore[attr-defined]

    def thin_records(records: list[dict[str, Any]], factor: int) -> list[dict[str, Any]]:
        steps = sum(r.get("kind") == "step" for r in records)
        return thin(
            records,
            max(1, steps // factor),
            is_step=lambda r: r.get("kind") == "step",
            merge=lambda g: [merge_steps(g)],
            keep_first=True,
        )


MODES = {
    "every": "every step a record",
    "full": "full speed, thinned",
    "x50": "every-step records thinned x50 (a 3,000 steps/s run)",
}
THINNED = 50  # steps per record for x50: 3,000 steps/s at the sender's 60 records/s


@dataclass
class Outcome:
    """What the monitor raised on one run."""

    lines: list[str] = field(default_factory=list)  # ALERT lines, in order
    alerts: list[Any] = field(default_factory=list)  # the Alert objects
    steps: int = 0
    records: int = 0
    seconds: float = 0.0
    frames: list[dict[str, Any]] = field(default_factory=list)  # as received
    causes: str = ""  # the run's root causes at its end, with what folded under them

    def first(self, kind: str) -> Any | None:
        return next((a for a in self.alerts if a.kind == kind), None)


def run(case: Case, *, twin: bool, mode: str, steps: int | None = None) -> Outcome:
    """Train ``case`` (or its twin) under a probe; what the monitor raises."""
    folder = tempfile.mkdtemp(prefix="tt-bench-")
    collector = FrameCollector(os.path.join(folder, "m.sock"))
    options = {"max_steps_per_s": 1e9} if mode == "every" else {}

    def watch(model: Any, optimizer: Any, **kw: Any) -> Any:
        return probes.watch(
            model,
            optimizer,
            address=collector.address,
            run=f"{case.name}{'-twin' if twin else ''}",
            **{**options, **kw},
        )

    torch.manual_seed(0)
    started = time.perf_counter()
    try:
        case.run(twin, watch, steps or case.steps)
        seconds = time.perf_counter() - started
        if not collector.wait_for(
            lambda frames: any(f["kind"] == "bye" for f in frames), timeout=30
        ):
            raise RuntimeError(f"{case.name}: the probe never said bye")
        return monitor(list(collector.frames), seconds)
    finally:
        collector.close()
        shutil.rmtree(folder, ignore_errors=True)


def thinned(outcome: Outcome, factor: int = THINNED) -> Outcome:
    """The same records as a run ``factor`` times faster would send them
    (``probes.kernel.thinning``, the sender's policy, fed as the sender feeds it),
    through the monitor again."""
    return monitor(thin_records(outcome.frames, factor), outcome.seconds)


def monitor(frames: list[dict[str, Any]], seconds: float = 0.0) -> Outcome:
    """Apply frames as the monitor does; the alerts it raised."""
    state = MonitorState()
    outcome = Outcome(seconds=seconds, frames=frames)
    for frame in frames:
        check_frame(frame)
        for event in state.apply(1, frame):
            if isinstance(event, AlertRaised):
                outcome.alerts.append(event.alert)
                outcome.lines.append(event.alert.line())
        if frame["kind"] == "step":
            outcome.records += 1
            outcome.steps = int(frame["step"]) + 1
    run = next(iter(state.runs.values()), None)
    if causes_line is not None and run is not None and run.alerts:
        outcome.causes = causes_line(run)
    return outcome


@dataclass
class Row:
    case: Case
    results: dict[str, tuple[Outcome, Outcome]]  # mode -> (bug, twin)

    def verdict(self, mode: str) -> tuple[bool, str, str, int, int]:
        """(right kind and subject, subject named, step raised, ALERT lines, false alarms)."""
        bug, twin = self.results[mode]
        alert = bug.first(self.case.expect)
        subject = "-" if alert is None else (alert.subject or "")
        hit = alert is not None and subject == self.case.subject
        step = "-" if alert is None else str(alert.step)
        return hit, subject, step, len(bug.lines), len(twin.lines)


def table(rows: list[Row]) -> str:
    head = "| case | model | expected kind | first layer |"
    for mode in ("every step", "full speed", "x50"):
        head += f" {mode}: raised | step | ALERT lines | twin alarms |"
    columns = 4 + 4 * len(MODES) + 1
    lines = [head + " steps/s |", "|" + "---|" * columns]
    for row in rows:
        case = row.case
        cells = [case.name, case.model, case.expect, case.subject or "(run)"]
        for mode in MODES:
            hit, subject, step, count, alarms = row.verdict(mode)
            mark = "yes" if hit else ("no" if subject == "-" else f"wrong: {subject or '(run)'}")
            cells += [mark, step, str(count), str(alarms)]
        full = row.results["full"][0]
        cells.append(f"{full.steps / full.seconds:.0f}" if full.seconds else "-")
        lines.append("| " + " | ".join(cells) + " |")
    for mode, label in MODES.items():
        verdicts = [r.verdict(mode) for r in rows]
        hits = sum(v[0] for v in verdicts)
        alarms = sum(v[4] for v in verdicts)
        over = sum(v[3] > 3 for v in verdicts)
        lines.append(
            f"\n{label}: raised with the right kind and first layer {hits}/"
            f"{len(rows)}; false alarms on twins {alarms}; cases with more than 3 "
            f"ALERT lines {over}"
        )
    return "\n".join(lines)


def details(rows: list[Row]) -> str:
    out = []
    for row in rows:
        for mode, (bug, twin) in row.results.items():
            out.append(
                f"## {row.case.name} [{mode}] {bug.steps} steps in {bug.records} "
                f"records, {bug.seconds:.1f} s"
            )
            out += [f"   {line}" for line in bug.lines]
            if bug.causes:
                out.append(f"   {bug.causes}")
            out += [f"   twin: {line}" for line in twin.lines]
    return "\n".join(out)


class ReferenceProbe:
    """Stands in for a probe, with no traintop code: each layer's gradient norm read
    directly (``p.grad``, float64) just before ``optimizer.step()``."""

    def __init__(self, model: Any, optimizer: Any) -> None:
        self.layers = {
            name or "(root)": ps
            for name, module in model.named_modules()
            if (ps := [p for p in module.parameters(recurse=False) if p.requires_grad])
        }
        self.norms: list[dict[str, float]] = []
        self._hook = optimizer.register_step_pre_hook(self._read)
        self._read_before_clip = False

    def before_clip(self) -> None:
        """Clipping is about to scale the gradients: read the unclipped ones."""
        self._read()
        self._read_before_clip = True

    def _read(self, *args: Any) -> None:
        if self._read_before_clip:
            self._read_before_clip = False  # this step's norms were read before clipping
            return
        norms = {}
        for name, params in self.layers.items():
            grads = [p.grad.detach().double().flatten() for p in params if p.grad is not None]
            if grads:
                norms[name] = float(torch.cat(grads).norm())
        self.norms.append(norms)

    def step(self) -> Any:
        return contextlib.nullcontext()

    def evaluate(self) -> Any:
        return contextlib.nullcontext()

    def log(self, **scalars: Any) -> None:
        pass

    def __enter__(self) -> ReferenceProbe:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hook.remove()


def first_crossing(
    norms: list[dict[str, float]],
    bound: float = 100.0,
    growth: float = 50.0,
    floor: float = 10.0,
    window: int = 10,
) -> tuple[int, list[str]] | None:
    """The first step a layer's norm is over ``bound``, or over ``floor`` and ``growth``
    times its low of the ``window`` steps before; the layers that are, in model order."""
    for step, now in enumerate(norms):
        over = []
        for name, value in now.items():
            before = [n[name] for n in norms[max(0, step - window) : step] if name in n]
            low = min(before, default=0.0)
            if value > bound or (value > floor and low > 0 and value >= growth * low):
                over.append(name)
        if over:
            return step, over
    return None


def reference(case: Case, steps: int | None) -> str:
    """What the direct measurement says of an exploding case (no traintop involved)."""
    probes_made: list[ReferenceProbe] = []

    def watch(model: Any, optimizer: Any, **kw: Any) -> ReferenceProbe:
        probes_made.append(ReferenceProbe(model, optimizer))
        return probes_made[-1]

    clip = torch.nn.utils.clip_grad_norm_

    def clip_reading_first(*args: Any, **kwargs: Any) -> Any:
        for made in probes_made:
            made.before_clip()
        return clip(*args, **kwargs)

    torch.manual_seed(0)
    torch.nn.utils.clip_grad_norm_ = clip_reading_first  # type: ignore[assignment]
    try:
        case.run(False, watch, steps or case.steps)
    finally:
        torch.nn.utils.clip_grad_norm_ = clip
    found = first_crossing(probes_made[0].norms)
    if found is None:
        return f"{case.name}: no layer crosses"
    step, layers = found
    return f"{case.name}: first crossing at step {step}, layers (model order) {layers}"


def train_alone(case: Case, twin: bool, delay: float, steps: int | None) -> None:
    """The case as a plain script against whatever monitor listens (TRAINTOP_ADDRESS)."""

    def watch(model: Any, optimizer: Any, **kw: Any) -> Any:
        probe = probes.watch(model, optimizer, run=f"{case.name}{'-twin' if twin else ''}", **kw)
        if delay:
            original = probe.step

            def slow_step(*args: Any, **kwargs: Any) -> Any:
                time.sleep(delay)
                return original(*args, **kwargs)

            probe.step = slow_step  # type: ignore[method-assign]
        return probe

    torch.manual_seed(0)
    case.run(twin, watch, steps or case.steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", help="run only these cases")
    parser.add_argument(
        "--mode",
        action="append",
        choices=list(MODES),
        help="x50 thins the every-step records (it needs every)",
    )
    parser.add_argument("--train", help="run one case as a training script")
    parser.add_argument("--twin", action="store_true")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--details", action="store_true", help="print every ALERT line")
    parser.add_argument("--reference", help="measure a case's gradient norms directly")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    by_name = {case.name: case for case in CASES}
    if args.train:
        train_alone(by_name[args.train], args.twin, args.delay, args.steps)
        return 0
    if args.reference:
        print(reference(by_name[args.reference], args.steps))
        return 0
    cases = [by_name[name] for name in args.case] if args.case else CASES
    modes = args.mode or list(MODES)
    rows = []
    for case in cases:
        results: dict[str, tuple[Outcome, Outcome]] = {}
        for mode in modes:
            if mode == "x50":
                continue
            results[mode] = (
                run(case, twin=False, mode=mode, steps=args.steps),
                run(case, twin=True, mode=mode, steps=args.steps),
            )
            bug, twin = results[mode]
            print(
                f"{case.name} [{mode}]: {len(bug.lines)} lines, twin {len(twin.lines)}",
                file=sys.stderr,
                flush=True,
            )
        if "every" in results and "x50" in modes:
            results["x50"] = tuple(thinned(o) for o in results["every"])  # type: ignore[assignment]
        for mode in MODES:  # a mode not run reads as empty
            results.setdefault(mode, (Outcome(), Outcome()))
        rows.append(Row(case, results))
    if args.details:
        print(details(rows))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
