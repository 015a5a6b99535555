"""Healthy recipes benchmark (issue 29, item 1): training runs people actually use, each
healthy and learning, watched by traintop. Every alert on them is a false alarm.

    python tests/bench/healthy_recipes.py                  # every recipe, every mode
    python tests/bench/healthy_recipes.py --quick          # modes full and every only
    python tests/bench/healthy_recipes.py --recipe nanogpt # some recipes (repeatable)
    python tests/bench/healthy_recipes.py --mode full      # some modes (repeatable)
    python tests/bench/healthy_recipes.py --jobs 2         # recipes in parallel processes
    python tests/bench/healthy_recipes.py --list           # name the recipes and stop

Each recipe (``Recipe``: name, loop shape, how it is watched, steps, ``run``) is a small
model on synthetic but learnable data, trained with a public script's recipe for at
least 1,000 optimizer steps (``tests/bench/healthy_models.py``, ``healthy_loops.py``,
``healthy_special.py``, ``healthy_frameworks.py``). ``run(bench, steps)`` trains it:
through ``bench.watch(model, optimizer)`` (``probes.watch`` pointed at the bench's
stand-in monitor), or a framework's callback given ``bench.callback_options()``, or
``traintop run`` as a child process. It may return a ``Trained``: its losses (else the
losses it logged to the probe, else the step records'), and for a run whose loss need
not fall (a GAN, REINFORCE) its own check that it learns.

Modes: ``full`` (full speed, the probe's default thinning), ``slow`` (a sleep of
``SLOW_DELAY`` in each step and every step its own record: 1,000 steps take about 10 s,
the time a slow model's steps would take), ``every`` (every step its own record with no
sleep: slow's records, cheaply). The frames go through the monitor's own state
(``tests.bench.diagnosis_suite.monitor``): an alert is one ALERT line of ``traintop
--headless``. Nothing is filtered: every kind counts, ``probe_overhead`` included.

The learning check: the mean of the last 50 losses under 0.8 times the mean of the
first 10, or the recipe's own check. The table goes to stdout and to
``tests/bench/results/healthy_recipes.md`` (with every ALERT line, its evidence).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: this checkout unless PYTHONPATH says
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import torch

import probes
from tests.bench.diagnosis_suite import forget_shown_warnings, monitor, slow_forward, slowed
from tests.collector import FrameCollector

MODES = {
    "full": "full speed, the probe's default thinning",
    "slow": "a sleep per step, every step its own record",
    "every": "every step its own record (by option), no sleep",
}
SLOW_DELAY = 0.01  # s per step: 1,000 steps in about 10 s
EVERY = {"max_steps_per_s": 1e9}  # the watch option that sends every step
RESULTS = Path(__file__).resolve().parent / "results" / "healthy_recipes.md"
FIRST, LAST, FALL = 10, 50, 0.8  # the loss check: mean(last 50) < 0.8 * mean(first 10)


@dataclass
class Trained:
    """What a recipe says of its own run (all optional)."""

    losses: list[float] = field(default_factory=list)  # one a step, as the script saw it
    learned: bool | None = None  # its own check (None: the loss check)
    evidence: str = ""  # what its own check measured
    note: str = ""  # anything else worth a line (a compile's seconds)


class Bench:
    """What a recipe trains with: the watch call, the callback options, the mode's
    sleep, all pointed at the bench's stand-in monitor."""

    def __init__(self, name: str, mode: str, collector: FrameCollector, folder: str) -> None:
        self.name, self.mode, self.folder = name, mode, folder
        self.collector, self.address = collector, collector.address
        self.delay = SLOW_DELAY if mode == "slow" else 0.0
        self.options: dict[str, Any] = dict(EVERY) if mode in ("slow", "every") else {}
        self.logged: list[float] = []  # the losses given to probe.log
        self.printed: list[str] | None = None  # ALERT lines a headless monitor printed

    def watch(self, model: Any, optimizer: Any = None, **options: Any) -> Any:
        """``probes.watch`` for this mode; the model's forward lasts ``delay`` longer,
        and each ``probe.log(loss=...)`` is noted (``logged``)."""
        probe = probes.watch(
            model, optimizer, address=self.address, run=self.name, **{**self.options, **options}
        )
        log = probe.log

        def noting_log(**scalars: Any) -> None:
            loss = scalars.get("loss")
            if loss is not None and not probe.evaluating:
                value = loss.detach() if isinstance(loss, torch.Tensor) else loss
                self.logged.append(float(value))
            log(**scalars)

        probe.log = noting_log  # type: ignore[method-assign]
        return slowed(probe, self.delay)

    def callback_options(self, **options: Any) -> dict[str, Any]:
        """Keyword arguments for a framework's ``TraintopCallback``."""
        return {"address": self.address, "run": self.name, **self.options, **options}

    def slow(self, model: Any) -> None:
        """The mode's sleep in ``model``'s forward, for a model a framework's callback
        watches (``watch`` slows its own model)."""
        if self.delay:
            slow_forward(model, self.delay)


