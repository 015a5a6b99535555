"""``python -m demo SCENARIO``: run one scenario against whatever monitor listens."""

from __future__ import annotations

import argparse
import os
import sys

from demo.catalog import JOB_SCENARIOS, SCENARIOS, listing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m demo",
        description="traintop's bundled trainer: reproduce a failure mode on synthetic data.",
    )
    parser.add_argument("scenario", nargs="?", help="which scenario (see --list)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument(
        "--steps", type=int, help="train this many steps (default: the scenario's own)"
    )
    parser.add_argument(
        "--delay",
        type=float,
        help="seconds to sleep between steps "
        "(default: the scenario's pace for watching; 0 for full speed)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fixed", action="store_true", help="run the corrected version")
    args = parser.parse_args(argv)
    if args.list:
        print(listing())
        return 0
    if args.scenario not in SCENARIOS:
        parser.error(f"unknown scenario {args.scenario!r}; known: {', '.join(SCENARIOS)}")
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be at least 1")

    import torch  # loaded here, after the arguments are checked

    if args.scenario in JOB_SCENARIOS:
        return run_job_scenario(args)

    from demo.scenarios import BUILDERS
    from demo.trainer import train

    # One intra-op thread: the demo's models are tiny, and torch's spinning worker
    # threads, on a machine shared with the monitor (or a second demo), slow every
    # step by an order of magnitude. OMP_NUM_THREADS, when set, still decides.
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    torch.manual_seed(args.seed)  # before the model is built: its initial weights too
    setup = BUILDERS[args.scenario](args.fixed)
    name = args.scenario + (" (fixed)" if args.fixed else "")
    delay = setup.watch_delay if args.delay is None else max(args.delay, 0.0)
    train(setup, run=name, steps=args.steps, delay=delay, seed=args.seed)
    return 0


def run_job_scenario(args: argparse.Namespace) -> int:
    """A multi-rank scenario: its ranks are this process's children."""
    from demo.ddp import JOB_BUGS, JobOptions, run_job

    name = args.scenario + (" (fixed)" if args.fixed else "")
    delay = 0.02 if args.delay is None else max(args.delay, 0.0)
    bug = {} if args.fixed else JOB_BUGS[args.scenario]
    run_job(JobOptions(name=name, steps=args.steps or 300, delay=delay, seed=args.seed, **bug))
    return 0


if __name__ == "__main__":
    sys.exit(main())
