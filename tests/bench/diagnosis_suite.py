"""Diagnosis benchmark: documented bugs on models the rules never saw, and their twins,
across the loop shapes real scripts use (the matrix).

    python tests/bench/diagnosis_suite.py                 # every case, table at the end
    python tests/bench/diagnosis_suite.py --quick         # the matrix, no slowed-down runs
    python tests/bench/diagnosis_suite.py --set matrix    # only the matrix (or: legacy)
    python tests/bench/diagnosis_suite.py --case NAME     # some cases (repeatable); a bug
                                           # name without /shape means all its shapes
    python tests/bench/diagnosis_suite.py --shape accum   # some loop shapes (repeatable)
    python tests/bench/diagnosis_suite.py --mode full     # some modes (repeatable)
    python tests/bench/diagnosis_suite.py --train NAME [--twin] [--delay S]
                                           # one case as a plain training script, for a
                                           # monitor you run yourself (traintop --headless)
    python tests/bench/diagnosis_suite.py --reference NAME
                                           # an exploding case's norms measured directly

The cases: the 21 documented bugs of ``tests/bench/diagnosis_cases.py`` (``CASES``, one
backward per update), and the matrix of ``tests/bench/matrix_cases.py`` (``MATRIX``):
the checklist's bugs on every loop shape where they occur (one backward per update,
gradient accumulation, an LBFGS closure, hand-written updates with no optimizer, AMP
with a GradScaler, a ``torch.compile``d model), on models in the style of public
training scripts (nanoGPT, word_language_model, the mnist example, the LBFGS
time-sequence example, an ``nn.TransformerEncoder``). What each must raise is data:
``Case.expect``/``Case.subject``, and for the matrix ``EXPECTED`` in diagnosis_cases.py
(with the kinds still to be merged named in ``PLACEHOLDER_KINDS``).

Each case trains its buggy loop and its healthy twin in several modes: ``slow`` (a
sleep inside each step, so each step is sent as its own record, as a run at under 60 steps/s
is), ``full`` (full speed with the probe's default thinning: 60 records a second, each
standing for several steps), ``every`` (every step its own record by option, with no
sleep: the slowed-down run's records, cheaply), and ``x50``, the slowed-down run's
records thinned 50 to 1 as the sender would at 3,000 steps/s. The frames go to an
in-process stand-in monitor and then through the monitor's own state and rules,
exactly as ``traintop --headless`` applies them: an ALERT line is one ``AlertRaised``.

The table gives, per case, from the slowed-down run (``slow``, else ``every``): the
expected kind and first layer, whether it was raised with that subject, the step of
its first alert, the ALERT lines of the buggy run, the false alarms (ALERT lines) of
the twin, whether the run's first alert was the root cause (the expected kind and
subject); then whether full speed (and x50) said the same (kind, subject, first step
within 2). Targets: every case raised with the right kind and first layer, no false
alarm, at most 3 ALERT lines per root cause, the root cause first, the same at full
speed.

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
from tests.bench.diagnosis_cases import CASES, PLACEHOLDER_KINDS, Case
from tests.bench.matrix_cases import MATRIX
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
    "slow": "slowed down (a sleep per step: each step its own record)",
    "every": "every step a record (by option, no sleep)",
    "full": "full speed, thinned",
    "x50": "the slowed-down records thinned x50 (a 3,000 steps/s run)",
}
THINNED = 50  # steps per record for x50: 3,000 steps/s at the sender's 60 records/s
SLOW_DELAY = 0.02  # s per step: 50 steps/s, under the sender's 60 records a second
ALL_CASES: list[Case] = [*CASES, *MATRIX]


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


def slowed(probe: Any, delay: float) -> Any:
    """The probe, its model's every forward ``delay`` seconds longer: a slower loop, the
    time where a bigger model's would be (in its compute; a sleep between steps would be
    a wait for data, and rightly read as one: rung 8's ``input_bound``)."""
    if delay:
        slow_forward(probe.model, delay)
    return probe


