"""``traintop run [options] [--] COMMAND...``: an unmodified training script, watched.

COMMAND is ``python script.py ARGS``, ``script.py ARGS``, ``-m module ARGS`` or
``torchrun ... script.py ARGS``. The script runs as a child whose ``PYTHONPATH`` starts
with a fresh 0700 folder holding a ``sitecustomize`` (beside the private socket the
monitor listens on, as ``traintop demo`` does) and nothing else of traintop's: the
child imports its own packages (its torch), from its own environment. The
``sitecustomize`` starts ``probes.attach.bootstrap``, which attaches a probe to each
model and optimizer the script builds, and adds traintop's callback to the HF and
Lightning Trainers (``probes.attach.attach``). Every process of the command inherits
it: under torchrun each rank attaches, and the ranks show as one job.

The script's Python must import this traintop's probes (traintop installed in its
environment): a bare ``script.py`` or ``-m module`` runs on traintop's own Python; a
``python`` (or a launcher such as torchrun, through its ``#!`` line) is the one the
command names, checked before the script starts (``python_problem``). The first
Python process of the command checks again in the ``sitecustomize`` (a launcher that
could not be checked beforehand, a shell script): either refuses with one line
instead of running the script half-watched.

The script stays its own. In headless mode its stdout and stderr are the terminal's,
Ctrl-C reaches it as it would without traintop (the terminal sends it to both), and
the exit status is the script's (3 when ``--fail-on`` trips: the script gets SIGINT
once). With the screen, the script runs in a session of its own (a closed terminal
does not reach it) with its output in ``script.log`` in the folder; quitting the
screen detaches: the script trains on, and traintop prints the log's path and the
command that attaches a new monitor (the probe reconnects and replays the run from
step 0). Stopping it is the app's ``X`` (asked first: SIGINT once, SIGTERM only if
asked again) or ``--stop-on-quit``. The folder stays while the script may run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING

import probes
from probes.kernel.wire import ADDRESS_ENV, PROTOCOL_VERSION, Address

if TYPE_CHECKING:
    from tui.options import MonitorOptions

#: Set in the child's environment: attach there (``probes.attach.bootstrap``).
ATTACH_ENV = "TRAINTOP_ATTACH"
#: Set by the ``sitecustomize`` of the command's first Python once it passed the check:
#: a Python of another environment that the script starts (a tool) is left alone.
CHECKED_ENV = "TRAINTOP_ATTACH_CHECKED"

ALERT_EXIT_STATUS = 3  # (tui.headless's, for --fail-on)
REFUSED_STATUS = 1  # the sitecustomize's exit when its Python cannot import our probes
STOP_WAIT_S = 10.0  # after the one SIGINT of --stop-on-quit or --fail-on
CHECK_TIMEOUT_S = 30.0

#: This traintop's probes package, as the child's check compares it.
PROBES_DIR = os.path.dirname(os.path.realpath(probes.__file__))

#: One line: a Python that cannot import this traintop's probes (``{python}``,
#: ``{problem}``), and how to fix it.
REFUSAL = (
    "{python} {problem}, so the script was not started: install traintop in that "
    "environment ({python} -m pip install traintop) or run traintop run from it, or "
    "give the script alone (traintop run train.py ...) to run it on traintop's own "
    "Python ({ours})"
)

#: ``_traintop_problem()``: why this Python cannot watch the script with this traintop,
#: or None. Run in the child's ``sitecustomize`` and by ``python_problem`` beforehand;
#: needs ``_os``, ``_sys``, ``_TRAINTOP_PROBES`` and ``_TRAINTOP_PROTOCOL``. Cheap when
#: the probes found are ours (one stdlib-only import); only another install of
#: traintop costs the wire's import, to compare protocols.
CHECK = """
def _traintop_problem():
    try:
        import probes.attach.bootstrap as bootstrap
    except Exception as exc:
        other = getattr(_sys.modules.get("probes"), "__file__", None)
        if other:  # "probes" is a common name: someone else's package
            return f"imports a probes package that is not traintop's ({other})"
        return f"cannot import traintop's probes ({type(exc).__name__}: {exc})"
    import probes
    found = _os.path.dirname(_os.path.realpath(getattr(probes, "__file__", None) or "?"))
    if found == _TRAINTOP_PROBES:
        return None
    if not callable(getattr(bootstrap, "install", None)):
        return f"imports a probes package that is not traintop's ({found})"
    try:
        from probes.kernel.wire import PROTOCOL_VERSION as version
    except Exception:
        version = None
    if version != _TRAINTOP_PROTOCOL:
        return (
            f"imports another traintop ({found}) speaking wire protocol {version}, "
            f"not {_TRAINTOP_PROTOCOL}"
        )
    return None
