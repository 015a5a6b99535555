"""A fast subset of the benchmark's matrix (``tests/bench/matrix_cases.py``): bugs on
loop shapes other than one backward per update (a GradScaler, hand-written updates with
no optimizer, an LBFGS closure), each against its healthy twin, shortened to the steps
their alert needs; the same records thinned 50 to 1 must say the same. Only what holds
on today's rules is asserted here; the whole matrix, with its misses, is the bench's
table (``python tests/bench/diagnosis_suite.py --quick``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from probes.kernel.diagnosis.vocabulary import AlertKind
from tests.bench.diagnosis_cases import EXPECTED, PLACEHOLDER_KINDS
from tests.bench.diagnosis_suite import run, thinned
from tests.bench.matrix_cases import MATRIX

FAST = {  # case -> steps: enough for its alert, and its twin's chance to misfire
    "missing-zero-grad/amp": 5,  # grad_not_cleared at step 2 under fp16 + GradScaler
    "eval-without-eval/by-hand": 3,  # watch(model), no optimizer: eval mode still checked
    "eval-without-eval/closure": 3,  # LBFGS: 5 forwards per step, dropout between cells
}
BY_NAME = {case.name: case for case in MATRIX}


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """These tiny models run fastest on one thread (the bench's default), and a loaded
    machine makes torch's thread pool spin: one thread, then back."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", list(FAST))
def test_the_bug_raises_its_alert_once_and_its_twin_none_on_this_loop_shape(name: str) -> None:
    case = BY_NAME[name]
    bug = run(case, twin=False, mode="every", steps=FAST[name])
    twin = run(case, twin=True, mode="every", steps=FAST[name])
    assert twin.lines == [], twin.lines
    assert [(a.kind, a.subject or "") for a in bug.alerts] == [(case.expect, case.subject)], (
        bug.lines
    )
    fast = thinned(bug)
    assert [(a.kind, a.subject or "") for a in fast.alerts] == [(case.expect, case.subject)]
    assert 0 <= fast.alerts[0].step - bug.alerts[0].step <= 2
    assert thinned(twin).lines == []


def test_every_expectation_names_a_kind_of_the_catalog_or_a_declared_placeholder() -> None:
    known = {kind.value for kind in AlertKind}
    for name, expect in EXPECTED.items():
        assert expect.kind == "" or expect.kind in known | set(PLACEHOLDER_KINDS), name
    # a placeholder that has become a real kind is to be renamed here, not kept twice
    assert not known & set(PLACEHOLDER_KINDS), known & set(PLACEHOLDER_KINDS)


def test_the_matrix_covers_every_loop_shape_and_the_public_scripts_models() -> None:
    shapes = {case.shape for case in MATRIX}
    assert shapes == {"plain", "accum", "closure", "by-hand", "amp", "compile"}
    models = {case.model for case in MATRIX}
    assert {"nanoGPT", "word LM (LSTM)", "mnist CNN", "LBFGS sequence"} <= models
    assert "TransformerEncoder" in models
    # a forgotten zero_grad on every shape, and a case name says its shape
    assert {c.shape for c in MATRIX if c.name.startswith("missing-zero-grad/")} == shapes
    assert all(case.name.endswith("/" + case.shape) for case in MATRIX)
