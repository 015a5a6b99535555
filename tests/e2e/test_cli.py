"""The ``traintop`` command line: replay, bad input, options (the demo itself runs in
the gallery, test_gallery.py, recording included)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from probes.kernel.wire import encode_frame
from tests.frames import short_run
from tests.waiting import wait_until
from tui.cli import main


def traintop(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tui.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def test_demo_list_names_each_scenario_within_80_columns(capsys) -> None:
    from demo.catalog import SCENARIOS

    assert main(["demo", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.split()[0] for line in lines if not line.startswith(" ")]
    assert names == list(SCENARIOS)
    assert max(len(line) for line in lines) <= 80
    words = " ".join(lines).split()  # wrapped at word boundaries: every word whole
    for info in SCENARIOS.values():
        assert " ".join(info.summary.split()) in " ".join(words)


def test_unknown_scenario_is_one_clear_line(capsys) -> None:
    assert main(["demo", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown scenario 'nope'" in err


def test_replay_counts_bad_lines_and_keeps_the_rest(tmp_path, capsys) -> None:
    log = tmp_path / "run.ndjson"
    frames = short_run(20)
    body = b"".join(encode_frame(f) for f in frames[:5]) + b"garbage\n"
    body += b"".join(encode_frame(f) for f in frames[5:])
    log.write_bytes(body)
    assert main(["replay", str(log), "--headless", "--summary-every", "10"]) == 0
    out = capsys.readouterr().out
    assert "rejected frame" in out and "malformed frame" in out
    assert "run=mlp step=19 " in out


def test_summary_shows_the_validation_loss_with_its_own_step() -> None:
    from tests.frames import evaluation, hello, step
    from tui.headless import summary_line
    from tui.state import MonitorState

    state = MonitorState()
    for frame in (
        hello(),
        step(0),
        evaluation(0, val_loss=7.474, seq=1),
        *(step(i) for i in range(1, 120)),
        evaluation(100, val_loss=0.1587, seq=2),
    ):
        state.apply(1, frame)
    line = summary_line(state.runs["run-a"])
    assert " step=119 " in line and " val_loss=0.1587@100 " in line


@pytest.mark.parametrize(
    "body",
    [b"", b"\n\n", b"# traintop\n\nA live, interactive...\n", b'{"v":1,"kind":"step","step":0}\n'],
    ids=["empty", "blank", "markdown", "no-hello"],
)
@pytest.mark.parametrize("headless", [True, False], ids=["headless", "screen"])
def test_a_file_that_is_not_a_run_log_is_refused_in_one_line(
    tmp_path, capsys, body: bytes, headless: bool
) -> None:
    log = tmp_path / "notes.md"
    log.write_bytes(body)
    args = ["replay", str(log)] + (["--headless"] if headless else [])
    assert main(args) == 1  # refused before any screen is drawn
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and str(log) in captured.err
    assert "not a run log" in captured.err


def test_a_bad_file_among_several_is_refused(tmp_path, capsys) -> None:
    good, bad = tmp_path / "good.ndjson", tmp_path / "README.md"
    good.write_bytes(b"".join(encode_frame(f) for f in short_run(5)))
    bad.write_text("# traintop\n")
    assert main(["replay", str(good), str(bad), "--headless"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "README.md is not a run log" in captured.err


def test_replay_of_several_logs_shows_each_run(tmp_path, capsys) -> None:
    first, second = tmp_path / "a.ndjson", tmp_path / "b.ndjson"
    first.write_bytes(b"".join(encode_frame(f) for f in short_run(12, run="a", name="one")))
    second.write_bytes(b"".join(encode_frame(f) for f in short_run(8, run="b", name="two")))
    assert main(["replay", str(first), str(second), "--headless", "--summary-every", "1000"]) == 0
    out = capsys.readouterr().out
    assert "connected run=one " in out and "connected run=two " in out
    assert "run=one step=11 " in out and "run=two step=7 " in out
    assert "rejected" not in out


def test_an_unknown_threshold_lists_the_valid_names(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--headless", "--threshold", "nosuch=1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "no threshold 'nosuch'" in err
    assert "valid names: exploding_norm, exploding_growth," in err and "clear_after" in err


def test_replay_of_a_missing_file_is_one_line(tmp_path, capsys) -> None:
    assert main(["replay", str(tmp_path / "absent.ndjson")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("traintop: no run log at") and err.count("\n") == 1


def test_monitor_cannot_listen_on_non_loopback_without_token(capsys) -> None:
    assert main(["--headless", "--address", "tcp://0.0.0.0:0"]) == 1
    err = capsys.readouterr().err
    assert "TRAINTOP_TOKEN" in err and err.count("\n") == 1


def test_bad_address_is_one_line(capsys) -> None:
    assert main(["--headless", "--address", "tcp://nowhere"]) == 1
    assert "expected tcp://HOST:PORT" in capsys.readouterr().err


def test_thresholds_from_the_command_line() -> None:
    from tui.options import parse_thresholds

    thresholds = parse_thresholds(["exploding_norm=50", "vanishing_steps=5"])
    assert thresholds.exploding_norm == 50.0
    assert thresholds.vanishing_steps == 5 and isinstance(thresholds.vanishing_steps, int)
    # the name it had when it counted records still works
    assert parse_thresholds(["vanishing_records=7"]).vanishing_steps == 7
    for bad in (["nope=1"], ["exploding_norm"], ["exploding_norm=x"], ["vanishing_steps=2.5"]):
        with pytest.raises((TypeError, ValueError)):
            parse_thresholds(bad)


def test_a_lower_threshold_changes_what_fires(tmp_path) -> None:
    from probes.kernel.wire import encode_frame
    from tests.frames import hello, step

    log = tmp_path / "run.ndjson"
    frames = [hello(), *(step(i, grad_norms=[1.0, 20.0, 1.0]) for i in range(5))]
    log.write_bytes(b"".join(encode_frame(f) for f in frames))
    default = traintop("replay", str(log), "--headless")
    lowered = traintop("replay", str(log), "--headless", "--threshold", "exploding_norm=10")
    assert "ALERT" not in default.stdout
    assert "ALERT error exploding_gradient step=0 subject=encoder.2" in lowered.stdout


def test_headless_demo_stops_when_the_trainer_dies_before_connecting(monkeypatch, capsys) -> None:
    import tui.launcher

    def broken_trainer(args, address, log_path):
        with open(log_path, "w") as log:
            log.write("ImportError: the trainer could not start\n")
        return subprocess.Popen([sys.executable, "-c", "raise SystemExit(4)"])

    monkeypatch.setattr(tui.launcher, "_start_trainer", broken_trainer)
    assert main(["demo", "healthy", "--headless"]) == 1
    captured = capsys.readouterr()
    assert "the trainer exited with status 4" in captured.out
    assert "ImportError: the trainer could not start" in captured.err
    assert "the demo trainer exited with status 4" in captured.err


def test_sigterm_stops_a_headless_monitor_and_removes_its_socket(socket_path: str) -> None:
    import signal

    env = {**os.environ, "TRAINTOP_ADDRESS": f"unix:{socket_path}"}
    monitor = subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "--headless"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_until(lambda: os.path.exists(socket_path) or monitor.poll() is not None, "the socket", 30)
    assert monitor.poll() is None, monitor.communicate()
    monitor.send_signal(signal.SIGTERM)
    assert monitor.wait(10) == 0
    assert not os.path.exists(socket_path)


def test_fail_on_needs_headless(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--fail-on", "error"])
    assert exit_info.value.code == 2
    assert "--fail-on needs --headless" in capsys.readouterr().err
