"""``traintop``: the monitor's command line.

traintop                      listen and show every run that connects
traintop --headless           the same, as lines of text
traintop replay FILE [FILE]   show recorded run logs (several: side by side)
traintop demo [SCENARIO]      run a bundled failure mode with the monitor attached
traintop run [--] COMMAND...  run an unmodified training script, watched
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field, fields

from probes.kernel.diagnosis import Severity, Thresholds
from probes.kernel.diagnosis.thresholds import RENAMED
from probes.kernel.wire import TOKEN_ENV, resolve_address
from tui.serve import serve
from tui.server import ServerError

SEVERITIES = tuple(severity.value for severity in Severity)
#: The subcommands that run a monitor (None: plain ``traintop``), each taking every
#: option of ``add_monitor_options``; ``MonitorOptions.from_args`` says what each implies.
MONITOR_COMMANDS = (None, "replay", "demo", "run")


@dataclass(frozen=True)
class MonitorOptions:
    """The monitor's options, as the command line gave them (``add_monitor_options``
    declares them, ``from_args`` reads them), carried whole to ``tui.serve.serve``.

    A field with a ``flag`` is an option every command that runs a monitor takes; the
    others (``mode``, ``compare_on_start``) follow from the command itself.
    """

    headless: bool = field(default=False, metadata={"flag": "--headless"})
    record: str | None = field(default=None, metadata={"flag": "--record"})
    summary_every: int = field(default=100, metadata={"flag": "--summary-every"})
    exit_when_done: bool = field(default=False, metadata={"flag": "--exit-when-done"})
    fail_on: str | None = field(default=None, metadata={"flag": "--fail-on"})
    thresholds: Thresholds = field(default_factory=Thresholds, metadata={"flag": "--threshold"})
    #: ``live``, ``run``, ``demo`` or ``replay``: what q does, as the help says it.
    mode: str = "live"
    #: open on the comparison of every run (a replay of several logs)
    compare_on_start: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> MonitorOptions:
        """The options of ``build_parser().parse_args(...)``, with what the command
        implies (a replay or a headless demo exits when done); a ``ValueError`` says
        what is wrong with them."""
        command = getattr(args, "command", None)
        if args.fail_on and not args.headless:
            raise ValueError("--fail-on needs --headless")
        if command == "replay" and args.record:
            raise ValueError("--record is for runs: a replay's frames are already a run log")
        return cls(
            headless=args.headless,
            record=args.record,
            summary_every=args.summary_every,
            exit_when_done=(
                args.exit_when_done or command == "replay" or (command == "demo" and args.headless)
            ),
            fail_on=args.fail_on,
            thresholds=parse_thresholds(args.threshold or []),
            mode=command or "live",
            compare_on_start=command == "replay" and len(args.files) > 1,
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="traintop",
        description="A live, interactive debugger for PyTorch training runs.",
    )
    add_monitor_options(parser, suppress=False)
    parser.add_argument(
        "--address",
        help="listen here: unix:/path or tcp://HOST:PORT "
        "(default: $TRAINTOP_ADDRESS, else a per-user Unix socket)",
    )
    # The same options after a subcommand: defaults suppressed there, so an option given
    # before the subcommand is not overwritten by the subcommand's default.
    shared = argparse.ArgumentParser(add_help=False)
    add_monitor_options(shared, suppress=True)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    replay = commands.add_parser(
        "replay", parents=[shared], help="show recorded run logs (several: side by side)"
    )
    replay.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="a run log written by --record; with several, the screen "
        "opens on their comparison, the first as the reference",
    )
    demo = commands.add_parser(
        "demo", parents=[shared], help="run a bundled failure mode, monitored"
    )
    demo.add_argument("scenario", nargs="?", default="healthy")
    demo.add_argument("--list", action="store_true", help="list the scenarios and exit")
    demo.add_argument("--steps", type=int, help="train this many steps")
    demo.add_argument("--delay", type=float, help="seconds between steps (0: full speed)")
    demo.add_argument("--fixed", action="store_true", help="run the corrected version")
    run = commands.add_parser(
        "run",
        parents=[shared],
        help="run an unmodified training script, watched: "
        "traintop run python train.py ARGS (or train.py, -m module, torchrun ...)",
        usage="traintop run [options] [--] COMMAND...",
        description="Run COMMAND (python train.py ARGS, train.py ARGS, -m module ARGS, or "
        "torchrun ... train.py ARGS) with a probe on each model and optimizer it builds, "
        "the monitor in front. Options before COMMAND are traintop's; '--' ends them. "
        "Quitting the screen (q) detaches: the script trains on, and traintop prints its "
        "log file and the command that watches it again; X in the screen stops it.",
    )
    run.add_argument(
        "--stop-on-quit",
        action="store_true",
        help="quitting the screen stops the script: SIGINT once, then wait for it "
        "(default: quitting detaches and the script trains on)",
    )
    run.add_argument("child", nargs="*", metavar="COMMAND", help=argparse.SUPPRESS)
    return parser


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """``build_parser()``'s subcommands' parsers, by name."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def _traintop_options(parser: argparse.ArgumentParser) -> tuple[set[str], set[str]]:
    """traintop's own options after ``run`` (and those before it, which argparse then
    refuses in one line): (those that take a value, those that take none: ``traintop
    run --help`` is traintop's, not the script's)."""
    valued: set[str] = set()
    flags: set[str] = set()
    for action in [*parser._actions, *subcommands(parser)["run"]._actions]:
        (flags if action.nargs == 0 else valued).update(action.option_strings)
    return valued, flags