Frames = list[dict[str, Any]]  # a run that brings its own frames (``traintop run``)


@dataclass(frozen=True)
class Recipe:
    name: str
    shape: str  # the loop's shape: what happens between two updates
    watched_by: str  # how traintop watches it
    steps: int  # optimizer steps (probe steps) at full length
    run: Callable[[Bench, int], Any]  # trains; returns a Trained, frames, or None
    check: str = ""  # its own learning check, in words (a GAN, REINFORCE)


@dataclass
class Seen:
    """One alert, as the table and the details name it."""

    kind: str
    step: int
    subject: str
    line: str  # the ALERT line, with its evidence

    @property
    def short(self) -> str:
        return f"{self.kind}@{self.step}" + (f"[{self.subject}]" if self.subject else "")


@dataclass
class Measured:
    """One recipe in one mode."""

    recipe: str
    mode: str
    alerts: list[Seen] = field(default_factory=list)
    steps: int = 0  # from the step records
    records: int = 0
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    learned: bool | None = None
    evidence: str = ""
    note: str = ""
    error: str = ""  # a traceback: the run or the monitor failed
    causes: str = ""

    @property
    def loss_check(self) -> tuple[float, float] | None:
        if len(self.losses) < FIRST + LAST:
            return None
        return mean(self.losses[:FIRST]), mean(self.losses[-LAST:])

    @property
    def learns(self) -> bool | None:
        if self.learned is not None:
            return self.learned
        check = self.loss_check
        return None if check is None else check[1] < FALL * check[0]


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def measure(recipe: Recipe, mode: str, steps: int | None = None) -> Measured:
    """Train ``recipe`` in ``mode`` under a stand-in monitor; what the monitor raised."""
    folder = tempfile.mkdtemp(prefix="tt-healthy-")
    collector = FrameCollector(os.path.join(folder, "m.sock"))
    bench = Bench(recipe.name, mode, collector, folder)
    out = Measured(recipe.name, mode)
    torch.manual_seed(0)
    forget_shown_warnings()
    started = time.perf_counter()
    try:
        result = recipe.run(bench, steps or recipe.steps)
        out.seconds = time.perf_counter() - started
        if isinstance(result, list):
            frames = result
        else:
            if not collector.wait_for(lambda fs: any(f["kind"] == "bye" for f in fs), 30):
                raise RuntimeError(f"{recipe.name}: the probe never said bye")
            frames = list(collector.frames)
        trained = result if isinstance(result, Trained) else Trained()
        out.learned, out.evidence, out.note = trained.learned, trained.evidence, trained.note
        out.losses = trained.losses or bench.logged or step_losses(frames)
        errors = [f.get("message", "") for f in frames if f.get("name") == "probe_error"]
        errors += collector.errors
        if errors:
            out.note += f" probe errors: {errors[:3]}"
        seen = monitor(frames, out.seconds)
        out.steps, out.records, out.causes = seen.steps, seen.records, seen.causes
        out.alerts = [Seen(a.kind, a.step, a.subject or "", a.line()) for a in seen.alerts]
        if bench.printed is not None and bench.printed != seen.lines:
            out.note += f" the headless monitor printed other ALERT lines: {bench.printed}"
    except Exception:
        out.seconds = out.seconds or time.perf_counter() - started
        out.error = traceback.format_exc()
    finally:
        collector.close()
        shutil.rmtree(folder, ignore_errors=True)
    return out


