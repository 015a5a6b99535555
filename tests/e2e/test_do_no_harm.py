"""Do no harm (issue 28): each way of watching x each user action gives the losses,
weights and saved files of the same run without traintop.

One script per way (``tests/run_scripts/harm/``) does every action in turn, each in a
segment of its own that starts from the same weights, optimizer state and seed, and
writes a JSON summary (losses as ``float.hex``, sha256 of each saved file's bytes and of
the tensors loaded back, the EMA's and the final weights' hashes, the error an action
raised). Each script runs in subprocesses bare (no traintop: ``HARM_BARE=1``, where
``probes`` is never imported; for ``traintop run`` the same script under plain
``python``) and watched, at once; a module-scoped fixture caches each way's pair, and
each (way, action) cell compares its part of the two summaries: every field, so a
failure names the cell and the fields that differ.

Bytes: a field that differs between two bare runs (``bare_again``: run for
``traintop run``, the HF Trainer and Lightning) is not deterministic on its own and is
left out of the comparison; only raw bytes may be such (``test_two_bare_runs_agree``),
and their content (the tensors or JSON loaded back) is still compared. Found so: the
bytes of ``pickle.dumps`` of a Hugging Face or Lightning model, and the Trainer's
``trainer_state.json`` (timings; compared without them). ``torch.save`` bytes are
deterministic and compared as they are.

Default suite: ways 1-3 (``probe.step()``, ``watch()`` alone, ``traintop run``) with
the cheap actions, about 15 s. ``-m slow``: the heavy actions of ways 1-3 (a spawned
DataLoader worker; ``torch.compile`` with the ``aot_eager`` backend, dynamo's counters
compared) and the whole of ways 4-5 (the HF Trainer, Lightning: their imports alone are
seconds), about three minutes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.collector import FrameCollector

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HARM = os.path.join(ROOT, "tests", "run_scripts", "harm")
_spec = importlib.util.spec_from_file_location("harm_common", os.path.join(HARM, "common.py"))
assert _spec is not None and _spec.loader is not None
common = importlib.util.module_from_spec(_spec)  # the scripts' loop: its action lists
_spec.loader.exec_module(common)

TIMEOUT = 300  # seconds, each subprocess


@dataclass(frozen=True)
class Way:
    name: str
    script: str
    actions: list[str]  # the cheap ones, in the default suite
    heavy: list[str] = field(default_factory=list)  # in -m slow
    bare_again: bool = False  # a second bare run: what is not deterministic on its own
    slow: bool = False  # the whole way


LOOP_ACTIONS = common.CHEAP  # train, save_whole, save_state_dict, pickle, ...
FRAMEWORK_ACTIONS = ["train", "save_whole", "pickle", "deepcopy_ema", "state_dict"]
# Not in the frameworks' cells: a spawned DataLoader worker holding the model, and
# model.to(float64) mid-run (the Trainer owns the loader and the dtype: neither is a
# user's action there); torch.compile (the Trainers' own compile options are another
# issue); a KeyboardInterrupt (HF and Lightning catch it and end the run themselves).
WAYS = {
    way.name: way
    for way in [
        Way("step_api", "step_api.py", LOOP_ACTIONS, common.HEAVY),
        Way("watch_alone", "watch_alone.py", LOOP_ACTIONS, common.HEAVY),
        # (-m slow: traintop run's child and the bare twin's take half a minute; the
        # step API and watch() alone cover the same actions in the default tier)
        Way(
            "traintop_run", "unmodified.py", LOOP_ACTIONS, common.HEAVY, bare_again=True, slow=True
        ),
        Way(
            "hf",
            "hf_trainer.py",
            # save_model: Trainer.save_model + save_state; checkpoints: save_strategy's
            [*FRAMEWORK_ACTIONS, "save_model", "checkpoints", "checkpoint_resume"],
            bare_again=True,
            slow=True,
        ),
        Way(
            "lightning",
            "lightning_fit.py",
            [*FRAMEWORK_ACTIONS, "save_checkpoint", "checkpoint_resume"],
            bare_again=True,
            slow=True,
        ),
    ]
}


@dataclass
class Pair:
    bare: dict[str, Any]
    watched: dict[str, Any]
    unstable: set[str]  # fields two bare runs disagree on
    watched_out: str
    frames: list[dict[str, Any]]
    log: str  # the watched process's stderr (and traintop's lines)


def flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        found: dict[str, Any] = {}
        for key, item in value.items():
            if key != "traceback":
                found.update(flat(item, f"{prefix}.{key}" if prefix else key))
        return found
    return {prefix: value}


def environment(**extra: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("HARM_BARE", "PYTHONPATH", "TRAINTOP_ATTACH")
    }
    return {
        **env,
        "PYTHONPATH": ROOT,
        "OMP_NUM_THREADS": "1",
        "PYTHONHASHSEED": "0",
        "TOKENIZERS_PARALLELISM": "false",
        **extra,
    }


def start(command: list[str], env: dict[str, str], log: str) -> tuple[subprocess.Popen, Any]:
    handle = open(log, "w", encoding="utf-8")  # noqa: SIM115 - closed in finish()
    process = subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT)
    return process, handle


def finish(process: subprocess.Popen, handle: Any, log: str) -> str:
    try:
        process.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    handle.close()
    with open(log, encoding="utf-8", errors="replace") as text:
        return f"[exit {process.returncode}]\n{text.read()}"


def summary(out: str, log: str) -> dict[str, Any]:
    path = os.path.join(out, "summary.json")
    assert os.path.exists(path), f"no summary from the run:\n{log[-4000:]}"
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def run_way(way: Way, actions: list[str], folder: str) -> Pair:
    """The way's script bare (twice where ``bare_again``) and watched, all at once."""
    script = os.path.join(HARM, way.script)
    outs = {name: os.path.join(folder, name) for name in ("bare", "bare_again", "watched")}
    socket_folder = tempfile.mkdtemp(prefix="tt-harm-")
    record = os.path.join(folder, "watched.ndjson")
    collector = None
    commands: dict[str, tuple[list[str], dict[str, str]]] = {
        "bare": ([sys.executable, script, outs["bare"], *actions], environment(HARM_BARE="1"))
    }
    if way.bare_again:
        commands["bare_again"] = (
            [sys.executable, script, outs["bare_again"], *actions],
            environment(HARM_BARE="1"),
        )
    if way.name == "traintop_run":
        command = [sys.executable, "-m", "tui.cli", "run", "--headless", "--record", record]
        command += [sys.executable, script, outs["watched"], *actions]
        commands["watched"] = (command, environment())
    else:
        collector = FrameCollector(os.path.join(socket_folder, "m.sock"))
        address = f"unix:{collector.address.path}"
        commands["watched"] = (
            [sys.executable, script, outs["watched"], *actions],
            environment(TRAINTOP_ADDRESS=address),
        )
    try:
        started = {
            name: start(command, env, os.path.join(folder, f"{name}.log"))
            for name, (command, env) in commands.items()
        }
        logs = {
            name: finish(process, handle, os.path.join(folder, f"{name}.log"))
            for name, (process, handle) in started.items()
        }
    finally:
        if collector is not None:
            collector.close()
        shutil.rmtree(socket_folder, ignore_errors=True)
    bare = summary(outs["bare"], logs["bare"])
    watched = summary(outs["watched"], logs["watched"])
    unstable: set[str] = set()
    if way.bare_again:
        again = flat(summary(outs["bare_again"], logs["bare_again"]))
        first = flat(bare)
        unstable = {key for key in first.keys() | again.keys() if first.get(key) != again.get(key)}
    if collector is not None:
        frames = list(collector.frames)
    elif os.path.exists(record):
        with open(record, encoding="utf-8") as handle:
            frames = [json.loads(line) for line in handle if line.strip()]
    else:
        frames = []
    return Pair(bare, watched, unstable, outs["watched"], frames, logs["watched"])


