"""``traintop run --headless`` on unmodified scripts that lose time or memory
(``tests/run_scripts/resources``): the loader the loop waits for is ``input_bound``, the
FAQ's ``total_loss += loss`` is a ``retained_graph``, features kept for an epoch that never
ends a ``memory_creep``, a growing context compiled with ``dynamic=False`` ``recompiles``,
one rank's slow reader the job's ``straggler``; their fixed twins raise nothing, and every
script's numbers are those of the same training without traintop."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from tests.collector import verdict_lines
from tests.e2e.test_run import kinds, result_lines, torchrun, traintop_run, untouched

pytestmark = pytest.mark.slow  # (a traintop run child each)


@pytest.mark.parametrize(
    ("script", "args", "expected"),
    [
        ("slow_loader", (), {"input_bound"}),
        ("slow_loader", ("--decoded",), set()),
        ("running_loss", (), {"retained_graph"}),
        ("running_loss", ("--item",), set()),
        ("epoch_logits", (), {"memory_creep"}),
        ("epoch_logits", ("--per-epoch",), set()),
        ("growing_context", (), {"recompiles"}),
        ("growing_context", ("--dynamic",), set()),
    ],
)
def test_time_and_memory_lost_by_an_unmodified_script_are_named(
    tmp_path: Any, script: str, args: tuple[str, ...], expected: set[str]
) -> None:
    (tmp_path / "resources").mkdir()  # (the log is named after the script)
    done, frames = traintop_run(tmp_path, f"resources/{script}", *args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert kinds(frames) == expected
    flag = {
        "slow_loader": "decoded",
        "running_loss": "item",
        "epoch_logits": "per_epoch",
        "growing_context": "dynamic",
    }[script]
    assert result_lines(done.stdout) == [untouched(f"resources/{script}", **{flag: bool(args)})]
    steps = [f for f in frames if f["kind"] == "step"]
    # the phases and the memory are in every record the monitor got
    assert steps and all("cycle" in f and "memory" in f for f in steps)


@pytest.mark.parametrize(("args", "expected"), [((), ["straggler"]), (("--same-readers",), [])])
def test_the_rank_whose_reader_is_slow_is_the_straggler_by_its_data_wait(
    tmp_path: Any, args: tuple[str, ...], expected: list[str]
) -> None:
    (tmp_path / "resources").mkdir()
    done, _ = traintop_run(tmp_path, "resources/ddp_slow_rank", *args, launcher=torchrun())
    assert done.returncode == 0, done.stderr[-2000:]
    lines = verdict_lines(done.stdout)
    assert [line.split()[2] for line in lines] == expected, lines
    if expected:
        [line] = lines
        assert 'subject="rank 1"' in line or "subject='rank 1'" in line or "rank=1" in line
        assert "phase=data" in line
        assert f"host={socket.gethostname()}" in line
