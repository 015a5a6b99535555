"""``traintop run [options] [--] COMMAND...``: an unmodified training script, watched.

COMMAND is ``python script.py ARGS``, ``script.py ARGS``, ``-m module ARGS`` or
``torchrun ... script.py ARGS``. The script runs as a child with a ``sitecustomize``
first on its ``PYTHONPATH`` (in a fresh 0700 folder, beside the private socket the
monitor listens on, as ``traintop demo`` does): it starts ``probes.attach.bootstrap``,
which attaches a probe to each model and optimizer the script builds, and adds
traintop's callback to the HF and Lightning Trainers (``probes.attach.attach``). Every
process of the command inherits it: under torchrun each rank attaches, and the ranks
show as one job.

The script stays its own: its exit status is the command's (unless ``--fail-on``
trips: then 3, and the script is stopped); in headless mode its stdout and stderr are
the terminal's and Ctrl-C reaches it as it would without traintop (the terminal sends
it to both); with the screen, its output goes to a log shown when the screen closes,
and quitting the screen while it still runs sends it the Ctrl-C (SIGINT) it would have
had, then waits for it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import probes
from probes.kernel.wire import ADDRESS_ENV, Address

#: What the child's ``sitecustomize`` runs (``probes.attach.bootstrap``).
SITECUSTOMIZE = """\
try:
    import probes.attach.bootstrap as _traintop_bootstrap
    _traintop_bootstrap.install()
except Exception as _traintop_error:  # never stop the script
    import sys as _sys
    print(f"traintop: not attached: {_traintop_error}", file=_sys.stderr)
try:  # the environment's own sitecustomize, which this one shadows, runs as before
    import importlib.machinery as _machinery, importlib.util as _util, os as _os, sys as _sys
    _here = _os.path.dirname(_os.path.abspath(__file__))
    _rest = [p for p in _sys.path if _os.path.abspath(p or ".") != _here]
    _spec = _machinery.PathFinder.find_spec("sitecustomize", _rest)
    if _spec is not None and _spec.loader is not None:
        _spec.loader.exec_module(_util.module_from_spec(_spec))
except Exception as _traintop_error:
    import sys as _sys
    print(f"traintop: the environment's sitecustomize failed: {_traintop_error}", file=_sys.stderr)
"""

#: Set in the child's environment: attach there (``probes.attach.bootstrap``).
ATTACH_ENV = "TRAINTOP_ATTACH"

ALERT_EXIT_STATUS = 3  # (tui.headless's, for --fail-on)
STOP_WAIT_S = 10.0


def child_command(command: list[str]) -> list[str]:
    """The command to run for ``COMMAND...`` (a bare script or ``-m`` runs on this
    Python); a ``--`` before it is dropped."""
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ValueError("traintop run needs a command: python train.py, or train.py")
    first = command[0]
    if first == "-m" or first.endswith(".py"):
        return [sys.executable, *command]
    return list(command)


def child_environment(folder: str, address: Address) -> dict[str, str]:
    """The script's environment: ours, with the monitor's address and the attaching
    ``sitecustomize`` (and this traintop) first on the import path."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(probes.__file__)))
    path = [folder, root]
    if os.environ.get("PYTHONPATH"):
        path.append(os.environ["PYTHONPATH"])
    return {
        **os.environ,
        ADDRESS_ENV: str(address),
        ATTACH_ENV: "1",
        "PYTHONPATH": os.pathsep.join(path),
    }


def run_script(args: argparse.Namespace) -> int:
    """Run ``args.child`` watched, with the monitor in front; the script's status."""
    command = child_command(list(args.child))
    folder = tempfile.mkdtemp(prefix="traintop-run-")  # mode 0700
    address = Address("unix", path=os.path.join(folder, "monitor.sock"))
    with open(os.path.join(folder, "sitecustomize.py"), "w", encoding="utf-8") as handle:
        handle.write(SITECUSTOMIZE)
    log_path = os.path.join(folder, "script.log")
    try:
        child = _start(command, child_environment(folder, address), log_path, args.headless)
    except OSError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise OSError(f"cannot run {command[0]}: {exc.strerror or exc}") from None
    status = 0
    try:
        from tui.serve import serve
        from tui.sources import ServerSource

        try:
            status = serve(
                ServerSource(address),
                headless=args.headless,
                record=args.record,
                summary_every=args.summary_every,
                exit_when_done=False,  # the script's end is the end (it may watch later)
                fail_on=args.fail_on,
                thresholds=args.thresholds,
                companion=child.poll,
            )
            # fail-on tripped, or the screen quit while the script runs: it stops
            stop = status == ALERT_EXIT_STATUS or not args.headless
        except KeyboardInterrupt:
            stop = False  # the script had the terminal's Ctrl-C too: it says what it did
        script_status = _finish(child, interrupt=stop)
    finally:
        if child.poll() is None:
            _interrupt(child)
        if not args.headless:
            _show_log(log_path)
        shutil.rmtree(folder, ignore_errors=True)
    if status == ALERT_EXIT_STATUS:
        return status
    return script_status


def _start(
    command: list[str], env: dict[str, str], log_path: str, headless: bool
) -> subprocess.Popen:
    if headless:  # its output is the terminal's, and so is Ctrl-C
        return subprocess.Popen(command, env=env)
    with open(log_path, "wb") as log:  # the screen would tear otherwise
        return subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )


def _finish(child: subprocess.Popen, *, interrupt: bool) -> int:
    """Wait for the script (sent Ctrl-C first if it must stop); its exit status, as a
    shell reports one."""
    if interrupt and child.poll() is None:
        _interrupt(child)
    while True:
        try:
            returncode = child.wait()
            break
        except KeyboardInterrupt:  # a Ctrl-C while it winds down: it has it too
            continue
    return returncode if returncode >= 0 else 128 - returncode


def _interrupt(child: subprocess.Popen) -> None:
    """Ctrl-C, as the script would have had it; then harder if it does not stop."""
    for signum, wait in ((signal.SIGINT, STOP_WAIT_S), (signal.SIGTERM, 3.0)):
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)
        try:
            child.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue
    child.kill()
    child.wait()


def _show_log(path: str) -> None:
    """The script's output, once the screen is gone."""
    with contextlib.suppress(OSError), open(path, "rb") as handle:
        sys.stdout.flush()
        shutil.copyfileobj(handle, sys.stdout.buffer)
        sys.stdout.flush()