"""

#: What the child's ``sitecustomize`` runs: the check, then ``probes.attach.bootstrap``.
SITECUSTOMIZE = """\
# Written by traintop run (tui/runner.py): attaches traintop's probes to the script.
import os as _os, sys as _sys
_TRAINTOP_PROBES = {probes_dir!r}
_TRAINTOP_PROTOCOL = {protocol!r}
_TRAINTOP_REFUSAL = {refusal!r}
{check}
_traintop_found = _traintop_problem()
if _traintop_found is None:
    _os.environ[{checked_env!r}] = "1"  # (inherited: ranks, workers, tools)
    try:
        import probes.attach.bootstrap as _traintop_bootstrap
        _traintop_bootstrap.install()
    except Exception as _traintop_error:  # never stop the script
        print(f"traintop: not attached: {{_traintop_error}}", file=_sys.stderr)
elif _os.environ.get({checked_env!r}) != "1":  # the command's first Python: not run half-watched
    print(
        "traintop: " + _TRAINTOP_REFUSAL.format(python=_sys.executable, problem=_traintop_found),
        file=_sys.stderr,
        flush=True,
    )
    _os._exit({refused})
# (else: a Python of another environment, started by the script: left alone)
try:  # the environment's own sitecustomize, which this one shadows, runs as before
    import importlib.machinery as _machinery, importlib.util as _util
    _here = _os.path.dirname(_os.path.abspath(__file__))
    _rest = [p for p in _sys.path if _os.path.abspath(p or ".") != _here]
    _spec = _machinery.PathFinder.find_spec("sitecustomize", _rest)
    if _spec is not None and _spec.loader is not None:
        _spec.loader.exec_module(_util.module_from_spec(_spec))
except Exception as _traintop_error:
    _sys.stderr.write(f"traintop: the environment's sitecustomize failed: {{_traintop_error}}\\n")
"""

#: ``python_problem``'s check: the working folder is not on the path (the script's
#: Python does not have it there when its ``sitecustomize`` runs).
PRECHECK = (
    "import os as _os, sys as _sys\n"
    "if not getattr(_sys.flags, 'safe_path', False): del _sys.path[0]\n"
    "_TRAINTOP_PROBES = {probes_dir!r}\n"
    "_TRAINTOP_PROTOCOL = {protocol!r}\n"
    "{check}\n"
    "print('traintop-check:', _traintop_problem() or 'ok')\n"
)

_PYTHON_NAME = re.compile(r"(python|pypy)[\d.]*[a-z]?(\.exe)?")


def _ours() -> dict[str, object]:
    return {"probes_dir": PROBES_DIR, "protocol": PROTOCOL_VERSION, "check": CHECK}


def sitecustomize_source() -> str:
    """The child's ``sitecustomize.py``."""
    refusal = REFUSAL.replace("{ours}", sys.executable)
    return SITECUSTOMIZE.format(
        **_ours(), refusal=refusal, checked_env=CHECKED_ENV, refused=REFUSED_STATUS
    )


def child_command(command: list[str]) -> list[str]:
    """The command to run for ``COMMAND...`` (a bare script or ``-m`` runs on this
    Python; a ``python`` is the one on the PATH, as typed); a ``--`` before it is
    dropped."""
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ValueError("traintop run needs a command: python train.py, or train.py")
    first = command[0]
    if first == "-m" or first.endswith(".py"):
        return [sys.executable, *command]
    return list(command)


def child_environment(folder: str, address: Address) -> dict[str, str]:
    """The script's environment: ours, with the monitor's address and the folder of
    the attaching ``sitecustomize`` first on the import path (nothing else of
    traintop's: the script imports its own packages)."""
    path = [folder]
    if os.environ.get("PYTHONPATH"):
        path.append(os.environ["PYTHONPATH"])
    env = {
        **os.environ,
        ADDRESS_ENV: str(address),
        ATTACH_ENV: "1",
        "PYTHONPATH": os.pathsep.join(path),
    }
    env.pop(CHECKED_ENV, None)  # (a traintop run inside another: checked afresh)
    return env


def command_python(command: list[str]) -> str | None:
    """The Python that runs first in ``command``, when it can be told: a ``python``
    as found on the PATH, or the one a launcher's ``#!`` line names (torchrun,
    accelerate); None for traintop's own, or when unknown (a shell script)."""
    first = command[0]
    if first == sys.executable:
        return None
    found = shutil.which(first)
    if found is None:
        return None  # (starting it says so)
    python = found if _PYTHON_NAME.fullmatch(os.path.basename(first)) else _shebang_python(found)
    return None if python == sys.executable else python