def step_losses(frames: Frames) -> list[float]:
    return [
        float(f["scalars"]["loss"])
        for f in frames
        if f["kind"] == "step" and isinstance(f.get("scalars", {}).get("loss"), int | float)
    ]


def recipes() -> list[Recipe]:
    """Every recipe, in the issue's order."""
    from tests.bench import healthy_frameworks, healthy_loops, healthy_models, healthy_special

    return [
        *healthy_models.RECIPES,
        *healthy_loops.RECIPES,
        *healthy_special.RECIPES,
        *healthy_frameworks.RECIPES,
    ]


def _measure_named(name: str, mode: str, steps: int | None) -> Measured:
    """A worker's task (``--jobs``): the recipe found by name in a fresh process."""
    torch.set_num_threads(1)
    return measure(next(r for r in recipes() if r.name == name), mode, steps)


def measure_all(
    chosen: list[Recipe], modes: list[str], steps: int | None, jobs: int = 1
) -> dict[str, dict[str, Measured]]:
    """recipe name -> mode -> what it measured; progress on stderr."""
    tasks = [(recipe, mode) for recipe in chosen for mode in modes]
    results: dict[str, dict[str, Measured]] = {recipe.name: {} for recipe in chosen}

    def note(done: Measured) -> None:
        results[done.recipe][done.mode] = done
        said = "CRASHED" if done.error else ", ".join(s.short for s in done.alerts) or "none"
        print(
            f"{done.recipe} [{done.mode}] {done.steps} steps {done.seconds:.1f} s: {said}",
            file=sys.stderr,
            flush=True,
        )

    if jobs <= 1:
        for recipe, mode in tasks:
            note(measure(recipe, mode, steps))
        return results
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=context) as pool:
        futures = [pool.submit(_measure_named, r.name, mode, steps) for r, mode in tasks]
        for future in futures:
            note(future.result())
    return results


# --- the table ---------------------------------------------------------------------------


def alerts_cell(measured: Measured | None) -> str:
    if measured is None:
        return "-"
    if measured.error:
        return "CRASHED: " + measured.error.strip().splitlines()[-1][:80]
    return ", ".join(s.short for s in measured.alerts) or "none"


def loss_cell(recipe: Recipe, measured: Measured | None) -> str:
    if measured is None or measured.error:
        return "-"
    check = measured.loss_check
    losses = "-" if check is None else f"{check[0]:.3g}→{check[1]:.3g}"
    verdict = {True: "ok", False: "NOT LEARNING", None: "?"}[measured.learns]
    if measured.learned is not None:
        return f"{losses}; {recipe.check}: {measured.evidence} {verdict}"
    return f"{losses} {verdict}"


