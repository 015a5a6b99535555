"""How many step records a second one monitor absorbs, and its memory, by ranks x layers.

    python tests/bench/monitor_ingest.py [--quick] [--ranks N] [--plain] [--cpu]

The monitor is the real one (``MonitorServer`` feeding ``Monitor`` and its state,
diagnosis and cross-rank checks, as ``traintop --headless`` runs them) in this process,
listening on a Unix socket. Each rank is a client process that connects, says hello as
a rank of one job, and writes its step records (pre-encoded, as fast as the socket takes
them) over its own connection; the records of all ranks arrive at once. A row gives the
records absorbed per second (from the first record in to the last one applied), and the
monitor's peak resident memory (``ru_maxrss``) above what it had before the job.

The memory row sends each rank's records as a fast run's sender does, thinned: each one
stands for a span of steps, so a few thousand records cover 100,000 steps per rank.

The thousand-rank row is a job's start: 1,024 ranks that connect together, when the
clock starts (each retrying with back-off when refused, as a probe's sender does:
0.05 s doubling to 1 s), rank 0 with six times the others' records (it sends 60 a
second where the others send 10). Its ranks are written by a few client processes,
each holding many connections (a thousand processes would crowd the machine measured);
the row says how many connects were refused.

The ranks' norms travel packed (base64 float32, as a probe sends them to a monitor whose
welcome said it reads that form), or as plain lists with ``--plain`` (to a monitor from
before). ``--cpu`` gives, instead of the rows, the monitor's CPU time a record of the
thousand-rank job in one process without sockets, both ways: steadier than the rates
on a machine shared with other work; then the monitor's time for that job's end (every
rank's connection closed, with a ``bye`` first and without).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import multiprocessing
import os
import random
import resource
import selectors
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from probes.kernel.schema.spec import FLOAT32_FIELDS
from probes.kernel.wire import (
    Address,
    FrameError,
    FrameReader,
    encode_frame,
    make_frame,
    pack_float32,
)
from tui.monitor import Monitor
from tui.server import Connection, MonitorServer, collect_less_often
from tui.state import MonitorState


@dataclass(frozen=True)
class Load:
    ranks: int
    layers: int
    records: int  # per rank
    steps: int  # per rank: records * span
    burst: bool = False  # every rank connects when the clock starts (retrying if refused)
    rank0_records: int | None = None  # rank 0's records, if not ``records``
    plain: bool = False  # norms as plain lists (to a monitor from before), not packed

    @property
    def span(self) -> int:
        return max(1, self.steps // self.records)


def rank_frames(load: Load, rank: int, job: str, *, packed: bool = True) -> bytes:
    """A rank's hello and step records, encoded as a probe sends them: with ``packed``,
    their norms in the packed form (base64 float32, ``probes.kernel.wire``), as a probe
    sends them once the monitor's welcome has said it reads it; else plain lists (as to
    a monitor from before)."""
    rng = random.Random(rank)
    layers = [
        f"blocks.{i // 4}.{('attn', 'mlp', 'norm1', 'norm2')[i % 4]}" for i in range(load.layers)
    ]
    out = [
        encode_frame(
            make_frame(
                "hello",
                run=f"{job}-r{rank}",
                name="ingest",
                pid=1000 + rank,
                host=f"node{rank // 8}",
                job=job,
                rank=rank,
                local_rank=rank % 8,
                world_size=load.ranks,
                sync="ddp",
                torch="2.13.0",
                layers=layers,
                param_counts=[1000] * load.layers,
                config={"every": 1, "sample_every": 20},
            )
        )
    ]
    span = load.span
    records = load.rank0_records if rank == 0 and load.rank0_records else load.records
    for index in range(records):
        last = (index + 1) * span - 1
        # as a probe sends them: float32 values in 9 significant digits; the same on
        # every rank at a step, as DDP's all-reduce leaves them (a healthy job: ranks
        # whose norms differ raise grads_not_synced, and are compared no more)
        synced = random.Random(last)
        grads = [float(f"{0.1 + 0.01 * synced.random():.9g}") for _ in range(load.layers)]
        frame = make_frame(
            "step",
            run=f"{job}-r{rank}",
            step=last,
            time=1000.0 + last / 100,
            duration=0.01 * span,
            probe_time=0.0002 * span,
            scalars={"loss": 1.0 / (1 + last / 1000) + 0.01 * rng.random()},
            lr=[1e-3],
            grad_norms=grads,
            grad_norm_total=math.sqrt(sum(g * g for g in grads)),
            none_grads=0,
            dropped=0,
            seq=index + 1,
        )
        if span > 1:
            frame["span"] = [last - span + 1, last]
            frame["grad_norms_max"] = [float(f"{g * 1.1:.9g}") for g in grads]
            frame["grad_norm_total_max"] = frame["grad_norm_total"] * 1.1
            frame["scalars_max"] = {"loss": frame["scalars"]["loss"] * 1.05}
            frame["scalars_min"] = {"loss": frame["scalars"]["loss"] * 0.95}
        if last // 20 != (last - span) // 20:  # a sampled step in its span
            frame["param_norms"] = [float(f"{5.0 + 0.001 * i:.9g}") for i in range(load.layers)]
        if packed:
            for name in FLOAT32_FIELDS:
                if frame.get(name):
                    frame[name] = pack_float32(frame[name]) or frame[name]
        out.append(encode_frame(frame))
    return b"".join(out)


def client(path: str, load: Load, rank: int, job: str, ready: Any, go: Any) -> None:
    """One rank: make its records (here, not in the monitor's process, whose memory is
    measured), connect, say it is ready, wait for the start, then write them all on one
    connection."""
    data = rank_frames(load, rank, job, packed=not load.plain)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    ready.release()
    go.wait()
    sock.sendall(data)
    sock.recv(1)  # stay connected until the monitor closes (the end of the benchmark)
    sock.close()


BACKOFF_MIN_S, BACKOFF_MAX_S = 0.05, 1.0  # a probe's sender's (probes/runtime/link/sender.py)
CLIENT_PROCESSES = 16  # the thousand-rank row's writers


class BurstRank:
    """One rank of the thousand-rank row: its bytes, its socket, its back-off."""

    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.sock: socket.socket | None = None
        self.next_attempt = 0.0
        self.backoff = BACKOFF_MIN_S

    def try_connect(self, path: str, now: float) -> bool:
        """One connect; False (and the next attempt scheduled) if it was refused."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(path)
        except (BlockingIOError, ConnectionRefusedError, FileNotFoundError):
            sock.close()
            self.next_attempt = now + self.backoff
            self.backoff = min(self.backoff * 2, BACKOFF_MAX_S)
            return False
        self.sock = sock
        return True


