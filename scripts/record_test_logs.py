"""Record the run logs the tests replay (``tests/data/*.ndjson``) from real runs.

Each log is what ``traintop --headless --record FILE`` wrote while a real training
connected to it: the demo trainer (``healthy``, ``exploding``, ``exploding-fixed``), the
Hugging Face Trainer and Lightning's Trainer with traintop's callback on tiny models
(built as ``tests/frameworks/test_hf.py`` and ``tests/frameworks/test_lightning.py``
build them, no hub), and a 2-rank DistributedDataParallel job (``demo.ddp.run_job``)
whose ranks' frames interleave in one log, as a monitor receives them. The single-
process runs send every step (no rate thinning), so the tests diagnose them at full
resolution; the job's ranks send at the probe's default rate, as a job does.

Run it after a change to what the probe sends, then run the tests and review the diff:

    python scripts/record_test_logs.py              # every log
    python scripts/record_test_logs.py healthy hf   # only these
    python scripts/record_test_logs.py --list       # the names

It needs the ``dev``, ``hf`` and ``lightning`` extras and takes under a minute. Each log
is replayed once recorded, and its alerts are printed: a new log that does not raise
what its tests expect (``probe_overhead`` from a busy machine, say) is reported and
not kept (the old one stays).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from probes.kernel.diagnosis import Alert

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
UNTHINNED = 1e9  # max_steps_per_s: every step its own frame
MONITOR_TIMEOUT_S = 120


@dataclass(frozen=True)
class Recording:
    """One log: how to train, and the alert kinds its replay must raise (none: none)."""

    train: Callable[[str], None]  # given the monitor's address
    alerts: tuple[str, ...]
    summary: str


def demo_run(
    scenario: str, *, fixed: bool = False, steps: int | None = None
) -> Callable[[str], None]:
    """A demo scenario through the demo trainer, in this process."""

    def train(address: str) -> None:
        import torch

        from demo.scenarios import BUILDERS
        from demo.trainer import train as train_demo

        torch.set_num_threads(1)  # as `python -m demo` does
        torch.manual_seed(0)
        name = scenario + (" (fixed)" if fixed else "")
        train_demo(
            BUILDERS[scenario](fixed),
            run=name,
            steps=steps,
            address=address,
            max_steps_per_s=UNTHINNED,
            print_every=10**9,
        )

    return train


def hf_run(address: str) -> None:
    """A tiny GPT-2 through the Hugging Face Trainer: accumulation, the Trainer's
    clipping, an evaluation every 4 updates."""
    from transformers import Trainer

    from probes.hf import TraintopCallback
    from tests.frameworks.test_hf import arguments, tiny_gpt2, token_data

    callback = TraintopCallback(address=address, max_steps_per_s=UNTHINNED)
    folder = tempfile.mkdtemp(prefix="traintop-hf-")
    try:
        trainer = Trainer(
            model=tiny_gpt2(),
            args=arguments(
                folder,
                max_steps=12,
                learning_rate=1e-3,
                gradient_accumulation_steps=2,
                eval_strategy="steps",
                eval_steps=4,
                run_name="gpt2-tiny",
            ),
            train_dataset=token_data(96),
            eval_dataset=token_data(8, seed=1),
            callbacks=[callback],
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.train()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def lightning_run(address: str) -> None:
    """A small GRU language model through ``pytorch_lightning.Trainer.fit``: accumulation,
    clipping, a validation every 4 updates."""
    import pytorch_lightning as pl

    from probes.lightning import TraintopCallback
    from tests.frameworks.test_lightning import TinyLM, loaders

    trainer = pl.Trainer(
        max_steps=12,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=1,
        accumulate_grad_batches=2,
        gradient_clip_val=1.0,
        val_check_interval=8,
        callbacks=[TraintopCallback(address=address, max_steps_per_s=UNTHINNED)],
    )
    train, val = loaders()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(TinyLM(), train, val)


def ddp_job(address: str) -> None:
    """Two ranks of a healthy DDP job on gloo; each rank's probe finds the monitor in
    ``TRAINTOP_ADDRESS`` (the ranks are started by ``torch.multiprocessing``)."""
    from demo.ddp import JobOptions, run_job

    os.environ["TRAINTOP_ADDRESS"] = address
    os.environ["OMP_NUM_THREADS"] = "1"
    run_job(JobOptions(name="ddp", steps=60, delay=0.02))  # 50 steps/s: most steps sent


RECORDINGS: dict[str, Recording] = {
    "healthy": Recording(demo_run("healthy"), (), "the healthy demo, 1,500 steps"),
    "exploding": Recording(
        demo_run("exploding", steps=60),
        ("exploding_gradient", "non_finite"),
        "the exploding demo (lr 0.7), 60 steps: norms climb until non-finite",
    ),
    "exploding-fixed": Recording(
        demo_run("exploding", fixed=True), (), "the exploding demo's fix (lr 0.05), 200 steps"
    ),
    "hf": Recording(hf_run, (), "a tiny GPT-2 through the Hugging Face Trainer, 12 updates"),
    "lightning": Recording(lightning_run, (), "a GRU LM through Lightning's Trainer, 12 updates"),
    "ddp": Recording(ddp_job, (), "a healthy 2-rank DDP job (gloo), 60 steps"),
}


@contextlib.contextmanager
def recording_monitor(log: Path) -> Iterator[str]:
    """``traintop --headless --exit-when-done --record LOG`` on a private socket; yields
    its address and waits, on leaving, until every run that connected has finished."""
    folder = tempfile.mkdtemp(prefix="tt-rec-")  # short: a socket path must fit sun_path
    address = f"unix:{folder}/m.sock"
    command = [sys.executable, "-m", "tui.cli", "--headless", "--exit-when-done"]
    command += ["--record", str(log), "--address", address, "--summary-every", "1000000000"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    monitor = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        assert monitor.stdout is not None
        first = monitor.stdout.readline()
        if not first.startswith("listening on "):
            raise RuntimeError(f"the monitor did not start: {first!r}")
        yield address
        output, _ = monitor.communicate(timeout=MONITOR_TIMEOUT_S)
        if monitor.returncode != 0:
            raise RuntimeError(f"the monitor exited with {monitor.returncode}:\n{output}")
    finally:
        if monitor.poll() is None:
            monitor.kill()
            monitor.wait()
        shutil.rmtree(folder, ignore_errors=True)


def raised_by_replay(log: Path) -> list[Alert]:
    """The alerts a monitor raises on replaying ``log``, as the tests replay it."""
    from tests.recorded import replay

    return replay(str(log)).raised()


def record(name: str) -> bool:
    """Record one log, and keep it in tests/data if its replay raises what the tests
    expect; else report what it raised and keep the old one (False)."""
    recording = RECORDINGS[name]
    folder = Path(tempfile.mkdtemp(prefix="tt-log-"))
    try:
        log = folder / f"{name}.ndjson"
        with recording_monitor(log) as address:
            recording.train(address)
        raised = raised_by_replay(log)
        kinds = [alert.kind for alert in raised]
        expected = list(recording.alerts)
        good = all(kind in kinds for kind in expected) if expected else not kinds
        frames = len(log.read_bytes().splitlines())
        size = log.stat().st_size
        print(f"{name}: {frames} frames, {size / 1024:.0f} KB, raised {kinds or 'nothing'}")
        if good:
            shutil.move(log, DATA / log.name)
        else:
            for alert in raised:
                print(f"  {alert.line()}")
            print(f"  expected {expected or 'no alert'}: not kept (record it again)")
        return good
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="which logs (default: all)")
    parser.add_argument("--list", action="store_true", help="list the logs and exit")
    args = parser.parse_args(argv)
    if args.list:
        for name, recording in RECORDINGS.items():
            print(f"{name:16} {recording.summary}")
        return 0
    unknown = [name for name in args.names if name not in RECORDINGS]
    if unknown:
        parser.error(f"unknown log(s) {unknown}; known: {', '.join(RECORDINGS)}")
    sys.path.insert(0, str(REPO))
    DATA.mkdir(parents=True, exist_ok=True)
    failed = [name for name in args.names or RECORDINGS if not record(name)]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
