"""The demo scenarios of the step's time and memory: ``input-bound``, ``retained-graph``,
``memory-creep`` and the job ``straggler``, each with its ``--fixed`` twin.

Two kinds of test. The fast ones need no diagnosis rule: each bug really is in the
loop (the loader sleeps, every step's graph stays alive, the resident memory grows,
rank 1's loader is the slow one) and each fixed twin is free of it. The slow ones run
each scenario as a user does, ``traintop demo NAME --headless``, and check that the
monitor raises the alert the scenario teaches, with the evidence that makes it that
scenario's, and that the fixed twin raises no warning or error.
"""

from __future__ import annotations

import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from demo.catalog import SCENARIOS
from demo.ddp import JobOptions, rank_batches
from demo.scenarios import BUILDERS
from demo.scenarios_resources import SLOW_LOADER_S
from demo.setups import Setup
from demo.trainer import train
from tests.waiting import running_or_runnable

# ---------------------------------------------------------------------------------------
# The bugs themselves, with no rule: fast


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """As ``python -m demo`` trains: one intra-op thread (on a busy machine torch's
    spinning pool made these tiny models' steps ten times slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@dataclass
class Phases:
    """When each step's first training forward began and its optimizer.step() ended, as
    the probe times a step: the wait for data runs from the one to the other, the time
    the training thread was blocked there (a crowded machine's wait for a core is not
    the loader's)."""

    forward_starts: list[float] = field(default_factory=list)
    step_ends: list[float] = field(default_factory=list)

    def attach(self, setup: Setup) -> None:
        def before_forward(module: torch.nn.Module, args: Any) -> None:
            if module.training and len(self.forward_starts) == len(self.step_ends):
                # the step's first forward: its wall time less its busy time
                self.forward_starts.append(time.perf_counter() - running_or_runnable())

        def after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
            self.step_ends.append(time.perf_counter() - running_or_runnable())

        setup.model.register_forward_pre_hook(before_forward)
        setup.optimizer.register_step_post_hook(after_step)

    def waits(self) -> list[float]:
        """Each step's blocked wait for its batch, from the last update to its first
        forward (the first step has no update before it)."""
        return [
            start - end for start, end in zip(self.forward_starts[1:], self.step_ends, strict=False)
        ]


def waits_of(name: str, fixed: bool, steps: int = 40) -> list[float]:
    setup = BUILDERS[name](fixed)
    phases = Phases()
    phases.attach(setup)
    train(setup, run=name, steps=steps)
    return phases.waits()


@pytest.mark.slow  # (-m slow runs alone: it compares each wait to a fraction of a ms)
@pytest.mark.timeout(60)
def test_the_input_bound_loop_waits_for_its_loader_and_the_fix_does_not() -> None:
    waits = waits_of("input-bound", fixed=False)
    fixed = waits_of("input-bound", fixed=True)
    assert len(waits) == len(fixed) == 39
    # every batch: the loader sleeps before it (but the sleep call's own microseconds)
    assert min(waits) >= SLOW_LOADER_S - 0.0002
    assert statistics.median(fixed) < SLOW_LOADER_S / 4, fixed  # no sleep, a few copies


class Tag:
    """Put in a loss's ``grad_fn.metadata``: it lives as long as that node of the graph."""


@dataclass
class GraphWatch:
    """Wraps a loss function: tags the graph node of each training loss, and counts, at
    each call, how many earlier steps' loss nodes are still alive."""

    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    tags: list[weakref.ref[Tag]] = field(default_factory=list)
    alive: list[int] = field(default_factory=list)  # at each training call

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = self.loss_fn(output, target)
        if loss.grad_fn is not None:  # a training step's (validation records no graph)
            self.alive.append(sum(tag() is not None for tag in self.tags))
            tag = Tag()
            loss.grad_fn.metadata["traintop-test"] = tag
            self.tags.append(weakref.ref(tag))
        return loss


def loss_nodes_alive(fixed: bool, steps: int = 30) -> list[int]:
    setup = BUILDERS["retained-graph"](fixed)
    watch = GraphWatch(setup.loss_fn)
    setup.loss_fn = watch
    train(setup, run="retained-graph", steps=steps)
    return watch.alive


@pytest.mark.timeout(60)
def test_the_retained_graph_loop_keeps_every_steps_graph_and_the_fix_frees_it() -> None:
    """``total_loss += loss`` frees the loss tensor itself but chains its graph node (and
    the whole step's graph) to the total: the first step's loss node is alive at the
    last step. With ``loss.item()`` each step's graph goes with its step."""
    alive = loss_nodes_alive(fixed=False)
    assert alive == list(range(30))  # at step k, the k earlier steps' loss nodes
    fixed = loss_nodes_alive(fixed=True)
    assert len(fixed) == 30 and max(fixed) <= 1, fixed  # at most the last step's, in flight


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_by_step(fixed: bool, steps: int = 120) -> list[int]:
    setup = BUILDERS["memory-creep"](fixed)
    memory: list[int] = []
    # Read after the loop's snapshot: at the next step's update (the hook runs first).
    setup.optimizer.register_step_pre_hook(lambda *_: memory.append(resident_bytes()))
    train(setup, run="memory-creep", steps=steps)
    return memory


@pytest.mark.timeout(60)
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads /proc (Linux)")
def test_the_memory_creep_loop_grows_the_resident_memory_and_the_fix_levels_off() -> None:
    setup = BUILDERS["memory-creep"](False)
    snapshot = sum(p.numel() * p.element_size() for p in setup.model.parameters())
    assert 250_000 < snapshot < 300_000  # the docstring's 282 KB a step
    creep = memory_by_step(fixed=False)
    grown = creep[-1] - creep[20]  # 99 snapshots later
    assert grown > 0.8 * 99 * snapshot, f"{grown / 2**20:.1f} MiB"
    level = memory_by_step(fixed=True)
    # The bounded history holds 8 copies: past step 20 its own size is flat, and what the
    # process still gains is the allocator's and the worker's other threads' churn (CI
    # once saw 2.7 MiB, 10 copies' worth, over 99 steps). A fifth of the bug's growth
    # tells a level from a creep with that churn left over.
    levelled = level[-1] - level[20]
    assert levelled < grown / 5, f"{levelled / 2**20:.1f} MiB beside {grown / 2**20:.1f} MiB"


def test_the_straggler_job_slows_rank_1s_loader_alone_and_the_fix_none() -> None:
    from demo.ddp import JOB_BUGS

    straggler = JobOptions(**JOB_BUGS["straggler"])
    train_split = BUILDERS["healthy"](False).train
    delays = [rank_batches(rank, straggler, train_split).delay for rank in (0, 1)]
    assert delays[0] == 0.0 and 0.02 <= delays[1] <= 0.04
    assert [rank_batches(rank, JobOptions(), train_split).delay for rank in (0, 1)] == [0, 0]
    slow = rank_batches(1, straggler, train_split)
    began = time.perf_counter()
    x, _ = slow.next()
    assert time.perf_counter() - began >= delays[1] and x.shape == (32, 16)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["straggler"], {"slow_loader": (1, 0.025), "desync": False}),
        (["straggler", "--fixed"], {"slow_loader": None, "desync": False}),
        (["ddp-desync"], {"slow_loader": None, "desync": True}),
        (["ddp-desync", "--fixed"], {"slow_loader": None, "desync": False}),
    ],
)
def test_a_job_scenario_sets_its_own_bug_and_its_fix_none(
    argv: list[str], expected: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import demo.__main__
    import demo.ddp

    started: list[JobOptions] = []
    monkeypatch.setattr(demo.ddp, "run_job", started.append)
    assert demo.__main__.main([*argv, "--steps", "7"]) == 0
    [options] = started
    assert {name: getattr(options, name) for name in expected} == expected
    assert options.steps == 7 and options.bad_shard is None and options.die is None


# ---------------------------------------------------------------------------------------
# What the monitor raises, as ``traintop demo NAME --headless`` shows it: slow


@dataclass(frozen=True)
class AlertLine:
    severity: str
    kind: str
    fields: dict[str, str]  # step, subject, the evidence, rank


def alert_lines(stdout: str) -> list[AlertLine]:
    """The headless monitor's ``ALERT severity kind key=value ...`` lines."""
    alerts = []
    for line in stdout.splitlines():
        if line.startswith("ALERT "):
            words = shlex.split(line)
            fields = dict(word.split("=", 1) for word in words[3:] if "=" in word)
            alerts.append(AlertLine(words[1], words[2], fields))
    return alerts


RUN_TIMEOUT_S = 150


def run_headless(name: str, fixed: bool) -> tuple[list[AlertLine], str]:
    """``traintop demo NAME [--fixed] --headless`` at full speed: its alerts, its output."""
    command = [sys.executable, "-m", "tui.cli", "demo", name, "--delay", "0"]
    command += ["--fixed"] * fixed + ["--headless", "--summary-every", "1000000"]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            pytest.fail(f"{name} timed out after {RUN_TIMEOUT_S} s:\n{stdout}{stderr}")
    output = stdout + stderr
    assert process.returncode == 0, output
    assert "reason=finished" in stdout, output
    return alert_lines(stdout), output


RESOURCE_SCENARIOS = ["input-bound", "retained-graph", "memory-creep", "straggler"]


def raised(name: str) -> tuple[AlertLine, str]:
    """The first alert of the kind ``name`` teaches, failing if it never came."""
    [kind] = SCENARIOS[name].alerts
    alerts, output = run_headless(name, fixed=False)
    found = [alert for alert in alerts if alert.kind == kind]
    assert found, f"{name} did not raise {kind}:\n{output}"
    return found[0], output


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
@pytest.mark.parametrize("name", RESOURCE_SCENARIOS)
def test_each_fixed_twin_raises_no_warning_or_error(name: str) -> None:
    alerts, output = run_headless(name, fixed=True)
    assert [a for a in alerts if a.severity in ("warning", "error")] == [], output


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_input_bound_is_raised_with_the_loaders_wait() -> None:
    alert, output = raised("input-bound")
    # the loader sleeps 8 ms before every batch: the wait a step is at least that
    assert float(alert.fields["data_ms_per_step"]) >= 0.9 * SLOW_LOADER_S * 1000, output
    assert float(alert.fields["data_share"]) >= 0.25, output


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_retained_graph_is_raised() -> None:
    alert, output = raised("retained-graph")
    assert int(alert.fields["graphs"]) > 1, output


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_memory_creep_is_raised_on_the_resident_memory() -> None:
    alert, output = raised("memory-creep")
    assert alert.fields["source"] == "rss", output


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_straggler_names_rank_1_and_its_wait_for_data() -> None:
    alert, output = raised("straggler")
    assert alert.fields.get("subject") == "rank 1", output
    assert alert.fields["rank"] == "1" and alert.fields["phase"] == "data", output
