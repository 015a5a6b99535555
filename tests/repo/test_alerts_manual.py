"""The alert manual (``docs/alerts.md``): written from the catalog, one section per kind,
never stale, its examples in the real line format, its evidence keys the code's own.

Regenerate the page with ``python -m probes.kernel.diagnosis.manual > docs/alerts.md``.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from probes.kernel.diagnosis import Alert, AlertKind, Severity
from probes.kernel.diagnosis.catalog import CATALOG, ENTRIES
from probes.kernel.diagnosis.entry import EXAMPLE_FIELDS
from probes.kernel.diagnosis.manual import (
    JOB_SEVERITY,
    PAGE,
    REGENERATE,
    example_alert,
    example_keys,
    example_line,
    main,
    raising_rule,
    render_alerts_page,
    severity_of,
)
from probes.kernel.diagnosis.vocabulary import Evidence
from tui.headless import alert_line
from tui.screens.alert_detail import manual_text, signal_text

ROOT = Path(__file__).resolve().parents[2]
KINDS = list(AlertKind)
HEADING = re.compile(r"^## (\S+)$", re.MULTILINE)


def key_pattern(key: str) -> str:
    """A documented key as a regex: ``<split>_rows`` stands for any name, then ``_rows``."""
    return "".join(
        r"[A-Za-z0-9_]+" if part.startswith("<") else re.escape(part)
        for part in re.split(r"(<[^>]+>)", key)
        if part
    )


# --- the page ----------------------------------------------------------------------------


def test_every_kind_has_exactly_one_section() -> None:
    headings = HEADING.findall(render_alerts_page())
    for kind in KINDS:
        assert headings.count(kind.value) == 1, f"{kind}: no section (or several) in {PAGE}"


def test_the_committed_page_is_the_rendered_one() -> None:
    path = ROOT / PAGE
    assert path.is_file(), f"{PAGE} is missing: write it with `{REGENERATE}`"
    assert path.read_text(encoding="utf-8") == render_alerts_page(), (
        f"{PAGE} is stale (the alert catalog changed): regenerate it with `{REGENERATE}`"
    )


def test_check_exits_1_on_a_stale_copy_and_0_on_a_fresh_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "alerts.md"
    copy.write_text(render_alerts_page() + "edited by hand\n", encoding="utf-8")
    assert main(["--check", str(copy)]) == 1
    said = capsys.readouterr().err.strip()
    assert "\n" not in said and REGENERATE in said
    copy.write_text(render_alerts_page(), encoding="utf-8")
    assert main(["--check", str(copy)]) == 0
    assert main(["--check", str(tmp_path / "missing.md")]) == 1


# --- the entries -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_every_entry_says_what_a_manual_page_needs(kind: AlertKind) -> None:
    entry = ENTRIES[kind]
    assert entry.signal and entry.not_proved and entry.experiments, kind
    assert "It does not" not in entry.signal, f"{kind}: what it does not prove is not_proved's"
    assert {"step", "subject"} <= set(entry.example), kind
    patterns = [key_pattern(key) for key, _ in entry.evidence]
    for key in example_keys(entry):
        assert any(re.fullmatch(p, key) for p in patterns), f"{kind}: {key} is not documented"
    for key, meaning in entry.evidence:
        assert key and meaning, kind
    # a severity of its own exactly where no rule class (nor the cross-rank checks) says it
    by_monitor = raising_rule(kind) is not None or kind in JOB_SEVERITY
    assert (entry.severity is None) == by_monitor, kind
    assert by_monitor or entry.raised_by, f"{kind}: say which training-side check raises it"


# --- the examples ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_every_example_line_has_the_alert_line_format(kind: AlertKind) -> None:
    """The monitor reads no ALERT lines (it writes them: ``tui.headless.alert_line``), so
    there is no reader to parse the example back with; the example must start as every
    ALERT line does, show every evidence key in order, and split (as the headless line
    does, ``shlex``) into exactly the example's subject and evidence."""
    alert = example_alert(kind)
    line = example_line(kind)
    assert line == alert.line()
    assert line.startswith(f"ALERT {alert.severity.value} {kind.value} step={alert.step}")
    at = 0
    for key in alert.evidence:
        found = line.find(f" {key}=", at)
        assert found > at, f"{kind}: {key} missing or out of order in {line}"
        at = found
    words = shlex.split(alert_line(alert))
    assert words[:4] == ["ALERT", alert.severity.value, kind.value, f"step={alert.step}"]
    pairs = [word.split("=", 1) for word in words[4:]]
    keys = [key for key, _ in pairs]
    expected = (["subject"] if alert.subject else []) + list(alert.evidence)
    assert keys == expected, kind
    if alert.subject:
        assert pairs[0][1] == alert.subject
    assert severity_of(kind) is not None


