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

from probes.kernel.wire import TOKEN_ENV, resolve_address
from tui.options import (
    MonitorOptions,
    add_monitor_options,
)
from tui.serve import serve
from tui.server import ServerError


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


if __name__ == "__main__":
    sys.exit(main())