def slow_forward(model: Any, delay: float) -> None:
    """Every forward of ``model`` sleeps ``delay`` seconds once computed (a bench's own
    hook: after the forward, so that it is the forward's time whatever hooks ran first)."""

    def sleep(module: Any, args: Any, output: Any) -> None:
        time.sleep(delay)

    model.register_forward_hook(sleep)


def run(case: Case, *, twin: bool, mode: str, steps: int | None = None) -> Outcome:
    """Train ``case`` (or its twin) under a probe; what the monitor raises."""
    folder = tempfile.mkdtemp(prefix="tt-bench-")
    collector = FrameCollector(os.path.join(folder, "m.sock"))
    options = {"max_steps_per_s": 1e9} if mode == "every" else {}
    delay = SLOW_DELAY if mode == "slow" else 0.0

    def watch(model: Any, optimizer: Any, **kw: Any) -> Any:
        probe = probes.watch(
            model,
            optimizer,
            address=collector.address,
            run=f"{case.name}{'-twin' if twin else ''}",
            **{**options, **kw},
        )
        return slowed(probe, delay)

    torch.manual_seed(0)
    forget_shown_warnings()
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


def forget_shown_warnings() -> None:
    """Each case is a fresh script: Python shows a warning once per place (its
    ``__warningregistry__``), and the cases share their places (the same loss line)."""
    for module in list(sys.modules.values()):
        registry = getattr(module, "__warningregistry__", None)
        if isinstance(registry, dict):
            registry.clear()


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


def subject_matches(named: str, expected: str) -> bool:
    """A layer written as itself ("fc1") also matches a field on it ("grad_norm[fc1]")."""
    return named == expected or (expected != "" and named.endswith(f"[{expected}]"))


@dataclass(frozen=True)
class Verdict:
    """What one mode of one case says, against the case's expectation."""

    hit: bool  # raised with the right kind and subject (a near miss: nothing raised)
    named: str  # the subject the expected kind was raised with; "-": not raised
    step: int | None  # the step of that alert (a near miss: of the first alert, if any)
    lines: int  # ALERT lines of the buggy run
    alarms: int  # ALERT lines of the twin: false alarms
    root_first: bool | None  # the run's first alert is the root cause; None: none raised
    raised: tuple[tuple[str, str], ...] = ()  # every alert (kind, subject), in order
    first_step: int | None = None  # the step of the run's first alert

    def same(self, other: Verdict) -> bool:
        """The same diagnosis: the same alerts (kind and subject, in order), the expected
        one's step and the first alert's step within 2, the twin as many ALERT lines."""
        if self.named != other.named or self.raised != other.raised:
            return False
        if self.alarms != other.alarms:
            return False
        return _close(self.step, other.step) and _close(self.first_step, other.first_step)