# One worker for the whole matrix: the pairs are module-scoped, and cells of one way
# spread over two workers would run that way's scripts twice.
pytestmark = pytest.mark.xdist_group("do no harm")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``pairs(way, heavy)``: that way's bare and watched summaries, run once a module."""
    cache: dict[tuple[str, bool], Pair] = {}
    # The conftest's autouse fixture is function-scoped: keep a run of ours off the
    # default monitor here too.
    nobody = tempfile.mkdtemp(prefix="tt-none-")
    saved = os.environ.get("TRAINTOP_ADDRESS")
    os.environ["TRAINTOP_ADDRESS"] = f"unix:{nobody}/nobody.sock"

    def get(name: str, heavy: bool = False) -> Pair:
        if (name, heavy) not in cache:
            way = WAYS[name]
            actions = way.heavy if heavy else way.actions
            folder = str(tmp_path_factory.mktemp(f"harm-{name}-{'heavy' if heavy else 'cheap'}"))
            cache[name, heavy] = run_way(way, actions, folder)
        return cache[name, heavy]

    yield get
    if saved is None:
        os.environ.pop("TRAINTOP_ADDRESS", None)
    else:
        os.environ["TRAINTOP_ADDRESS"] = saved
    shutil.rmtree(nobody, ignore_errors=True)


