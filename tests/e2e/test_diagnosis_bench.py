"""A fast subset of the diagnosis benchmark (``tests/bench/diagnosis_suite.py``): a few
documented bugs on models the demo does not have, shortened to the steps their alert
needs, each against its healthy twin; the same records thinned 50 to 1 (a 3,000
steps/s run) must say the same. The whole benchmark, at full speed too, runs apart."""

from __future__ import annotations

import pytest

from tests.bench.diagnosis_cases import CASES
from tests.bench.diagnosis_suite import run, thinned

FAST = {  # case -> steps: enough for its alert, and its twin's chance to misfire
    "missing-zero-grad": 25,  # the update rung, from the probe's per-step check
    "dead-functional-relu": 45,  # a ReLU written as F.relu
    "vanishing-sigmoid-20": 45,  # 16 layers, one line
}  # (the structural checks run through a probe in test_structure)
BY_NAME = {case.name: case for case in CASES}


@pytest.mark.parametrize("name", list(FAST))
def test_the_bug_raises_its_alert_once_naming_the_first_layer_and_its_twin_none(name: str) -> None:
    case = BY_NAME[name]
    bug = run(case, twin=False, mode="every", steps=FAST[name])
    twin = run(case, twin=True, mode="every", steps=FAST[name])
    assert twin.lines == [], twin.lines
    assert [a.kind for a in bug.alerts] == [case.expect], bug.lines
    assert bug.alerts[0].subject == case.subject
    fast = thinned(bug)
    assert fast.records < bug.records / 2
    assert [(a.kind, a.subject) for a in fast.alerts] == [(case.expect, case.subject)]
    assert 0 <= fast.alerts[0].step - bug.alerts[0].step <= 2
    assert thinned(twin).lines == []


def test_the_benchmark_covers_twenty_documented_bugs_on_four_model_families() -> None:
    assert len(CASES) >= 20
    assert all(case.source for case in CASES)
    families = {case.model.split()[0] for case in CASES}
    assert {"CNN+BN", "GRU", "LSTM", "transformer", "MLP"} <= families
