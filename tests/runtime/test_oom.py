"""The report of a step that ran out of memory (``probes.runtime.measure.oom``): which
errors are out-of-memory errors, the alert's evidence from a real model, that it never
raises and stays bounded; and the report asked of the open probes when such an error
escapes the script (``probes.runtime.lifecycle``), the process ending as it would have."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
import torch
from torch import nn

from probes.kernel.diagnosis.catalog import entry
from probes.kernel.diagnosis.vocabulary import AlertKind, Severity
from probes.kernel.units import human_bytes
from probes.runtime.measure import oom
from probes.runtime.measure.oom import error_line, is_out_of_memory, oom_alert

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1024**2


def cpu_oom() -> BaseException:
    """A real allocation failure: 4 EiB is past any address space, so the CPU allocator
    refuses at once, touching no memory (torch 2.13: a RuntimeError)."""
    try:
        torch.empty(2**62, dtype=torch.uint8)
    except BaseException as error:  # (whatever torch raises is the point)
        return error
    raise AssertionError("a 4 EiB allocation succeeded")


class Unprintable(RuntimeError):
    def __str__(self) -> str:
        raise ValueError("no text")


def trained() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("embed", nn.Linear(16, 64))
    model.add_module("big", nn.Linear(64, 32768))  # 8 MiB of weights
    model.add_module("head", nn.Linear(32768, 2))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 16)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_human_bytes() -> None:
    assert human_bytes(0) == "0 B"
    assert human_bytes(512) == "512 B"
    assert human_bytes(502 * 1024) == "502 KiB"
    assert human_bytes(1.9 * 1024**3) == "1.9 GiB"
    assert human_bytes(402 * MiB) == "402 MiB"
    assert human_bytes(1024 * 1024 - 1) == "1.0 MiB"  # never "1024 KiB"
    assert human_bytes(-3 * MiB) == "-3.0 MiB"
    assert human_bytes(float("nan")) == "?"
    assert human_bytes("x") == "?"  # type: ignore[arg-type]


def test_real_and_constructed_out_of_memory_errors_are_told_apart() -> None:
    started = time.perf_counter()
    real = cpu_oom()
    print(f"\nCPU OOM raised {type(real).__name__} in {time.perf_counter() - started:.4f} s")
    assert is_out_of_memory(real)
    assert error_line(real).startswith("DefaultCPUAllocator: can't allocate memory")
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert is_out_of_memory(RuntimeError("CUDNN_STATUS_ALLOC_FAILED"))
    try:
        raise RuntimeError("the step failed") from real
    except RuntimeError as wrapped:
        assert is_out_of_memory(wrapped)  # raised from one
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_out_of_memory(ValueError("out of memory"))  # not an allocator's
    assert not is_out_of_memory(KeyboardInterrupt())
    assert not is_out_of_memory(Unprintable())


def test_the_report_names_the_module_that_holds_the_memory() -> None:
    model, optimizer = trained()
    history = [100 * MiB, 120 * MiB, float("nan"), 130 * MiB, None, 140 * MiB, 150 * MiB, 160 * MiB]
    started = time.perf_counter()
    alert = oom_alert(
        cpu_oom(),
        step=41,
        phase="backward",
        history=history,  # type: ignore[arg-type]
        source="rss",
        module=model,
        optimizer=optimizer,
    )
    print(f"\nreport in {time.perf_counter() - started:.3f} s:", alert.line())
    described = entry(AlertKind.OUT_OF_MEMORY)
    assert alert.kind == AlertKind.OUT_OF_MEMORY and alert.severity == Severity.ERROR
    assert (alert.step, alert.subject) == (41, "backward")
    assert list(alert.evidence) == [key for key, _ in described.evidence]
    assert alert.experiments == described.experiments
    evidence = alert.evidence
    assert evidence["phase"] == "backward"
    assert evidence["error"].startswith("DefaultCPUAllocator: can't allocate memory")
    assert evidence["memory"] == "160 MiB"
    assert evidence["history"] == "120 MiB, 130 MiB, 140 MiB, 150 MiB, 160 MiB"
    assert evidence["peak"].endswith(("MiB", "GiB"))
    largest = evidence["largest"].split("; ")
    # the big Linear's weight, bias and their gradients (16 MiB), then Adam's two
    # moments of them (16 MiB and a step count)
    assert largest[0].split(": ")[0] in {"big", "big (optimizer state)"}
    assert {item.split(": ")[0] for item in largest[:2]} == {"big", "big (optimizer state)"}
    assert largest[0].split(": ")[1] == "16 MiB"
    assert alert.to_dict()["evidence"] == evidence  # (it travels as it is)


def test_it_never_raises_on_odd_input() -> None:
    alert = oom_alert(
        Unprintable(), step=0, phase="", history=[], source="rss", module=None, optimizer=None
    )
    assert alert.evidence["error"] == "Unprintable"
    assert alert.evidence["history"] == "none measured"
    assert alert.evidence["memory"].endswith("(now: no step measured)")
    assert alert.subject == "unknown"
    odd = oom_alert(
        MemoryError(),
        step="x",  # type: ignore[arg-type]
        phase=None,  # type: ignore[arg-type]
        history=None,  # type: ignore[arg-type]
        source="cuda",  # no CUDA here: those pieces say unknown
        module=nn.Linear(2, 2),
        optimizer=object(),
    )
    assert odd.step == 0 and odd.evidence["error"] == "MemoryError"
    assert odd.evidence["peak"] == "unknown"


def test_the_scan_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    model, optimizer = trained()
    monkeypatch.setattr(oom, "SCAN_BUDGET_S", 0.0)
    monkeypatch.setattr(oom, "SCAN_CHECK_EVERY", 100)
    largest = oom.largest_tensors(model, optimizer, on_cuda=False)
    assert "(scan stopped after 100 objects)" in largest
    assert largest.startswith(("big: 16 MiB", "big (optimizer state): 16 MiB"))  # owners read


def test_what_a_scan_costs_in_a_process_holding_a_model() -> None:
    model = nn.Sequential(*(nn.Linear(1024, 1024) for _ in range(12)))  # 48 MiB
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 1024)).sum().backward()
    optimizer.step()
    import gc

    objects = len(gc.get_objects())
    started = time.perf_counter()
    largest = oom.largest_tensors(model, optimizer, on_cuda=False)
    took = time.perf_counter() - started
    print(f"\nscan of {objects} objects: {took * 1000:.1f} ms; {largest}")
    assert "scan stopped" not in largest or took >= oom.SCAN_BUDGET_S


SCRIPT = """
import sys, torch
from probes.runtime import lifecycle