def cells() -> list[Any]:
    found = []
    for way in WAYS.values():
        for action in way.actions:
            marks = [pytest.mark.slow, pytest.mark.timeout(900)] if way.slow else []
            found.append(
                pytest.param(way.name, action, False, marks=marks, id=f"{way.name}-{action}")
            )
        for action in way.heavy:
            marks = [pytest.mark.slow, pytest.mark.timeout(900)]
            found.append(
                pytest.param(way.name, action, True, marks=marks, id=f"{way.name}-{action}")
            )
    return found


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("way", "action", "heavy"), cells())
def test_the_watched_run_is_the_bare_run(pairs: Any, way: str, action: str, heavy: bool) -> None:
    pair = pairs(way, heavy)
    bare, watched = pair.bare.get(action), pair.watched.get(action)
    assert bare is not None, f"the bare run has no {action!r} (see its log)"
    assert "error" not in bare, f"the bare run itself failed: {bare['error']}"
    assert watched is not None, f"the watched run has no {action!r}:\n{pair.log[-4000:]}"
    assert "error" not in watched, f"watched: {watched['error']}\n{watched.get('traceback', '')}"
    mine, theirs = flat(bare, action), flat(watched, action)
    differ = sorted(
        key for key in mine.keys() | theirs.keys()
        if key not in pair.unstable and mine.get(key) != theirs.get(key)
    )  # fmt: skip
    details = "\n".join(
        f"  {k}: bare {mine.get(k)!r}\n  {' ' * len(k)}  watched {theirs.get(k)!r}" for k in differ
    )
    assert not differ, f"differ from the bare run: {', '.join(differ)}\n{details}"


def bare_again_ways() -> list[Any]:
    return [
        pytest.param(w.name, marks=[pytest.mark.slow, pytest.mark.timeout(900)] if w.slow else [])
        for w in WAYS.values()
        if w.bare_again
    ]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("way", bare_again_ways())
def test_two_bare_runs_agree(pairs: Any, way: str) -> None:
    """What two bare runs disagree on is raw bytes only (its content is compared)."""
    unstable = pairs(way).unstable
    assert all(key.endswith(".bytes") for key in unstable), sorted(unstable)


def watched_ways() -> list[Any]:
    return [
        pytest.param(w.name, marks=[pytest.mark.slow, pytest.mark.timeout(900)] if w.slow else [])
        for w in WAYS.values()
    ]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("way", watched_ways())
def test_the_watched_run_was_watched(pairs: Any, way: str) -> None:
    """A cell passes only if traintop was there: the monitor saw the run's steps."""
    pair = pairs(way)
    kinds = [frame.get("kind") for frame in pair.frames]
    assert "hello" in kinds, pair.log[-4000:]
    assert kinds.count("step") >= 4, pair.log[-4000:]
    assert "traintop: not attached" not in pair.log
    assert "probe off" not in pair.log


LOAD_WITHOUT_TRAINTOP = r"""
import hashlib, json, sys
sys.modules["probes"] = None  # import probes: ImportError, whatever the path holds
sys.modules["tui"] = None
sys.path.insert(0, sys.argv[2])  # the harm scripts (a LightningModule's class)
import torch, common
if sys.argv[3] == "lightning":
    import __main__, lightning_fit
    __main__.Classifier = lightning_fit.Classifier  # pickled from the script's __main__
loaded = torch.load(sys.argv[1], weights_only=False)
print(json.dumps({"loaded": common.tensors_sha(loaded), "type": type(loaded).__name__}))
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("way", watched_ways())
def test_a_model_saved_watched_loads_without_traintop(pairs: Any, way: str) -> None:
    """``torch.save(model)`` from the watched run loads where ``probes`` cannot be
    imported (``python -I``: no PYTHONPATH, no repository on the path)."""
    pair = pairs(way)
    if WAYS[way].script in ("step_api.py", "watch_alone.py", "unmodified.py"):
        path = os.path.join(pair.watched_out, "save_whole_eval.pt")
        expected = pair.bare["save_whole"].get("eval", {}).get("loaded")
    else:
        path = os.path.join(pair.watched_out, "save_whole.pt")
        expected = pair.bare["save_whole"].get("loaded")
    assert os.path.exists(path), (
        f"the watched run saved no {os.path.basename(path)}: "
        f"{pair.watched['save_whole'].get('error')}"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRAINTOP_ATTACH")}
    done = subprocess.run(
        [sys.executable, "-I", "-c", LOAD_WITHOUT_TRAINTOP, path, HARM, way],
        env=env,
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    error = done.stderr.strip().splitlines()[-1:] if done.returncode else []
    assert done.returncode == 0, f"{error}\n{done.stderr[-3000:]}"
    assert json.loads(done.stdout.strip().splitlines()[-1])["loaded"] == expected