def split_run(
    argv: list[str], parser: argparse.ArgumentParser | None = None
) -> tuple[list[str], list[str]]:
    """``traintop ... run [options] [--] COMMAND...``: (traintop's arguments, COMMAND).
    COMMAND starts at the first word that is not one of traintop's options (so a
    ``-m`` or a script's own ``--flag`` is the script's), or after ``--``."""
    if "run" not in argv:
        return argv, []
    valued, flags = _traintop_options(parser or build_parser())
    at = argv.index("run") + 1
    while at < len(argv):
        word = argv[at]
        if word == "--":
            return argv[:at], argv[at + 1 :]
        if word in valued:
            at += 2
        elif word in flags or (word.startswith("--") and word.split("=")[0] in valued):
            at += 1
        else:
            break
    return argv[:at], argv[at:]


def add_monitor_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """The monitor's options (``MonitorOptions``), valid before or after a subcommand:
    ``suppress``, no defaults (a subcommand's must not overwrite those given before it)."""

    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--headless",
        action="store_true",
        default=default(False),
        help="no screen: a line per run event, alert and summary",
    )
    parser.add_argument(
        "--record",
        metavar="FILE",
        default=default(None),
        help="write every received frame to FILE (the run log)",
    )
    parser.add_argument(
        "--summary-every",
        type=int,
        metavar="N",
        default=default(100),
        help="headless: a summary line every N steps (default 100)",
    )
    parser.add_argument(
        "--exit-when-done",
        action="store_true",
        default=default(False),
        help="headless: exit once every run that connected has finished "
        "(a replay and a headless demo always do)",
    )
    parser.add_argument(
        "--fail-on",
        choices=SEVERITIES,
        default=default(None),
        help="headless: exit with status 3 as soon as an alert this severe "
        "(or worse) fires: a smoke test for CI",
    )
    parser.add_argument(
        "--threshold",
        action="append",
        metavar="NAME=VALUE",
        default=default(None),
        help="change a diagnosis threshold, e.g. exploding_norm=50 "
        "(repeatable; names in probes.kernel.diagnosis.Thresholds)",
    )


def parse(argv: list[str]) -> tuple[argparse.Namespace, MonitorOptions]:
    """The command line's arguments and the monitor's options (a bad one: exit 2)."""
    parser = build_parser()
    ours, child = split_run(argv, parser)
    args = parser.parse_args(ours)
    if args.command == "run":
        if not child:
            parser.error("traintop run needs a command: traintop run python train.py")
        args.child = child
    if getattr(args, "stop_on_quit", False) and args.headless:
        parser.error("--stop-on-quit is for the screen (headless: Ctrl-C reaches the script)")
    try:
        return args, MonitorOptions.from_args(args)
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``traintop`` console script."""
    args, options = parse(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.command == "demo":
            from tui.launcher import run_demo

            return run_demo(args, options)
        if args.command == "run":
            from tui.runner import run_script

            return run_script(args, options)
        if args.command == "replay":
            return _replay(args, options)
        return _monitor(args, options)
    except (ServerError, OSError, ValueError) as exc:
        print(f"traintop: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _monitor(args: argparse.Namespace, options: MonitorOptions) -> int:
    from tui.sources import ServerSource

    address = resolve_address(args.address)
    return serve(ServerSource(address, token=os.environ.get(TOKEN_ENV)), options)


def _replay(args: argparse.Namespace, options: MonitorOptions) -> int:
    from tui.runlog import check_run_log
    from tui.sources import ReplaySource

    for path in args.files:
        if not os.path.isfile(path):
            raise OSError(f"no run log at {path}")
        check_run_log(path)  # fail now, with one line, if it is not a run log
    return serve(ReplaySource(*args.files), options)


def parse_thresholds(pairs: list[str]) -> Thresholds:
    """``["exploding_norm=50", ...]`` as ``Thresholds`` (bad names or values raise)."""
    overrides: dict[str, float] = {}
    valid = [f.name for f in fields(Thresholds)]
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--threshold {pair!r}: expected NAME=VALUE")
        try:
            overrides[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--threshold {pair!r}: {value!r} is not a number") from None
        if name.strip() not in valid and name.strip() not in RENAMED:
            raise ValueError(
                f"--threshold {pair!r}: no threshold {name.strip()!r}; valid "
                f"names: {', '.join(valid)}"
            )
    return Thresholds().with_overrides(**overrides)


if __name__ == "__main__":
    sys.exit(main())