class Probe:
    def owns(self, param): return False
    def clipping(self, max_norm, norm_type=2.0): pass
    def clipped(self, total_norm): pass
    def report_out_of_memory(self, error):
        print("reported", type(error).__name__, flush=True)
    def close_with_reason(self, reason):
        print("closed", reason.splitlines()[0][:40], flush=True)

probe = Probe()
if sys.argv[1] != "bare":
    lifecycle.register(probe)
if sys.argv[2] == "oom":
    torch.empty(2**62, dtype=torch.uint8)
raise ValueError("not memory")
"""


@pytest.mark.parametrize("error", ["oom", "other"])
def test_an_escaping_oom_is_reported_before_the_probes_close(tmp_path: Any, error: str) -> None:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}

    def run(mode: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, str(script), mode, error]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)

    watched, bare = run("watched"), run("bare")
    assert watched.returncode == bare.returncode == 1  # Python's, as without a probe
    last = bare.stderr.strip().splitlines()[-1]
    assert watched.stderr.strip().splitlines()[-1] == last  # the same traceback's end
    lines = watched.stdout.splitlines()
    if error == "oom":
        assert last.startswith("RuntimeError: [enforce fail")
        assert lines == ["reported RuntimeError", f"closed {lines[1][7:]}"]
    else:
        assert lines[0].startswith("closed") and len(lines) == 1
    assert bare.stdout == ""
