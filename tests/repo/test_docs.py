"""The documentation holds together: every relative link of README.md, CONTRIBUTING.md,
CHANGELOG.md and docs/*.md reaches a file of the repository (and a heading there, for a
link with an anchor); README's alert summary names every alert kind once; README stays
a front page; the test commands README gives are the ones CI runs."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from probes.kernel.diagnosis.vocabulary import AlertKind

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
ALERTS = ROOT / "docs" / "alerts.md"
DOCS = sorted(
    [README, ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md")]
)
MAX_README_LINES = 400
TEST_COMMANDS = ("python -m pytest -q -n 2 --dist loadgroup", "python -m pytest -q -m slow")

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", flags=re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", flags=re.MULTILINE)
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", flags=re.IGNORECASE)


def prose(text: str) -> str:
    """The text without its fenced code blocks (a ``# comment`` there is no heading)."""
    return FENCE.sub("", text)


def links(path: Path) -> list[str]:
    """The targets of the markdown links of ``path``, outside code."""
    return LINK.findall(CODE_SPAN.sub("", prose(path.read_text(encoding="utf-8"))))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to
    hyphens (a link's text keeps only its words)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path, level: int | None = None) -> set[str]:
    """The anchors of the headings of ``path`` (of one level only, if given); a repeated
    heading gets ``-1``, ``-2``, ... as on GitHub."""
    seen: Counter[str] = Counter()
    found = set()
    for hashes, text in HEADING.findall(prose(path.read_text(encoding="utf-8"))):
        base = slug(text)
        name = base if not seen[base] else f"{base}-{seen[base]}"
        seen[base] += 1
        if level is None or len(hashes) == level:
            found.add(name)
    return found


def relative_links(doc: Path) -> list[tuple[str, Path, str]]:
    """(the link as written, the file it reaches, its anchor) for each relative link."""
    found = []
    for target in links(doc):
        if SCHEME.match(target):
            continue  # a web address: not a file of the repository
        file, _, anchor = target.partition("#")
        found.append((target, (doc.parent / file).resolve() if file else doc, anchor))
    return found


def test_there_are_documents_and_links_to_check() -> None:
    assert len(DOCS) >= 12
    assert sum(len(relative_links(doc)) for doc in DOCS) > 100


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_heading_of_the_repository(doc: Path) -> None:
    broken = []
    for target, file, anchor in relative_links(doc):
        if file == ALERTS:
            continue  # test_every_link_into_alerts_md_reaches_its_kinds_heading
        if not file.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_link_into_alerts_md_reaches_its_kinds_heading() -> None:
    into = [
        (target, anchor)
        for doc in DOCS
        for target, file, anchor in relative_links(doc)
        if file == ALERTS
    ]
    assert into, "no document links to docs/alerts.md"
    assert ALERTS.exists(), (
        "docs/alerts.md is missing: python -m probes.kernel.diagnosis.manual > docs/alerts.md"
    )
    kinds = {kind.value for kind in AlertKind}
    kind_headings, headings = anchors(ALERTS, level=2), anchors(ALERTS)
    missing = sorted(
        {
            target
            for target, anchor in into
            if anchor and anchor not in (kind_headings if anchor in kinds else headings)
        }
    )
    assert not missing, f"no such heading ('## <kind>' for a kind) in docs/alerts.md: {missing}"


def alert_summary() -> str:
    """README's section on the alerts, up to the next section."""
    text = prose(README.read_text(encoding="utf-8"))
    return text.split("\n## Alerts\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_alert_summary_names_every_alert_kind_once() -> None:
    summary = alert_summary()
    listed = re.findall(r"^- \[`(\w+)`\]\(docs/alerts\.md#(\w+)\): \S", summary, re.MULTILINE)
    assert all(name == anchor for name, anchor in listed), listed
    counts = Counter(name for name, _ in listed)
    kinds = {kind.value for kind in AlertKind}
    assert set(counts) == kinds, (sorted(kinds - set(counts)), sorted(set(counts) - kinds))
    assert all(count == 1 for count in counts.values()), counts.most_common(3)
    for kind in kinds:  # its line names it; no other line does
        assert summary.count(f"`{kind}`") == 1, kind


def test_the_readme_is_a_front_page() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines: move detail to docs/"


def test_the_readme_gives_the_test_commands_ci_runs() -> None:
    readme = README.read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    for command in TEST_COMMANDS:
        assert command in readme
        assert command in ci  # a line of its own: run exactly as written
    # every test command the README shows is a line CI runs, exactly (no comment after it)
    shown = [line for line in readme.splitlines() if line.startswith("python -m pytest")]
    assert shown and all(line in ci for line in shown), shown
