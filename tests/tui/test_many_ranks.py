"""A job of many ranks at one monitor: every connection accepted at once, every record
counted, and a ranks view that lists the ranks standing out and summarises the rest."""

from __future__ import annotations

import asyncio
import random
import socket
import time

from probes.kernel.wire import Address, encode_frame
from tests.frames import step
from tests.kernel.test_ranks import rank_hello
from tests.waiting import until
from tui.jobs import LISTED_RANKS, RankSummary, ranks_view
from tui.monitor import Monitor
from tui.server import MonitorServer
from tui.state import MonitorState

CONNECTIONS = 256
RECORDS = 5  # per rank


async def test_a_burst_of_connections_is_accepted_whole_and_every_record_counted(
    socket_path: str,
) -> None:
    # Every rank connects while the monitor's loop is busy (none is accepted until this
    # coroutine yields): the listen backlog alone holds them. asyncio's default of 100
    # refused the rest, and a refused probe backs off for up to a second.
    monitor = Monitor(MonitorState())
    server = MonitorServer(Address("unix", path=socket_path), monitor)
    await server.start()
    clients: list[socket.socket] = []
    refused = 0
    try:
        for rank in range(CONNECTIONS):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect(socket_path)
            except BlockingIOError:  # the backlog is full
                refused += 1
                sock.close()
                continue
            clients.append(sock)
            frames = [rank_hello(rank, CONNECTIONS, job="burst")]
            frames += [step(i, run=f"r{rank}", seq=i + 2) for i in range(RECORDS)]
            sock.sendall(b"".join(encode_frame(frame) for frame in frames))
        assert refused == 0
        state = monitor.state
        await until(
            lambda: sum(run.step_records for run in state.runs.values()) == CONNECTIONS * RECORDS,
            timeout=30,
        )
        assert len(state.runs) == CONNECTIONS and len(server.connections) == CONNECTIONS
        assert state.rejected_frames == 0
        assert all(run.last_step == RECORDS - 1 for run in state.runs.values())
        [job] = state.jobs.values()
        assert sorted(job.ranks) == list(range(CONNECTIONS))
    finally:
        for sock in clients:
            sock.close()
        await server.close()


def line(rank: int, step: int, loss: float | None, **changes: object) -> RankSummary:
    fields: dict = dict(
        rank=rank,
        run_id=f"r{rank}",
        host=f"node{rank // 8}",
        step=step,
        loss=loss,
        steps_per_s=100.0,
        lag=1000 - step,
        records=50,
        connected=True,
        quiet_s=0.05,
    )
    fields.update(changes)
    return RankSummary(**fields)


def test_a_thousand_ranks_list_the_ones_standing_out_worst_first_and_sum_up_the_rest() -> None:
    rng = random.Random(3)
    # Ranks in step: seen a few steps apart (thinned records), losses close together.
    lines = [
        line(rank, rng.randint(995, 1000), 0.5 + rng.uniform(-0.01, 0.01)) for rank in range(1024)
    ]
    lines[7] = line(7, 990, 0.5, connected=False)
    lines[100] = line(100, 940, 0.5, quiet_s=30.0)
    lines[300] = line(300, 998, 2.0)  # its loss far above the others'
    lines[500] = line(500, 999, float("nan"))
    lines[900] = line(900, 800, 0.5)  # 200 steps behind
    view = ranks_view(lines, selected="r42")
    assert [(shown.rank, why) for shown, why in view.listed] == [
        (7, "gone"),
        (100, "quiet"),
        (500, "loss"),  # a non-finite loss is the furthest apart
        (300, "loss"),
        (900, "behind"),
        (0, "rank 0"),
        (42, "shown"),
    ]
    rest = view.rest
    assert rest is not None and rest.count == 1024 - 7
    assert rest.steps == (995, 1000) and rest.lag == 5
    assert rest.loss is not None and abs(rest.loss[0] - 0.5) < 0.01
    assert 0.49 <= rest.loss[1] <= rest.loss[2] <= 0.51
    assert rest.records == 50 * rest.count and rest.steps_per_s == 100.0


def test_ranks_standing_out_are_capped_and_a_small_job_lists_every_rank() -> None:
    many = [line(rank, 1000, 0.5, connected=rank % 2 == 0) for rank in range(200)]
    view = ranks_view(many, selected="r101")  # gone, as the odd ranks, past the first 14
    whys = [why for _, why in view.listed]
    assert len(view.listed) <= LISTED_RANKS and whys.count("gone") == LISTED_RANKS - 2
    assert view.listed[-1][0].rank == 101 and whys[-1] == "shown"  # it keeps its line
    assert view.listed[-2][0].rank == 0 and whys[-2] == "rank 0"
    assert view.rest is not None and view.rest.count == 200 - len(view.listed)
    few = [line(rank, 1000 - 100 * (rank == 3), 0.5) for rank in range(LISTED_RANKS)]
    small = ranks_view(few, selected="r3")
    assert [(shown.rank, why) for shown, why in small.listed] == [
        (rank, "") for rank in range(LISTED_RANKS)
    ]
    assert small.rest is None


class LiveSource:
    """Frames fed once, then the ranks stay connected (a replay would mark them gone)."""

    description = "a live job"

    def __init__(self, frames: list[dict]) -> None:
        self.frames = frames

    async def run(self, monitor: Monitor) -> None:
        from tui.server import Connection

        conn = Connection(0, self.description, None)
        for frame in self.frames:
            monitor.frame_received(conn, frame)
        await asyncio.Event().wait()


async def test_the_ranks_panel_of_a_big_job_shows_the_outlier_first_and_one_line_for_the_rest() -> (
    None
):
    from tests.waiting import settle
    from tui.app import make_app
    from tui.widgets import RanksPanel

    world = 64
    frames = [rank_hello(rank, world, job="big") for rank in range(world)]
    for index in range(4):
        for rank in range(world):
            loss = 5.0 if rank == 33 else 0.5 + 0.001 * (rank % 5)
            frames.append(step(index, run=f"r{rank}", loss=loss, seq=index + 2))
    app = make_app(LiveSource(frames))
    app.notify = lambda *args, **kwargs: None  # type: ignore[method-assign]
    started = time.monotonic()
    async with app.run_test(size=(120, 40)) as pilot:
        panel = app.query_one(RanksPanel)
        await settle(pilot, lambda: panel.display and panel.row_count == 3, timeout=10)
        rows = [[str(cell) for cell in panel.get_row_at(i)] for i in range(3)]
        assert rows[0][0].strip() == "r33" and rows[0][-1] == "loss apart"
        assert rows[1][0].strip() == "▶r0"  # the rank the views show
        assert rows[2][1] == f"{world - 2} more" and rows[2][2] == "3"
        assert "64 of 64 ranks" in str(panel.border_title)
    assert time.monotonic() - started < 60