# --- the evidence keys are the code's ------------------------------------------------------

#: The modules that raise alerts (the catalog, the manual and the vocabulary aside) ...
SOURCES = {
    path: path.read_text(encoding="utf-8")
    for path in sorted((ROOT / "probes").rglob("*.py"))
    if not path.name.startswith(("catalog", "entry", "manual", "vocabulary"))
}
#: ... and the helpers every rule or check builds its evidence with (the count and range
#: of several layers; a finding's examples).
SHARED = [ROOT / "probes/kernel/diagnosis/rule.py", ROOT / "probes/checks/reports.py"]


#: The evidence keys control flow reads, by value: their names in ``Evidence``.
DECIDING = {key.value: key.name for key in Evidence}


@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_every_evidence_key_is_written_by_the_code_that_raises_the_kind(
    kind: AlertKind,
) -> None:
    """Each documented key appears, as a string (``"grad_norm"``, an f-string's
    ``f"{name}_rows"``) or a keyword (``rows_read=``), in a module that names the kind
    (``AlertKind.X`` or ``K.X``) or in the shared helpers. A textual check, so it cannot
    tell which of a module's alerts a key goes to; it does catch a key renamed or
    dropped in the code and still documented here. A key that decides (``Evidence``)
    may be written by its name in that vocabulary."""
    name = re.compile(rf"\.{kind.name}\b")
    modules = [path for path, text in SOURCES.items() if name.search(text)]
    assert modules, f"no module raises {kind}"
    text = "\n".join(SOURCES[path] for path in [*modules, *SHARED])
    for key, _ in ENTRIES[kind].evidence:
        pattern = key_pattern(key).replace(r"[A-Za-z0-9_]+", r"\{[^{}]+\}")
        written = re.search(rf"[\"']{pattern}[\"']|\b{pattern}=", text)
        if key in DECIDING:  # (a key control flow reads is written by its name)
            written = written or re.search(rf"\bEvidence\.{DECIDING[key]}\b", text)
        shown = [str(path.relative_to(ROOT)) for path in modules]
        assert written, f"{kind}: evidence key {key} is written by none of {shown}"


# --- the monitor's detail view -------------------------------------------------------------


def test_the_detail_view_names_the_kind_s_section() -> None:
    assert manual_text(AlertKind.EXPLODING_GRADIENT).plain == (
        "manual: docs/alerts.md#exploding_gradient"
    )


def test_the_detail_view_adds_what_the_kind_does_not_prove_once() -> None:
    entry = CATALOG[AlertKind.EXPLODING_GRADIENT]
    alert = Alert(AlertKind.EXPLODING_GRADIENT, Severity.ERROR, 3, "fc1", {}, entry.signal, ())
    assert signal_text(alert) == f"{entry.signal} {entry.not_proved}"
    older = Alert(AlertKind.EXPLODING_GRADIENT, Severity.ERROR, 3, "fc1", {}, entry.said, ())
    assert signal_text(older) == entry.said  # an older probe's words said it already
    checked = Alert(AlertKind.DUPLICATE_ROWS, Severity.WARNING, 0, "train", {}, "12 rows.", ())
    assert signal_text(checked) == "12 rows."  # a check's own words, as they came
    assert set(EXAMPLE_FIELDS) == {"step", "subject", "severity"}