def _close(a: int | None, b: int | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= 2


@dataclass
class Row:
    case: Case
    results: dict[str, tuple[Outcome, Outcome]]  # mode -> (bug, twin)

    def verdict(self, mode: str) -> Verdict:
        bug, twin = self.results[mode]
        case = self.case
        first = bug.alerts[0] if bug.alerts else None
        raised = tuple((a.kind, a.subject or "") for a in bug.alerts)
        first_step = None if first is None else first.step
        if not case.expect:  # a near miss: the bug run must stay silent too
            named = "-" if first is None else ":".join(filter(None, raised[0]))
            return Verdict(
                first is None,
                named,
                first_step,
                len(bug.lines),
                len(twin.lines),
                None,
                raised,
                first_step,
            )
        alert = bug.first(case.expect)
        named = "-" if alert is None else (alert.subject or "")
        root_first = None
        if first is not None:
            root_first = first.kind == case.expect and subject_matches(
                first.subject or "", case.subject
            )
        return Verdict(
            alert is not None and subject_matches(named, case.subject),
            named,
            None if alert is None else alert.step,
            len(bug.lines),
            len(twin.lines),
            root_first,
            raised,
            first_step,
        )


def reference_mode(rows: list[Row]) -> str:
    """The slowed-down mode the table reads: ``slow`` when it ran, else ``every``."""
    ran = {mode for row in rows for mode, (bug, _) in row.results.items() if bug.frames}
    return next((mode for mode in ("slow", "every", "full") if mode in ran), "full")


def _mark(verdict: Verdict) -> str:
    if verdict.hit:
        return "yes"
    return "no" if verdict.named == "-" else f"wrong: {verdict.named or '(run)'}"


def _first(verdict: Verdict) -> str:
    return "-" if verdict.root_first is None else ("yes" if verdict.root_first else "no")


def _compared(verdict: Verdict, reference: Verdict, ran: bool) -> str:
    """ "same", or what differs from the slowed-down run: the expected kind's verdict and
    step, the kinds raised only here (+) and only there (-)."""
    if not ran:
        return "-"
    if verdict.same(reference):
        return "same"
    here = [kind for kind, _ in verdict.raised]
    there = [kind for kind, _ in reference.raised]
    step = "-" if verdict.step is None else str(verdict.step)
    cell = f"{_mark(verdict)} @{step}, first @{verdict.first_step}"
    cell += "".join(f" +{kind}" for kind in here if kind not in there)
    cell += "".join(f" -{kind}" for kind in there if kind not in here)
    return cell + (f", twin {verdict.alarms}" if verdict.alarms != reference.alarms else "")


def table(rows: list[Row]) -> str:
    """The matrix table and its summary."""
    ref = reference_mode(rows)
    others = [mode for mode in ("full", "x50") if mode != ref]
    head = (
        "| case | shape | model | expected kind | first layer | raised | step | ALERT lines "
        "| twin alarms | root cause first |"
        + "".join(f" {mode}: same? |" for mode in others)
        + " steps/s |"
    )
    lines = [f"slowed-down reference: {MODES[ref]}", "", head]
    lines.append("|" + "---|" * (head.count("|") - 1))
    for row in rows:
        case, verdict = row.case, row.verdict(ref)
        expect = case.expect or "(nothing)"
        if case.expect in PLACEHOLDER_KINDS:
            expect += "*"
        cells = [case.name, case.shape, case.model, expect, case.subject or "(run)"]
        cells += [_mark(verdict), "-" if verdict.step is None else str(verdict.step)]
        cells += [str(verdict.lines), str(verdict.alarms), _first(verdict)]
        for mode in others:
            ran = bool(row.results[mode][0].frames)
            cells.append(_compared(row.verdict(mode), verdict, ran))
        full = row.results["full"][0]
        cells.append(f"{full.steps / full.seconds:.0f}" if full.seconds else "-")
        lines.append("| " + " | ".join(cells) + " |")
    if PLACEHOLDER_KINDS:
        lines.append("")
        lines.append("(* a kind main does not have yet: a placeholder name, see PLACEHOLDER_KINDS)")
    lines.append("")
    lines += summary(rows, ref, others)
    return "\n".join(lines)


def summary(rows: list[Row], ref: str, others: list[str]) -> list[str]:
    """The targets, measured: right kind and layer, false alarms, ALERT lines per root
    cause, the root cause first, the same at full speed."""
    verdicts = [row.verdict(ref) for row in rows]
    count = len(rows)

    def share(n: int, of: int) -> str:
        return f"{n}/{of} ({100 * n / of:.0f}%)" if of else "0/0"

    hits = sum(v.hit for v in verdicts)
    raised = [v for v in verdicts if v.root_first is not None]
    out = [
        f"summary ({count} cases, {MODES[ref]}):",
        f"- right kind and first layer: {share(hits, count)} (target 100%)",
        f"- false alarms on the twins: {sum(v.alarms for v in verdicts)} ALERT lines on "
        f"{sum(v.alarms > 0 for v in verdicts)} twins (target 0)",
        f"- ALERT lines per root cause: max {max((v.lines for v in verdicts), default=0)}, "
        f"{sum(v.lines > 3 for v in verdicts)} cases over 3 (target at most 3)",
        f"- root cause first: {share(sum(bool(v.root_first) for v in raised), len(raised))} "
        "of the cases that raised anything (target all)",
    ]
    for mode in others:
        ran = [row for row in rows if row.results[mode][0].frames]
        same = sum(row.verdict(mode).same(row.verdict(ref)) for row in ran)
        hits_there = sum(row.verdict(mode).hit for row in ran)
        alarms_there = sum(row.verdict(mode).alarms for row in ran)
        out.append(
            f"- the same at {mode} ({MODES[mode]}): {share(same, len(ran))}; right kind and "
            f"layer there {share(hits_there, len(ran))}; false alarms there {alarms_there} "
            "(targets 100%, 100%, 0)"
        )
    placeholders = [r for r in rows if r.case.expect in PLACEHOLDER_KINDS]
    if placeholders:
        out.append(
            f"- {len(placeholders)} cases expect a kind main does not have yet "
            f"({', '.join(sorted({r.case.expect for r in placeholders}))})"
        )
    return out


def details(rows: list[Row]) -> str:
    out = []
    for row in rows:
        for mode, (bug, twin) in row.results.items():
            if not bug.frames:
                continue
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
        return slowed(probe, delay)

    torch.manual_seed(0)
    case.run(twin, watch, steps or case.steps)


def select(names: list[str] | None, shapes: list[str] | None, which: str) -> list[Case]:
    """The cases asked for: by set, by name (a bug without /shape: all its shapes, and
    the legacy case of that name), by shape."""
    cases = {"all": ALL_CASES, "legacy": CASES, "matrix": MATRIX}[which]
    if names:
        chosen = []
        for name in names:
            found = [case for case in ALL_CASES if name in (case.name, case.name.split("/")[0])]
            if not found:
                raise SystemExit(f"no case {name!r}; --list names them")
            chosen += found
        cases = chosen
    if shapes:
        cases = [case for case in cases if case.shape in shapes]
    return cases


def measure(cases: list[Case], modes: list[str], steps: int | None) -> list[Row]:
    """Run each case and its twin in each mode (x50 thins the slowed-down records)."""
    rows = []
    for case in cases:
        results: dict[str, tuple[Outcome, Outcome]] = {}
        for mode in modes:
            if mode == "x50":
                continue
            results[mode] = (
                run(case, twin=False, mode=mode, steps=steps),
                run(case, twin=True, mode=mode, steps=steps),
            )
            bug, twin = results[mode]
            print(
                f"{case.name} [{mode}]: {len(bug.lines)} lines, twin {len(twin.lines)}",
                file=sys.stderr,
                flush=True,
            )
        source = next((m for m in ("slow", "every") if m in results), None)
        if source is not None and "x50" in modes:
            bug, twin = results[source]
            results["x50"] = (thinned(bug), thinned(twin))
        for mode in MODES:  # a mode not run reads as empty
            results.setdefault(mode, (Outcome(), Outcome()))
        rows.append(Row(case, results))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", help="run only these cases")
    parser.add_argument("--shape", action="append", help="run only these loop shapes")
    parser.add_argument(
        "--set", choices=("all", "legacy", "matrix"), default="all", help="which cases"
    )
    parser.add_argument(
        "--mode",
        action="append",
        choices=list(MODES),
        help="default: slow, full and x50 (x50 thins slow's or every's records)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the matrix only, every instead of slow (no sleeping): 1.5 min here",
    )
    parser.add_argument("--list", action="store_true", help="name the cases and stop")
    parser.add_argument("--train", help="run one case as a training script")
    parser.add_argument("--twin", action="store_true")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--details", action="store_true", help="print every ALERT line")
    parser.add_argument("--reference", help="measure a case's gradient norms directly")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    by_name = {case.name: case for case in ALL_CASES}
    if args.list:
        for case in ALL_CASES:
            print(f"{case.name:44} {case.shape:8} {case.model:20} {case.expect or '-'}")
        return 0
    if args.train:
        train_alone(by_name[args.train], args.twin, args.delay, args.steps)
        return 0
    if args.reference:
        print(reference(by_name[args.reference], args.steps))
        return 0
    which = "matrix" if args.quick and not args.case and args.set == "all" else args.set
    cases = select(args.case, args.shape, which)
    modes = args.mode or (["every", "full", "x50"] if args.quick else ["slow", "full", "x50"])
    rows = measure(cases, modes, args.steps)
    if args.details:
        print(details(rows))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
