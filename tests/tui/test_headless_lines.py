"""Headless lines say what happened once, with every name intact, splittable as a shell
splits words, and safe to print on a terminal whatever a run sends."""

from __future__ import annotations

import io
import shlex
import unicodedata

from probes.kernel.wire import make_frame
from tests.frames import hello, probe_alert, step
from tests.kernel.test_ranks import rank_hello
from tui.headless import HeadlessMonitor, word
from tui.server import Connection

CONN = Connection(1, "test", None)


def headless(summary_every: int = 10**9) -> tuple[HeadlessMonitor, io.StringIO]:
    out = io.StringIO()
    return HeadlessMonitor(out=out, summary_every=summary_every), out


def words(line: str) -> dict[str, str]:
    """A line's ``key=value`` words, split as a shell splits them."""
    return dict(part.split("=", 1) for part in shlex.split(line) if "=" in part)


def named_alert(evidence: dict, subject: str = "") -> dict:
    frame = probe_alert("duplicate_rows", "warning", 0)
    frame["alert"] = {**frame["alert"], "evidence": evidence, "subject": subject}
    return frame


def test_evidence_keeps_names_with_spaces_whole_and_quoted() -> None:
    monitor, out = headless()
    evidence = {"names": "embed.weight, conv.weight", "rows": 12, "say": 'a "b" \\c'}
    for frame in (hello(), named_alert(evidence, subject="train split")):
        monitor.frame_received(CONN, frame)
    [line] = [line for line in out.getvalue().splitlines() if line.startswith("ALERT ")]
    assert 'names="embed.weight, conv.weight"' in line and " rows=12 " in line
    assert "_conv" not in line  # (no space turned into an underscore)
    said = words(line)
    assert said["names"] == "embed.weight, conv.weight"
    assert said["subject"] == "train split"
    assert said["say"] == 'a "b" \\c'
    assert said["run"] == "mlp"


def test_a_word_is_quoted_only_when_it_must_be() -> None:
    assert word("encoder.0") == "encoder.0"
    assert word("a b") == '"a b"'
    assert word("") == '""'
    assert word("it's") == '"it\'s"'
    assert shlex.split(f"x={word(chr(0xA0).join('ab'))}") == [f"x=a{chr(0xA0)}b"]


def test_the_summary_is_printed_once_when_the_last_step_is_a_multiple() -> None:
    monitor, out = headless(summary_every=10)
    for frame in (hello(), *(step(i) for i in range(21))):  # the last step: 20
        monitor.frame_received(CONN, frame)
    monitor.frame_received(CONN, make_frame("bye", run="run-a", reason="closed"))
    monitor.connection_closed(CONN, "connection closed by the run")
    lines = out.getvalue().splitlines()
    summaries = [line for line in lines if line.startswith("run=mlp step=")]
    assert [line.split()[1] for line in summaries] == ["step=0", "step=10", "step=20"]
    assert lines[-1] == "disconnected run=mlp reason=finished"
    assert lines[-2] == summaries[-1]  # (the end's summary is the last one, said once)


def test_the_end_summary_is_printed_when_the_run_ended_between_multiples() -> None:
    monitor, out = headless(summary_every=10)
    for frame in (hello(), *(step(i) for i in range(15))):
        monitor.frame_received(CONN, frame)
    monitor.connection_closed(CONN, "connection closed by the run")
    steps = [line.split()[1] for line in out.getvalue().splitlines() if line.startswith("run=")]
    assert steps == ["step=0", "step=10", "step=14"]


def test_a_jobs_causes_line_is_printed_once_for_all_its_ranks() -> None:
    monitor, out = headless()
    conns = [Connection(rank, f"rank{rank}", None) for rank in (0, 1)]
    for rank in (0, 1):
        monitor.frame_received(conns[rank], rank_hello(rank))
    for index in range(10):
        for rank in (0, 1):
            monitor.frame_received(conns[rank], step(index, run=f"r{rank}", seq=index + 2))
    monitor.connection_closed(conns[1], "connection lost")  # rank 1 gone: the job stalls
    for index in range(10, 12):
        monitor.frame_received(conns[0], step(index, run="r0", seq=index + 2))
    monitor.frame_received(conns[0], make_frame("bye", run="r0", reason="closed"))
    monitor.connection_closed(conns[0], "connection closed by the run")
    lines = out.getvalue().splitlines()
    assert any(line.startswith("ALERT error rank_stalled") for line in lines)
    [causes] = [line for line in lines if line.startswith("causes ")]
    assert causes.startswith("causes run=ddp-run job=job-7 in checklist order: ")
    assert causes.count("rank_stalled@") == 1
    assert lines.index(causes) > lines.index(next(x for x in lines if "rank=1/2 reason=" in x))


HOSTILE = "\x1b[2J\x1b]0;owned\x07evil\u202e\r\nname\x9b31m [red]x[/red] 'q\""


def test_run_text_in_headless_lines_cannot_drive_the_terminal() -> None:
    monitor, out = headless(summary_every=1)
    frames = [
        {**hello(name=HOSTILE, layers=[HOSTILE, "b", "c"]), "host": HOSTILE},
        step(0),
        named_alert({HOSTILE: HOSTILE, "names": [HOSTILE, "b"]}, subject=HOSTILE),
        make_frame("event", run="run-a", name="paused", step=0, reason=HOSTILE, seq=1),
        make_frame("event", run="run-a", name="probe_error", message=HOSTILE, seq=2),
        make_frame("bye", run="run-a", reason=f"error: RuntimeError: {HOSTILE}"),
    ]
    for frame in frames:
        monitor.frame_received(CONN, frame)
    monitor.connection_closed(CONN, "connection closed by the run")
    text = out.getvalue()
    assert "ALERT " in text and "PAUSED " in text and "PROBE OFF " in text
    for line in text.splitlines():
        assert line.isprintable() or all(
            unicodedata.category(char) not in {"Cc", "Cf", "Cs", "Zl", "Zp"} for char in line
        ), repr(line)
        assert "\x1b" not in line and "\x9b" not in line
        said = words(line)  # every line splits (no quote left open)
        if "run" in said:
            assert said["run"] == "evil  name [red]x[/red] 'q\""  # (line breaks: spaces)
