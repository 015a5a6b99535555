"""The ``traintop`` command line: headless demo, recording and replay, bad input."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from probes.wire import encode_frame
from tests.frames import short_run
from tui.cli import main


def traintop(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_demo_list_names_each_scenario(capsys) -> None:
    assert main(["demo", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.split()[0] for line in lines]
    assert names[:2] == ["healthy", "exploding"]
    assert all(len(line.split(None, 1)[1]) > 20 for line in lines)  # a description each


def test_unknown_scenario_is_one_clear_line(capsys) -> None:
    assert main(["demo", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown scenario 'nope'" in err


def test_headless_demo_records_and_replays(tmp_path) -> None:
    log = tmp_path / "run.ndjson"
    done = traintop("demo", "healthy", "--headless", "--steps", "120", "--delay", "0",
                    "--record", str(log), "--summary-every", "50")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("connected run=healthy ")
    assert any(line.startswith("run=healthy step=0 ") for line in lines)
    assert any(line.startswith("run=healthy step=119 ") for line in lines)
    assert lines[-1] == "disconnected run=healthy reason=finished"
    recorded = log.read_text().splitlines()
    assert recorded[0].startswith('{"v":1,"kind":"hello"')
    assert recorded[-1].startswith('{"v":1,"kind":"bye"')

    replay = traintop("replay", str(log), "--headless", "--summary-every", "50")
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.splitlines()[0].startswith("connected run=healthy ")
    assert "run=healthy step=119 " in replay.stdout


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
    from tui.cli import parse_thresholds

    thresholds = parse_thresholds(["exploding_norm=50", "vanishing_steps=5"])
    assert thresholds.exploding_norm == 50.0
    assert thresholds.vanishing_steps == 5 and isinstance(thresholds.vanishing_steps, int)
    # the name it had when it counted records still works
    assert parse_thresholds(["vanishing_records=7"]).vanishing_steps == 7
    for bad in (["nope=1"], ["exploding_norm"], ["exploding_norm=x"], ["vanishing_steps=2.5"]):
        with pytest.raises((TypeError, ValueError)):
            parse_thresholds(bad)


def test_a_lower_threshold_changes_what_fires(tmp_path) -> None:
    from probes.wire import encode_frame
    from tests.frames import hello, step

    log = tmp_path / "run.ndjson"
    frames = [hello(), *(step(i, grad_norms=[1.0, 20.0, 1.0]) for i in range(5))]
    log.write_bytes(b"".join(encode_frame(f) for f in frames))
    default = traintop("replay", str(log), "--headless")
    lowered = traintop("replay", str(log), "--headless", "--threshold", "exploding_norm=10")
    assert "ALERT" not in default.stdout
    assert "ALERT error exploding_gradient step=0 subject=encoder.2" in lowered.stdout


def test_headless_demo_stops_when_the_trainer_dies_before_connecting(
        monkeypatch, capsys) -> None:
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
    import time

    env = {**os.environ, "TRAINTOP_ADDRESS": f"unix:{socket_path}"}
    monitor = subprocess.Popen([sys.executable, "-m", "tui.cli", "--headless"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not os.path.exists(socket_path):
        assert time.monotonic() < deadline and monitor.poll() is None, monitor.communicate()
        time.sleep(0.05)
    monitor.send_signal(signal.SIGTERM)
    assert monitor.wait(10) == 0
    assert not os.path.exists(socket_path)