def burst_client(
    path: str, load: Load, ranks: range, job: str, ready: Any, go: Any, refused: Any
) -> None:
    """Some ranks of the thousand-rank row: make their records, wait for the start, then
    connect them all (retrying with back-off when refused) and write each rank's records
    as its socket takes them."""
    pending = [BurstRank(rank_frames(load, rank, job, packed=not load.plain)) for rank in ranks]
    ready.release()
    go.wait()
    selector = selectors.DefaultSelector()
    count = 0
    while pending or selector.get_map():
        now = time.monotonic()
        waiting = []
        for rank in pending:
            if rank.next_attempt > now:
                waiting.append(rank)
            elif rank.try_connect(path, now):
                assert rank.sock is not None
                selector.register(rank.sock, selectors.EVENT_WRITE, rank)
            else:
                count += 1
                waiting.append(rank)
        pending = waiting
        for key, _ in selector.select(timeout=0.01):
            rank = key.data
            try:
                sent = key.fileobj.send(rank.data)  # type: ignore[union-attr]
            except BlockingIOError:
                continue
            rank.data = rank.data[sent:]
            if not rank.data:
                selector.unregister(key.fileobj)
    with refused.get_lock():
        refused.value += count
    time.sleep(3600)  # stay connected until the monitor closes (killed at the end)


