"""A plain install works: ``pip install .`` (no extras, not editable) into a fresh
virtual environment, then every public name of ``probes`` is used there, without NumPy
(a development dependency only), and the ``traintop`` command starts.

Slow (a venv, torch and the package installed: about a minute), so deselected by the
default run; ``.ci/run`` runs it with ``python -m pytest -q -m slow``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import probes

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("probes", "tui", "demo")
TORCH = "torch==2.13.0"  # as .ci/run pins it: a bare requirement pulls a CUDA build
# Not copied into the build: a stale build/ would hide a module the package lost.
NOT_SOURCE = (
    ".git",
    ".venv",
    "venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    "*.pyc",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    "shared",
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# Run by the fresh venv's python, outside the repository. Every public name of
# probes is used once and recorded in USED; the test checks that none was left out.
USE_EVERY_NAME = r"""
import importlib.util, json, os, sys
assert importlib.util.find_spec("numpy") is None, "numpy is installed in the fresh venv"
try:
    import numpy  # noqa: F401
except ImportError:
    pass
else:
    raise AssertionError("import numpy worked")

import torch
from torch import nn

import probes

USED = set()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.CrossEntropyLoss()
x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))

train, val = torch.randn(50, 5), torch.randn(20, 5)
train[9], val[4] = train[2], train[7]
train[3, 1] = float("nan")
split = probes.check_split(train, val)
USED.add("check_split")
assert sorted(split.kinds) == ["duplicate_rows", "duplicates_across_splits",
                               "missing_values"], split
assert split.findings[0].examples == ((2, 9),), split

leak = probes.check_preprocessing({"mean": 4.0}, [0.0, 2.0], [0.0, 2.0, 10.0])
USED.add("check_preprocessing")
assert leak.kinds == ["leakage"], leak

batch = probes.check_batch(model, (x, y), loss_fn)
USED.add("check_batch")
assert batch.ok, batch
softmaxed = nn.Sequential(model, nn.Softmax(dim=1))
assert not probes.check_batch(softmaxed, (x, y), loss_fn).ok  # probabilities into CE

fit = probes.overfit_batch(model, (x[:8], y[:8]), loss_fn, steps=150)
USED.add("overfit_batch")
assert fit.ok, fit

# No monitor listens at this address: training must go on regardless.
os.environ["TRAINTOP_ADDRESS"] = "unix:" + os.path.join(sys.argv[1], "nobody.sock")
losses = []
with probes.watch(model, optimizer, run="install-check") as probe:
    USED.add("watch")
    assert isinstance(probe, probes.Probe)
    USED.add("Probe")
    for _ in range(5):
        with probe.step():
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            total = probes.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            probe.log(loss=loss)
            losses.append(loss.item())
    USED.add("clip_grad_norm_")
    assert torch.isfinite(total) and total > 0
    probes.check_split(train, val, probe=probe)  # a report sent to nobody
    assert "torch.autograd.backward" in probes.patched()  # (while a probe is open)
assert probe.closed
assert probes.patched() == {}, probes.patched()  # every global torch's own again
USED.add("patched")
assert probe.step_index == 4, probe.step_index
assert losses[-1] < losses[0], losses
options = probes.WatchOptions(sample_every=5, run="install-options")
USED.add("WatchOptions")
with probes.Probe(model, optimizer, options) as optioned:
    assert (optioned.name, optioned.options.sample_every) == ("install-options", 5)
try:
    probes.watch(model, optimizer, sampel_every=5)
except TypeError as error:
    assert "sample_every" in str(error), error
else:
    raise AssertionError("an unknown option was taken")

alert = split.findings[0].to_alert(0, split.signal)
assert isinstance(alert, probes.Alert)
own = probes.Alert("duplicate_rows", "warning", 0, "train", {"duplicates": 1},
                   "a signal", ("a fix",), per_subject=True)
USED.add("Alert")
assert own.line().startswith("ALERT warning duplicate_rows step=0 subject=train")
thresholds = probes.Thresholds()
USED.add("Thresholds")
diagnoser = probes.Diagnoser(thresholds=thresholds)
USED.add("Diagnoser")
assert diagnoser.thresholds is thresholds
diagnoser.note_probe_alert(alert)

print(json.dumps({"used": sorted(USED), "all": sorted(probes.__all__),
                  "file": probes.__file__}))
"""


def run(
    command: list[str], *, timeout: float, cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
    shown = " ".join(arg if len(arg) < 200 else "<script>" for arg in command)
    assert out.returncode == 0, (
        f"{shown} exited {out.returncode}\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    )
    return out


@pytest.fixture(scope="module")
def fresh_venv() -> Iterator[tuple[Path, dict[str, str]]]:
    """A venv in a temporary folder with torch and this package installed (no extras),
    from a copy of the sources, and the environment to run it with."""
    with tempfile.TemporaryDirectory(prefix="traintop-install-") as folder:
        root = Path(folder)
        # Our own interpreter's imports (PYTHONPATH to the checkout) must not leak in;
        # the rest stays: pip's settings (PIP_FIND_LINKS, an index) come from it.
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
        }
        env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
        source = root / "source"
        shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*NOT_SOURCE))
        run([sys.executable, "-m", "venv", str(root / "venv")], timeout=120, cwd=root, env=env)
        python = root / "venv" / "bin" / "python"
        run([str(python), "-m", "pip", "install", "--quiet", TORCH], timeout=420, cwd=root, env=env)
        run(
            [str(python), "-m", "pip", "install", "--quiet", str(source)],
            timeout=300,
            cwd=root,
            env=env,
        )
        yield root, env


def test_every_public_name_of_probes_works_after_a_plain_install(
    fresh_venv: tuple[Path, dict[str, str]],
) -> None:
    root, env = fresh_venv
    python = root / "venv" / "bin" / "python"

    # Run from the temporary folder: the checkout is not on sys.path there.
    out = run([str(python), "-c", USE_EVERY_NAME, str(root)], timeout=180, cwd=root, env=env)

    result = json.loads(out.stdout.splitlines()[-1])
    assert Path(result["file"]).is_relative_to(root / "venv"), result["file"]
    assert result["all"] == sorted(probes.__all__)
    assert result["used"] == result["all"], "a public name the script does not use"


def test_the_package_ships_every_source_file(fresh_venv: tuple[Path, dict[str, str]]) -> None:
    root, env = fresh_venv
    python = root / "venv" / "bin" / "python"
    out = run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        timeout=60,
        cwd=root,
        env=env,
    )
    installed = Path(out.stdout.strip())

    # Modules, subpackages, styles (.tcss), py.typed: whatever the source tree holds.
    missing = [
        str(path.relative_to(REPO))
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*"))
        if path.is_file()
        and "__pycache__" not in path.parts
        and not (installed / path.relative_to(REPO)).is_file()
    ]
    assert missing == []


def test_the_traintop_command_starts(fresh_venv: tuple[Path, dict[str, str]]) -> None:
    root, env = fresh_venv

    out = run([str(root / "venv" / "bin" / "traintop"), "--help"], timeout=60, cwd=root, env=env)

    assert out.stdout.startswith("usage: traintop")
    assert "replay" in out.stdout
