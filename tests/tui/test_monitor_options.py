"""The monitor's options (``tui.options.MonitorOptions``): every command that runs a monitor
takes each of them, with the same help, and they reach ``serve`` whole."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

import pytest

import tui.cli
import tui.launcher
import tui.runlog
import tui.runner
import tui.serve
from tui.cli import build_parser, parse, subcommands
from tui.options import MONITOR_COMMANDS, MonitorOptions

#: The options, from the dataclass: a field with a flag is a command-line option.
OPTIONS = {f.name: f.metadata["flag"] for f in fields(MonitorOptions) if "flag" in f.metadata}
#: A value each option that takes one is given here (any field left out: a test fails).
VALUES = {
    "record": "run.ndjson",
    "summary_every": "7",
    "fail_on": "error",
    "thresholds": "exploding_norm=50",
}
#: The words before the options, per command (what each needs to parse).
BEFORE: dict[str | None, list[str]] = {
    None: [],
    "replay": ["replay", "a.ndjson"],
    "demo": ["demo"],
    "run": ["run"],
}


def option_words(name: str) -> list[str]:
    flag = OPTIONS[name]
    return [flag, VALUES[name]] if name in VALUES else [flag]


def action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    [found] = [a for a in parser._actions if flag in a.option_strings]
    return found


def test_every_option_field_has_a_flag_or_follows_from_the_command() -> None:
    derived = {f.name for f in fields(MonitorOptions)} - set(OPTIONS)
    assert derived == {"mode", "compare_on_start"}
    assert {n for n, f in OPTIONS.items() if action(build_parser(), f).nargs != 0} == set(VALUES)


def test_the_commands_that_run_a_monitor_are_all_the_subcommands() -> None:
    assert set(MONITOR_COMMANDS) - {None} == set(subcommands(build_parser()))
    assert set(BEFORE) == set(MONITOR_COMMANDS)


@pytest.mark.parametrize("command", MONITOR_COMMANDS, ids=str)
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_each_command_takes_each_monitor_option(command: str | None, name: str) -> None:
    words = [*BEFORE[command], *option_words(name)]
    if command == "run":
        words += ["--", "train.py"]
    args = build_parser().parse_args(tui.cli.split_run(words)[0])
    dest = action(build_parser(), OPTIONS[name]).dest
    default = action(build_parser(), OPTIONS[name]).default
    assert getattr(args, dest) not in (default, None)


@pytest.mark.parametrize("command", MONITOR_COMMANDS, ids=str)
def test_each_commands_help_names_each_option_with_the_same_help(
    command: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    top = build_parser()
    parser = top if command is None else subcommands(top)[command]
    for flag in OPTIONS.values():
        assert action(parser, flag).help == action(top, flag).help
    with pytest.raises(SystemExit) as exit_info:
        tui.cli.main([*BEFORE[command][:1], "--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    for flag in OPTIONS.values():
        assert flag in shown, f"{command or 'traintop'} --help does not name {flag}"


@pytest.mark.parametrize("before", [True, False], ids=["before", "after"])
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_each_option_reaches_its_field(name: str, before: bool) -> None:
    """Given before the subcommand or after it, each option changes its field."""
    words = option_words(name) + ["--headless"] * (name == "fail_on")
    argv = [*words, "demo"] if before else ["demo", *words]
    _, options = parse(argv)
    assert getattr(options, name) != getattr(MonitorOptions(), name)


def test_what_each_command_implies() -> None:
    assert parse([])[1] == MonitorOptions()
    assert parse(["--headless", "--exit-when-done"])[1].exit_when_done
    replay = parse(["replay", "a.ndjson", "b.ndjson"])[1]
    assert (replay.mode, replay.exit_when_done, replay.compare_on_start) == ("replay", True, True)
    assert not parse(["replay", "a.ndjson"])[1].compare_on_start
    assert parse(["demo", "--headless"])[1].exit_when_done
    assert not parse(["demo"])[1].exit_when_done and parse(["demo"])[1].mode == "demo"
    run = parse(["run", "--headless", "train.py"])[1]
    assert (run.mode, run.exit_when_done) == ("run", False)  # the script's end is the end
    assert parse(["run", "--exit-when-done", "--headless", "train.py"])[1].exit_when_done


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--fail-on", "error"], "--fail-on needs --headless"),
        (["replay", "a.ndjson", "--record", "b.ndjson"], "--record is for runs"),
        (["--threshold", "nosuch=1"], "no threshold 'nosuch'"),
    ],
)
def test_bad_options_are_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_every_command_hands_serve_the_options_it_parsed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The options ``main`` parsed are the very ones ``serve`` gets, for each command."""
    served: list[MonitorOptions] = []

    def serve(source: Any, options: MonitorOptions, **kwargs: Any) -> int:
        served.append(options)
        return 0

    class Trainer:
        def poll(self) -> int:
            return 0

    log = tmp_path / "a.ndjson"
    log.write_text("")
    monkeypatch.setattr(tui.cli, "serve", serve)
    monkeypatch.setattr(tui.serve, "serve", serve)
    monkeypatch.setattr(tui.cli, "resolve_address", lambda address: address)
    monkeypatch.setattr(tui.runlog, "check_run_log", lambda path: None)
    monkeypatch.setattr(tui.launcher, "_start_trainer", lambda *args: Trainer())
    monkeypatch.setattr(tui.launcher, "_stop", lambda trainer: 0)
    monkeypatch.setattr(tui.runner, "_start", lambda *args: _Finished())
    monkeypatch.setattr(tui.runner, "command_python", lambda command: None)
    words = ["--summary-every", "7", "--threshold", "exploding_norm=50"]
    for argv in (
        ["--headless", *words],
        ["replay", str(log), "--headless", *words],
        ["demo", "--headless", *words],
        ["run", "--headless", *words, "train.py"],
    ):
        served.clear()
        assert tui.cli.main(argv) == 0, argv
        [options] = served
        assert options == parse(argv)[1], argv
        assert options.summary_every == 7 and options.thresholds.exploding_norm == 50


class _Finished:
    """A child process that has ended with status 0 (``traintop run``'s script)."""

    pid = 0
    returncode = 0

    def poll(self) -> int:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0