def _shebang_python(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            head = handle.read(1024).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    if not head or not head[0].startswith("#!"):
        return None
    words = head[0][2:].split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
        found = shutil.which(words[0]) if words else None
        words = [found] if found else []
    if words and _PYTHON_NAME.fullmatch(os.path.basename(words[0])):
        return words[0]
    # pip's launcher for a long path: #!/bin/sh, then '''exec' "/path/python" "$0" "$@"
    if len(head) > 1 and head[1].startswith("'''exec' "):
        with contextlib.suppress(ValueError, IndexError):
            python = shlex.split(head[1][len("'''exec' ") :])[0]
            if _PYTHON_NAME.fullmatch(os.path.basename(python)):
                return python
    return None


def python_problem(python: str) -> str | None:
    """Why ``python`` cannot run the script watched by this traintop (the one line
    ``REFUSAL``), or None; None too when the check itself cannot say (the
    ``sitecustomize`` checks again)."""
    code = PRECHECK.format(**_ours())
    env = {k: v for k, v in os.environ.items() if k not in (ATTACH_ENV, CHECKED_ENV)}
    try:
        done = subprocess.run(
            [python, "-c", code],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("traintop-check: "):
            problem = line[len("traintop-check: ") :]
            if problem == "ok":
                return None
            return REFUSAL.format(python=python, problem=problem, ours=sys.executable)
    return None


# --- the script ----------------------------------------------------------------------


class Script:
    """The script ``traintop run`` started: its process, its log, how to stop it (the
    app's ``X``: ``tui.screens.confirm_stop``)."""

    def __init__(self, child: subprocess.Popen[bytes], log_path: str, own_group: bool) -> None:
        self.child = child
        self.log_path = log_path
        self.own_group = own_group  # in a session of its own: signal its whole group
        self.interrupted_at: float | None = None

    @property
    def pid(self) -> int:
        return self.child.pid

    def status(self) -> int | None:
        """Its exit status as a shell says it (128+N for signal N); None while it runs."""
        code = self.child.poll()
        return None if code is None else shell_status(code)

    def ended(self) -> str | None:
        """A line saying that it has ended, or None while it runs."""
        status = self.status()
        if status is None:
            return None
        return f"the script has ended (exit status {status}); its output is printed when you quit"

    def stop_question(self) -> tuple[str, signal.Signals]:
        """The question before stopping it, and the signal a yes sends: SIGINT, as
        Ctrl-C would; SIGTERM only once SIGINT was sent and it still runs."""
        if self.interrupted_at is None:
            return (
                f"Stop the script (pid {self.pid}) with SIGINT, as Ctrl-C would?\n"
                "It ends as it does on Ctrl-C; the monitor stays.",
                signal.SIGINT,
            )
        waited = time.monotonic() - self.interrupted_at
        return (
            f"The script (pid {self.pid}) still runs {waited:.0f} s after SIGINT.\n"
            "Terminate it with SIGTERM?",
            signal.SIGTERM,
        )

    def stop(self, signum: int) -> str:
        """Send ``signum`` once; a line saying what was done."""
        ended = self.ended()
        if ended is not None:
            return ended
        self.send(signum)
        if signum == signal.SIGINT and self.interrupted_at is None:
            self.interrupted_at = time.monotonic()
        return f"sent {signal.Signals(signum).name} to the script (pid {self.pid})"

    def send(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.own_group:  # as a terminal's Ctrl-C: every process of the command
                os.killpg(self.pid, signum)
            else:
                self.child.send_signal(signum)

    def wait(self, timeout: float | None = None) -> int | None:
        """Its exit status once it ends (None: still running after ``timeout``). A
        Ctrl-C while waiting with no timeout: the script has it too, keep waiting."""
        while True:
            try:
                return shell_status(self.child.wait(timeout))
            except subprocess.TimeoutExpired:
                return None
            except KeyboardInterrupt:
                if timeout is not None:
                    return self.status()
                continue


def shell_status(returncode: int) -> int:
    return returncode if returncode >= 0 else 128 - returncode


def monitor_command(address: Address) -> str:
    """The command that starts a monitor on ``address`` (this traintop, as it was run)."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "traintop":
        found = shutil.which("traintop")
        same = found is not None and os.path.realpath(found) == os.path.realpath(argv0)
        program = ["traintop"] if same else [os.path.abspath(argv0)]
    else:
        program = [sys.executable, "-m", "tui.cli"]
    return shlex.join([*program, "--address", str(address)])


def _say(*lines: str) -> None:
    """Lines for the terminal after the screen (which may be gone: a hang-up)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        print("\n".join(lines), file=sys.stderr, flush=True)


def detached_lines(script: Script, address: Address) -> list[str]:
    return [
        f"traintop: detached; the script (pid {script.pid}) trains on",
        f"  its output:   {script.log_path}",
        f"  watch it:     {monitor_command(address)}",
        f"  stop it:      kill -INT {script.pid}",
    ]


# --- traintop run --------------------------------------------------------------------


def run_script(args: argparse.Namespace, options: MonitorOptions) -> int:
    """Run ``args.child`` watched, with the monitor (``options``) in front; an exit
    status."""
    command = child_command(list(args.child))
    python = command_python(command)
    if python is not None:
        problem = python_problem(python)
        if problem:
            raise ValueError(problem)
    folder = tempfile.mkdtemp(prefix="traintop-run-")  # mode 0700
    address = Address("unix", path=os.path.join(folder, "monitor.sock"))
    with open(os.path.join(folder, "sitecustomize.py"), "w", encoding="utf-8") as handle:
        handle.write(sitecustomize_source())
    log_path = os.path.join(folder, "script.log")
    try:
        child = _start(command, child_environment(folder, address), log_path, options.headless)
    except OSError as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise OSError(f"cannot run {command[0]}: {exc.strerror or exc}") from None
    script = Script(child, log_path, own_group=not options.headless)
    if options.headless:
        return _run_headless(options, script, folder, address)
    return _run_screen(options, script, folder, address, getattr(args, "stop_on_quit", False))


def _start(
    command: list[str], env: dict[str, str], log_path: str, headless: bool
) -> subprocess.Popen[bytes]:
    if headless:  # its output is the terminal's, and so is Ctrl-C
        return subprocess.Popen(command, env=env)
    with open(log_path, "wb") as log:  # the screen would tear otherwise
        return subprocess.Popen(
            command,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # the terminal's hang-up and keys are the monitor's
        )


def _serve(options: MonitorOptions, script: Script, address: Address) -> int:
    from tui.serve import serve
    from tui.sources import ServerSource

    return serve(
        ServerSource(address),
        options,  # (the script's end is the end, unless --exit-when-done: it may watch later)
        companion=script.status,
        script=None if options.headless else script,
    )


def _run_headless(options: MonitorOptions, script: Script, folder: str, address: Address) -> int:
    """The monitor's lines beside the script's; the script's status (3: --fail-on)."""
    status = 0
    try:
        status = _serve(options, script, address)
    except KeyboardInterrupt:
        pass  # the script had the terminal's Ctrl-C too: it says what it does
    except Exception as exc:  # the monitor failed: the script trains on
        _say(
            f"traintop: the monitor failed ({type(exc).__name__}: {exc}); the script "
            f"trains on unwatched (watch it: {monitor_command(address)})"
        )
        status = 1
    if status == ALERT_EXIT_STATUS and script.status() is None:  # --fail-on: stop it
        script.send(signal.SIGINT)
        if script.wait(STOP_WAIT_S) is None:
            _say(_still_running(script), *detached_lines(script, address)[2:])
            return ALERT_EXIT_STATUS  # (its folder stays: it runs)
    script_status = script.wait() or 0  # (no timeout: its status)
    shutil.rmtree(folder, ignore_errors=True)
    if status == ALERT_EXIT_STATUS:
        return status
    return script_status or status  # (1: the monitor failed, the script did not)


def _run_screen(
    options: MonitorOptions, script: Script, folder: str, address: Address, stop_on_quit: bool
) -> int:
    """The screen in front; quitting it detaches (or stops: ``--stop-on-quit``)."""
    failed: str | None = None
    try:
        status = _serve(options, script, address)
        if status == 1:  # the app ended on an error (it said which)
            failed = "the monitor failed"
    except KeyboardInterrupt:
        pass
    except Exception as exc:
        failed = f"the monitor failed ({type(exc).__name__}: {exc})"
    if failed and script.status() is None:
        _say(f"traintop: {failed}; detached, the script trains on")
    elif failed is None and stop_on_quit and script.status() is None:
        _say(f"traintop: stopping the script (SIGINT to pid {script.pid}) ...")
        script.send(signal.SIGINT)
        if script.wait(STOP_WAIT_S) is None:
            _say(_still_running(script), *detached_lines(script, address)[1:])
            return 1
    if script.status() is None:  # detach: it trains on, its folder stays
        _say(*detached_lines(script, address))
        return 1 if failed else 0
    _show_log(script.log_path)
    shutil.rmtree(folder, ignore_errors=True)
    return script.status() or 0


def _still_running(script: Script) -> str:
    return (
        f"traintop: the script (pid {script.pid}) still runs {STOP_WAIT_S:g} s after "
        f"SIGINT; left running (kill {script.pid} ends it)"
    )


def _show_log(path: str) -> None:
    """The script's output, once the screen is gone."""
    with contextlib.suppress(OSError), open(path, "rb") as handle:
        sys.stdout.flush()
        shutil.copyfileobj(handle, sys.stdout.buffer)
        sys.stdout.flush()