async def absorb(load: Load, path: str) -> tuple[float, int, int]:
    """Serve until every rank's records are applied; (seconds, records applied, connects
    refused)."""
    monitor = Monitor(MonitorState())
    server = MonitorServer(Address("unix", path=path), monitor)
    await server.start()
    job = f"job-{load.ranks}x{load.layers}"
    context = multiprocessing.get_context("fork")
    ready, go = context.Semaphore(0), context.Event()
    refused = context.Value("q", 0)
    if load.burst:
        share = math.ceil(load.ranks / CLIENT_PROCESSES)
        groups = [range(i, min(i + share, load.ranks)) for i in range(0, load.ranks, share)]
        clients = [
            context.Process(target=burst_client, args=(path, load, group, job, ready, go, refused))
            for group in groups
        ]
    else:
        clients = [
            context.Process(target=client, args=(path, load, rank, job, ready, go))
            for rank in range(load.ranks)
        ]
    for process in clients:
        process.start()
    # The clock starts once every client has made its records and connected: on a
    # crowded machine making them takes longer than any fixed head start.
    for _ in clients:
        while not ready.acquire(block=False):
            await asyncio.sleep(0.01)
    start = time.time()
    go.set()
    expected = load.ranks * load.records + (load.rank0_records or load.records) - load.records
    state = monitor.state
    # The loop applies what arrives in long stretches before this coroutine runs again:
    # time from the start to the moment the last record is seen.
    while sum(run.step_records for run in state.runs.values()) < expected:
        await asyncio.sleep(0.005)
        if time.time() - start > 600:
            break
    seconds = time.time() - start
    applied = sum(run.step_records for run in state.runs.values())
    await server.close()
    for process in clients:
        if load.burst:
            process.kill()
        process.join(10)
    return seconds, applied, refused.value


