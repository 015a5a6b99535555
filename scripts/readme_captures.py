"""Regenerate the captured screens and sample lines of the README and docs/ from real runs.

Every block of README.md and docs/*.md that follows a ``<!-- capture: NAME -->`` line is what the
program printed or drew for NAME: a demo run in a tmux window of the stated size
(``tmux capture-pane``), or a headless run's lines. Run it after a change that alters
what a user sees, and review the diff:

    python scripts/readme_captures.py                 # every capture, the pages rewritten
    python scripts/readme_captures.py main-80x24      # only these
    python scripts/readme_captures.py --list          # the names

It needs tmux and takes a few minutes (the demos run at their watching pace).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def pages() -> list[Path]:
    """The pages that hold captures: the README and the manual's."""
    return [README, *sorted((REPO / "docs").glob("*.md"))]


# the marker line, the opening fence, the block's lines (maybe none), the closing fence
MARK = re.compile(
    r"(<!-- capture: (?P<name>[\w.-]+) -->\n```[^\n]*\n)"
    r"(?P<body>(?:[^\n]*\n)*?)(```)"
)
TOAST = "▌"  # the left edge of a Textual toast: wait until none covers the screen


def traintop(*args: str) -> str:
    """The command line of ``traintop ARGS`` with this checkout's code."""
    return f"{sys.executable} -m tui.cli " + " ".join(args)


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


class Window:
    """A detached tmux window of a given size running one command."""

    def __init__(self, command: str, width: int, height: int) -> None:
        self.socket = f"traintop-readme-{os.getpid()}-{time.monotonic_ns()}"
        env = " ".join(f"{k}={v}" for k, v in (("PYTHONPATH", REPO), ("OMP_NUM_THREADS", 1)))
        self._tmux(
            "new-session",
            "-d",
            "-s",
            "w",
            "-x",
            str(width),
            "-y",
            str(height),
            f"cd {REPO} && exec env {env} {command}",
        )

    def _tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    def text(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "w").rstrip("\n")

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "w", *keys)

    def wait(self, predicate: Callable[[str], bool], what: str, timeout: float = 180) -> str:
        """The screen once ``predicate`` holds and no toast covers it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.text()
            if predicate(screen) and TOAST not in screen:
                return screen
            time.sleep(0.25)
        raise SystemExit(f"readme_captures: gave up waiting for {what}:\n{self.text()}")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


def step_at_least(count: int) -> Callable[[str], bool]:
    def reached(screen: str) -> bool:
        found = re.search(r"step ([\d,]+)", screen.splitlines()[0] if screen else "")
        return found is not None and int(found.group(1).replace(",", "")) >= count

    return reached


def screen_of(
    command: str,
    size: tuple[int, int],
    until: Callable[[str], bool],
    what: str,
    then: list[tuple[tuple[str, ...], Callable[[str], bool]]] | None = None,
) -> str:
    """Run ``command`` in a window, wait, press keys (each group followed by its own
    wait), and return the last screen."""
    window = Window(command, *size)
    try:
        screen = window.wait(until, what)
        for keys, done in then or []:
            window.keys(*keys)
            screen = window.wait(done, f"{what} after {' '.join(keys)}")
        return screen
    finally:
        window.close()


def finished(screen: str) -> bool:
    return bool(screen) and "finished" in screen.splitlines()[0]


def headless(*args: str, keep: Callable[[str], bool] = lambda line: True) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "tui.cli", *args],
        cwd=REPO,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    return "\n".join(line for line in done.stdout.splitlines() if keep(line))


class Recordings:
    """Run logs of the comparison, recorded once per invocation."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="traintop-readme-"))

    def log(self, scenario: str, *extra: str) -> Path:
        path = self.folder / f"{scenario}{''.join(extra).replace('-', '_')}.ndjson"
        if not path.exists():
            headless("demo", scenario, *extra, "--headless", "--record", str(path))
        return path


def captures(recordings: Recordings) -> dict[str, Callable[[], str]]:
    """NAME -> how to produce it."""

    def comparison() -> str:
        fixed = recordings.log("exploding", "--fixed")
        broken = recordings.log("exploding")
        return screen_of(
            traintop("replay", str(fixed), str(broken)),
            (80, 24),
            lambda s: "ref ●" in s and "peak x ref" in s,
            "the comparison",
        )

    return {
        "healthy-120x40": lambda: screen_of(
            traintop("demo", "healthy"), (120, 40), step_at_least(900), "healthy at step 900"
        ),
        "exploding-80x24": lambda: screen_of(
            traintop("demo", "exploding"), (80, 24), step_at_least(80), "exploding at step 80"
        ),
        "main-80x24": lambda: screen_of(
            traintop("demo", "vanishing"), (80, 24), finished, "vanishing, finished"
        ),
        "heatmap-80x24": lambda: screen_of(
            traintop("demo", "vanishing"),
            (80, 24),
            finished,
            "vanishing, finished",
            then=[(("h",), lambda s: "grad norm ▁▂▃▄▅▆▇█" in s)],
        ),
        "vanishing-120x40": lambda: screen_of(
            traintop("demo", "vanishing"), (120, 40), finished, "vanishing, finished"
        ),
        "nan-forward-120x40": lambda: screen_of(
            traintop("demo", "nan-forward"),
            (120, 40),
            lambda s: "paused+guard" in s,
            "the guard's pause",
            then=[(("a",), lambda s: "Escape closes." in s)],
        ),
        "compare-80x24": comparison,
        # where it listens (the private folder's random name as it was), the connect,
        # a summary every 100 steps, the end
        "headless-healthy": lambda: headless(
            "demo", "healthy", "--headless", "--steps", "300", "--summary-every", "100"
        ),
        "alert-line": lambda: headless(
            "demo",
            "exploding",
            "--headless",
            "--fail-on",
            "error",
            keep=lambda line: line.startswith("ALERT error exploding_gradient"),
        ),
        # a run's ALERT lines, and its root causes in checklist order when it goes
        "causes-line": lambda: headless(
            "demo",
            "exploding",
            "--headless",
            "--steps",
            "60",
            keep=lambda line: line.startswith(("ALERT", "causes")),
        ),
    }


def rewrite(text: str, produced: dict[str, str]) -> tuple[str, list[str]]:
    """README text with the named blocks replaced; and the names not found in it."""
    seen = []

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in produced:
            return match.group(0)
        seen.append(name)
        return match.group(1) + produced[name].rstrip("\n") + "\n" + match.group(4)

    return MARK.sub(replace, text), [name for name in produced if name not in seen]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="only these captures (default: all)")
    parser.add_argument("--list", action="store_true", help="list the capture names")
    args = parser.parse_args(argv)
    recordings = Recordings()
    try:
        known = captures(recordings)
        if args.list:
            print("\n".join(known))
            return 0
        unknown = [name for name in args.names if name not in known]
        if unknown:
            parser.error(f"unknown capture(s): {', '.join(unknown)}")
        if shutil.which("tmux") is None:
            parser.error("tmux is needed (apt-get install tmux)")
        produced = {}
        for name in args.names or list(known):
            print(f"capturing {name} ...", file=sys.stderr, flush=True)
            produced[name] = known[name]()
        missing = set(produced)
        for page in pages():
            text, absent = rewrite(page.read_text(), produced)
            if set(produced) - set(absent):
                page.write_text(text)
            missing &= set(absent)
        for name in sorted(missing):
            print(
                f"readme_captures: no '<!-- capture: {name} -->' block in README.md or docs/",
                file=sys.stderr,
            )
        return 1 if missing else 0
    finally:
        shutil.rmtree(recordings.folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
