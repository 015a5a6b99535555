"""The monitor's options: declared once (``add_monitor_options``) for every command that
runs a monitor, read once (``MonitorOptions.from_args``) and carried whole to
``tui.serve.serve``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields

from probes.kernel.diagnosis import Severity, Thresholds
from probes.kernel.diagnosis.thresholds import RENAMED

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
