"""Import boundaries (ARCHITECTURE.md, "Import rules"): the training side never loads the
UI, the monitor never loads torch. Checked in a fresh interpreter, as harlequin does.
(That no module imports itself back round a circle is ``tests/repo/test_import_graph.py``.)"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from typing import Any

import pytest


def loaded_after(statement: str) -> set[str]:
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return {name.split(".")[0] for name in json.loads(out.stdout.splitlines()[-1])}


UI = {"textual", "rich", "textual_plotext", "plotext"}
FRAMEWORKS = {"transformers", "accelerate", "pytorch_lightning", "lightning"}

# A fresh interpreter that loads torch costs about 2.5 s: the statements that load it
# anyway are each run in a fork of one interpreter that has loaded torch and nothing
# else (``torch_side_loaded``), so torch is loaded once; a fork starts with only what
# its parent had, and torch loads neither the UI nor a framework (checked below).
# "import probes" must load no torch, and reaching ``probes.watch`` must load it: those
# are checked in interpreters of their own.
TORCH_SIDE = [
    "import probes.checks.data_checks, probes.checks.batch_checks, probes.checks.reports",
    "import probes.runtime.probe, probes.runtime.optimizers.clip, probes.runtime.link.control, "
    "probes.runtime.anomaly.anomaly, probes.runtime.evaluation.evaluation, "
    "probes.runtime.lifecycle",
    "import probes.runtime.steps.step, probes.runtime.measure.measurer, "
    "probes.runtime.measure.sampled",
    "import demo.trainer, demo.scenarios",
]
TRAINING_SIDE = [
    "import probes",
    "import probes; probes.watch, probes.clip_grad_norm_",
    "import probes.kernel.wire, probes.kernel.replay",
    *TORCH_SIDE,
]

FORKED = """
import json, os, sys, traceback
import torch
out = {"torch alone": sorted(sys.modules)}
for statement in json.loads(sys.argv[1]):
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(reader)
        try:
            exec(statement, {})
            result = sorted(sys.modules)
        except BaseException:
            result = {"error": traceback.format_exc()}
        os.write(writer, json.dumps(result).encode())
        os._exit(0)
    os.close(writer)
    data = b""
    while chunk := os.read(reader, 1 << 16):
        data += chunk
    os.waitpid(pid, 0)
    out[statement] = json.loads(data)
print(json.dumps(out))
"""


@functools.cache
def torch_side_loaded() -> dict[str, Any]:
    """Each of ``TORCH_SIDE`` (and torch alone): the top-level modules loaded after it,
    in a fork of one interpreter that has loaded torch; an error's traceback instead."""
    done = subprocess.run(
        [sys.executable, "-c", FORKED, json.dumps(TORCH_SIDE)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    out: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return {
        key: value if isinstance(value, dict) else {name.split(".")[0] for name in value}
        for key, value in out.items()
    }


def test_torch_itself_loads_no_ui_and_no_framework() -> None:
    loaded = torch_side_loaded()["torch alone"]
    assert "torch" in loaded and not loaded & (UI | FRAMEWORKS | {"probes", "tui", "demo"})


@pytest.mark.xdist_group("torch-side imports")  # (one worker: torch loads once)
@pytest.mark.parametrize("statement", TRAINING_SIDE)
def test_training_side_loads_no_ui_and_no_framework(statement: str) -> None:
    if statement in TORCH_SIDE:
        loaded = torch_side_loaded()[statement]
        assert "error" not in loaded, loaded.get("error")
    else:
        loaded = loaded_after(statement)
    assert not loaded & UI
    assert not loaded & FRAMEWORKS
    if "probes.watch" in statement:
        assert "torch" in loaded  # the torch side loads on first use, not at import
    if statement == "import probes":
        assert "torch" not in loaded


@pytest.mark.parametrize(
    "statement",
    [
        "import tui",
        "import tui.app, tui.cli, tui.headless, tui.launcher, tui.state, tui.server",
        "import tui.serve, tui.monitor",
    ],
)
def test_monitor_loads_no_torch(statement: str) -> None:
    assert "torch" not in loaded_after(statement)


@pytest.mark.parametrize(
    "module",
    [
        "probes.kernel.wire",
        "probes.kernel.diagnosis",
        "probes.kernel.endings",
        "probes.runtime.link.control",
    ],
)
def test_pure_modules_are_stdlib_only(module: str) -> None:
    loaded = loaded_after(f"import {module}")
    assert "probes" in loaded
    assert not loaded & {"torch", "numpy", "textual", "rich"}


def test_monitor_uses_only_the_pure_parts_of_probes() -> None:
    code = (
        "import sys, json\nimport tui.app, tui.cli, tui.headless, tui.launcher\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('probes'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    loaded = set(json.loads(out.stdout.splitlines()[-1]))
    packages = {
        name
        for name in loaded
        if name.startswith(("probes.kernel.diagnosis.", "probes.kernel.schema."))
    }
    assert packages, "the diagnosis and schema packages' modules"
    assert loaded - packages == {
        "probes",
        "probes.kernel",
        "probes.kernel.auth",  # the token handshake's proofs (stdlib)
        "probes.kernel.wire",
        "probes.kernel.commands",
        "probes.kernel.fold",
        "probes.kernel.schema",
        "probes.kernel.diagnosis",
        "probes.kernel.endings",
        "probes.kernel.units",  # bytes as people read them (the memory rules')
    }


@pytest.mark.parametrize(
    "module",
    [
        "probes.kernel.wire",
        "probes.kernel.commands",
        "probes.kernel.auth",
        "probes.kernel.schema",
        "probes.kernel.thinning",
        "probes.kernel.merge",
        "probes.kernel.fold",
        "probes.kernel.replay",
        "probes.kernel.diagnosis",
        "probes.kernel.diagnosis.ranks",
        "probes.kernel.endings",
        "probes.kernel.units",
    ],
)
def test_the_probes_stdlib_parts_never_load_torch(module: str) -> None:
    loaded = loaded_after(f"import {module}")
    assert not loaded & {"torch", "numpy", "textual", "rich", "typing_extensions"}


@pytest.mark.parametrize(
    "module",
    [
        "tui.server",
        "tui.state",
        "tui.headless",
        "tui.runlog",
        "tui.monitor",
        "tui.serve",
        "tui.jobs",
        "tui.events",
        "tui.sources",
        "tui.text",
        "tui.toasts",
    ],
)
def test_the_monitors_non_screen_modules_never_load_textual(module: str) -> None:
    loaded = loaded_after(f"import {module}")
    assert not loaded & {"textual", "rich", "torch"}


@pytest.mark.parametrize(
    "module, missing, extra",
    [
        ("probes.hf", ["transformers"], "traintop[hf]"),
        ("probes.lightning", ["pytorch_lightning", "lightning"], "traintop[lightning]"),
    ],
)
def test_framework_glue_without_its_framework_says_what_to_install(
    module: str, missing: list[str], extra: str
) -> None:
    # A None entry in sys.modules makes that import fail, as if it were not installed.
    hide = "; ".join(f"sys.modules[{name!r}] = None" for name in missing)
    code = f"import sys; {hide}; import {module}"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert (
        last
        == f"ImportError: {module} needs "
        + ("transformers" if extra.endswith("[hf]") else "Lightning")
        + f": pip install '{extra}'"
    )