def measure(load: Load) -> tuple[float, float, int]:
    """(records per second, peak memory increase in MB, connects refused) of one load,
    in a fresh process (``ru_maxrss`` only grows: each row must start from a clean
    monitor)."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child measures, and reports through the pipe
        os.close(reader)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        path = os.path.join(tempfile.mkdtemp(prefix="tt-ingest-"), "m.sock")
        seconds, applied, refused = asyncio.run(absorb(load, path))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        report = [applied / seconds, (peak - before) / 1024, refused]
        os.write(writer, json.dumps(report).encode())
        os._exit(0)
    rate, memory, refused = child_result(pid, reader, writer)
    return rate, memory, refused


def child_result(pid: int, reader: int, writer: int) -> Any:
    """What the forked child ``pid`` wrote as JSON to the pipe, once it has exited."""
    os.close(writer)
    data = b""
    while chunk := os.read(reader, 4096):
        data += chunk
    os.waitpid(pid, 0)
    return json.loads(data)


def cpu_per_record(load: Load) -> float:
    """The monitor's CPU time a step record (us), its sockets left out: every rank's
    frames made first, then fed to one monitor a frame of each rank in turn (as the
    ranks' records arrive together), through a frame reader per rank, as the server
    does; in a fresh process."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(reader)
        job = f"job-{load.ranks}x{load.layers}"
        lines = [
            rank_frames(load, rank, job, packed=not load.plain).splitlines(keepends=True)
            for rank in range(load.ranks)
        ]
        collect_less_often()
        monitor = Monitor(MonitorState())
        conns = [Connection(rank + 1, "local", None) for rank in range(load.ranks)]
        readers = [FrameReader() for _ in range(load.ranks)]
        started = time.process_time()
        for index in range(max(map(len, lines))):
            for rank, frames in enumerate(lines):
                if index < len(frames):
                    for item in readers[rank].feed(frames[index]):
                        if not isinstance(item, FrameError):
                            monitor.frame_received(conns[rank], item)
        spent = time.process_time() - started
        records = sum(run.step_records for run in monitor.state.runs.values())
        os.write(writer, json.dumps(spent / records * 1e6).encode())
        os._exit(0)
    return float(child_result(pid, reader, writer))


def job_end_ms(ranks: int, *, clean: bool) -> float:
    """The monitor's time (ms) for the end of a job of ``ranks`` ranks of 200 layers
    (hello and 3 records each): every connection closed, in a random order, after a
    ``bye`` from each rank (``clean``, as probes close) or without one (the ranks
    killed); in a fresh process, without sockets. The monitor's loop, and its screen,
    wait for these closes."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(reader)
        load = Load(ranks, 200, 3, 3)
        monitor = Monitor(MonitorState())
        conns = [Connection(rank + 1, "local", None) for rank in range(ranks)]
        for rank, conn in enumerate(conns):
            frames = FrameReader().feed(rank_frames(load, rank, f"job-end-{ranks}"))
            if clean:
                frames.append(make_frame("bye", reason="closed", pid=rank))
            for frame in frames:
                if not isinstance(frame, FrameError):
                    monitor.frame_received(conn, frame)
        random.Random(0).shuffle(conns)
        started = time.perf_counter()
        for conn in conns:
            monitor.connection_closed(conn, "closed" if clean else "connection lost")
        os.write(writer, json.dumps((time.perf_counter() - started) * 1e3).encode())
        os._exit(0)
    return float(child_result(pid, reader, writer))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer and smaller rows")
    parser.add_argument("--ranks", type=int, help="only the rows of this many ranks")
    parser.add_argument(
        "--plain", action="store_true", help="norms as plain lists (as to a monitor from before)"
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="only the monitor's CPU time a record, in one process without sockets",
    )
    args = parser.parse_args()
    if args.cpu:
        for plain in (True, False):
            load = Load(1024, 200, 40, 40, rank0_records=240, plain=plain)
            print(
                f"1,024 x 200, 40 records a rank (rank 0: 240), "
                f"{'plain lists' if plain else 'packed'}: {cpu_per_record(load):.0f} us a record",
                flush=True,
            )
        for clean in (True, False):
            print(
                f"a 1,024-rank job's end, {'each rank saying bye' if clean else 'no bye'}: "
                f"{job_end_ms(1024, clean=clean):,.0f} ms for all 1,024 closes",
                flush=True,
            )
        return 0
    scale = 4 if args.quick else 1
    rate_rows = [
        Load(1, 200, 20000 // scale, 20000 // scale),
        Load(8, 200, 3000 // scale, 3000 // scale),
        Load(64, 200, 400 // scale, 400 // scale),
        Load(8, 50, 3000 // scale, 3000 // scale),
        Load(8, 1000, 600 // scale, 600 // scale),
    ]
    memory_rows = [Load(64, 200, 2000 // scale, 100_000)]
    # a job's start: every rank connects at once; rank 0 sends 60 a second, the others 10
    burst_rows = [Load(1024, 200, 80 // scale, 80 // scale, burst=True, rank0_records=480 // scale)]
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} cores; the monitor in one "
        "process, each rank a client process on its own connection (the 1,024-rank "
        f"row: {CLIENT_PROCESSES} processes holding theirs)"
    )
    print(
        f"{'ranks':>6}{'layers':>8}{'records/rank':>14}{'steps/rank':>12}"
        f"{'records/s':>12}{'peak MB':>10}{'refused':>10}"
    )
    for load in rate_rows + memory_rows + burst_rows:
        if args.ranks is not None and load.ranks != args.ranks:
            continue
        rate, memory, refused = measure(dataclasses.replace(load, plain=args.plain))
        print(
            f"{load.ranks:>6}{load.layers:>8}{load.records:>14,}{load.steps:>12,}"
            f"{rate:>12,.0f}{memory:>10.0f}{refused:>10,}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