def table(chosen: list[Recipe], results: dict[str, dict[str, Measured]]) -> str:
    """The table, its summary line, and the details (every ALERT line)."""
    modes = [m for m in ("full", "slow", "every") if any(m in r for r in results.values())]
    head = (
        "| recipe | steps | loop shape | how watched | loss first→last (mean of first "
        f"{FIRST} → last {LAST}) | " + " | ".join(f"alerts ({m})" for m in modes) + " |"
    )
    lines = [head, "|" + "---|" * (5 + len(modes))]
    silent = verdict_free = 0
    for recipe in chosen:
        ran = results[recipe.name]
        reference = next((ran[m] for m in modes if m in ran), None)
        steps = str(reference.steps if reference and reference.steps else recipe.steps)
        cells = [recipe.name, steps, recipe.shape, recipe.watched_by]
        cells += [loss_cell(recipe, reference), *(alerts_cell(ran.get(m)) for m in modes)]
        lines.append("| " + " | ".join(cells) + " |")
        silent += all(not m.alerts and not m.error for m in ran.values())
        # the target: no warning or error (an info note, the probe's own cost on a busy
        # machine or a model frozen on purpose, is no verdict on the training)
        verdict_free += all(
            not m.error and all(a.line.split()[1] == "info" for a in m.alerts) for m in ran.values()
        )
    crashed = [r.name for r in chosen if any(m.error for m in results[r.name].values())]
    not_learning = [
        r.name
        for r in chosen
        if any(m.learns is False for m in results[r.name].values() if not m.error)
    ]
    lines += [
        "",
        f"{verdict_free} of {len(chosen)} with no warning or error in any mode run (the target)",
        f"{silent} of {len(chosen)} silent (not even an info note)",
    ]
    if crashed:
        lines.append(f"crashed: {', '.join(crashed)}")
    if not_learning:
        lines.append(f"failed their learning check: {', '.join(not_learning)}")
    return "\n".join(lines)


def details(chosen: list[Recipe], results: dict[str, dict[str, Measured]]) -> str:
    out = []
    for recipe in chosen:
        for mode, m in results[recipe.name].items():
            head = f"{recipe.name} [{mode}]: {m.steps} steps in {m.records} records, "
            head += f"{m.seconds:.1f} s"
            if m.note.strip():
                head += f"; {m.note.strip()}"
            out.append(f"- {head}")
            out += [f"    {s.line}" for s in m.alerts]
            if m.causes:
                out.append(f"    {m.causes}")
            if m.error:
                out += [f"    {line}" for line in m.error.rstrip().splitlines()]
    return "\n".join(out)


def write_results(text: str, command: str, seconds: float) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=RESULTS.parent, capture_output=True, text=True
    ).stdout.strip()
    head = [
        "# Healthy recipes: false alarms",
        "",
        f"`{command}` at {commit or 'an unknown commit'}, torch {torch.__version__}, "
        f"{os.cpu_count()} CPUs, {seconds:.0f} s in all.",
        "",
        "",
    ]
    RESULTS.write_text("\n".join(head) + text + "\n")


def select(names: list[str] | None) -> list[Recipe]:
    every = recipes()
    if not names:
        return every
    by_name = {r.name: r for r in every}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise SystemExit(f"no recipe {', '.join(missing)}; --list names them")
    return [by_name[n] for n in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--recipe", action="append", help="run only these (repeatable)")
    parser.add_argument("--mode", action="append", choices=list(MODES), help="default: all")
    parser.add_argument("--quick", action="store_true", help="modes full and every only")
    parser.add_argument("--jobs", type=int, default=1, help="recipes in parallel processes")
    parser.add_argument("--steps", type=int, help="override every recipe's steps")
    parser.add_argument("--list", action="store_true", help="name the recipes and stop")
    parser.add_argument("--no-write", action="store_true", help=f"do not write {RESULTS.name}")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.list:
        for r in recipes():
            print(f"{r.name:24} {r.steps:6} {r.shape:28} {r.watched_by}")
        return 0
    chosen = select(args.recipe)
    modes = args.mode or (["full", "every"] if args.quick else ["full", "slow", "every"])
    started = time.perf_counter()
    results = measure_all(chosen, modes, args.steps, args.jobs)
    seconds = time.perf_counter() - started
    text = table(chosen, results) + "\n\n## Every alert, per run\n\n" + details(chosen, results)
    print(text)
    print(f"\nbench time: {seconds:.0f} s", file=sys.stderr)
    if not args.no_write:
        command = "python tests/bench/healthy_recipes.py " + " ".join(argv or sys.argv[1:])
        write_results(text, command.strip(), seconds)
    return 0


if __name__ == "__main__":  # the recipes import this module by name: run that one
    from tests.bench.healthy_recipes import main as imported_main

    sys.exit(imported_main())
