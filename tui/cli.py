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
from dataclasses import fields

from probes.kernel.diagnosis import Thresholds
from probes.kernel.diagnosis.thresholds import RENAMED
from probes.kernel.wire import TOKEN_ENV, resolve_address
from tui.serve import serve
from tui.server import ServerError

SEVERITIES = ("info", "warning", "error")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="traintop",
        description="A live, interactive debugger for PyTorch training runs.",
    )
    _add_output_options(parser, suppress=False)
    parser.add_argument(
        "--address",
        help="listen here: unix:/path or tcp://HOST:PORT "
        "(default: $TRAINTOP_ADDRESS, else a per-user Unix socket)",
    )
    parser.add_argument(
        "--exit-when-done",
        action="store_true",
        help="headless: exit once every run that connected has finished",
    )
    # The same options after a subcommand: defaults suppressed there, so an option given
    # before the subcommand is not overwritten by the subcommand's default.
    shared = argparse.ArgumentParser(add_help=False)
    _add_output_options(shared, suppress=True)
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


#: traintop's own options that take a value (``split_run``).
_VALUED = ("--record", "--summary-every", "--fail-on", "--threshold", "--address")
#: ... and those that take none (``traintop run --help`` is traintop's, not the script's).
_FLAGS = ("--headless", "--stop-on-quit", "-h", "--help")


def split_run(argv: list[str]) -> tuple[list[str], list[str]]:
    """``traintop ... run [options] [--] COMMAND...``: (traintop's arguments, COMMAND).
    COMMAND starts at the first word that is not one of traintop's options (so a
    ``-m`` or a script's own ``--flag`` is the script's), or after ``--``."""
    if "run" not in argv:
        return argv, []
    at = argv.index("run") + 1
    while at < len(argv):
        word = argv[at]
        if word == "--":
            return argv[:at], argv[at + 1 :]
        if word in _VALUED:
            at += 2
        elif word in _FLAGS or (word.startswith("--") and word.split("=")[0] in _VALUED):
            at += 1
        else:
            break
    return argv[:at], argv[at:]


def _add_output_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """Options of the monitor itself, valid before or after a subcommand."""

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


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``traintop`` console script."""
    parser = build_parser()
    ours, child = split_run(list(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(ours)
    if args.command == "run":
        if not child:
            parser.error("traintop run needs a command: traintop run python train.py")
        args.child = child
    if getattr(args, "fail_on", None) and not args.headless:
        parser.error("--fail-on needs --headless")
    if getattr(args, "stop_on_quit", False) and args.headless:
        parser.error("--stop-on-quit is for the screen (headless: Ctrl-C reaches the script)")
    try:
        args.thresholds = parse_thresholds(args.threshold or [])
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    try:
        if args.command == "demo":
            from tui.launcher import run_demo

            return run_demo(args)
        if args.command == "run":
            from tui.runner import run_script

            return run_script(args)
        if args.command == "replay":
            return _replay(args)
        return _monitor(args)
    except (ServerError, OSError, ValueError) as exc:
        print(f"traintop: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _monitor(args: argparse.Namespace) -> int:
    from tui.sources import ServerSource

    address = resolve_address(args.address)
    source = ServerSource(address, token=os.environ.get(TOKEN_ENV))
    return serve(
        source,
        headless=args.headless,
        record=args.record,
        summary_every=args.summary_every,
        exit_when_done=args.exit_when_done,
        fail_on=args.fail_on,
        thresholds=args.thresholds,
    )


def _replay(args: argparse.Namespace) -> int:
    from tui.runlog import check_run_log
    from tui.sources import ReplaySource

    for path in args.files:
        if not os.path.isfile(path):
            raise OSError(f"no run log at {path}")
        check_run_log(path)  # fail now, with one line, if it is not a run log
    return serve(
        ReplaySource(*args.files),
        headless=args.headless,
        record=None,
        summary_every=args.summary_every,
        exit_when_done=True,
        fail_on=args.fail_on,
        thresholds=args.thresholds,
        mode="replay",
        compare_on_start=len(args.files) > 1,
    )


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
