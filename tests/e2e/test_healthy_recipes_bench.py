"""The healthy-recipes benchmark's harness (``tests/bench/healthy_recipes.py``) works:
it reports the alerts the monitor raises (a broken twin of a recipe, Adam at lr 10, is
named), checks that a healthy run learns, says a crash, and tabulates. Short runs: the
bench itself measures the silence of the full-length recipes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tests.bench.healthy_models import adam_mlp
from tests.bench.healthy_recipes import Bench, Measured, Recipe, Seen, measure, table


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """As the bench runs (tiny models: a second thread only spins against the first)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_broken_variant_is_reported_with_its_alerts() -> None:
    broken = adam_mlp(lr=10.0, name="adam-mlp-lr10")
    measured = measure(broken, "every", steps=30)
    assert not measured.error, measured.error
    assert measured.steps == 30 and measured.records == 30  # every step its own record
    assert measured.alerts, "Adam at lr 10 raised nothing"
    assert all(s.line.startswith("ALERT ") for s in measured.alerts)
    first = measured.alerts[0]
    assert first.short.startswith(f"{first.kind}@{first.step}")


def test_a_healthy_recipe_learns_and_its_losses_are_the_logged_ones() -> None:
    measured = measure(adam_mlp(), "full", steps=150)
    assert not measured.error, measured.error
    assert measured.steps == 150
    assert len(measured.losses) == 150  # one a step, as probe.log was given them
    assert measured.learns is True
    check = measured.loss_check
    assert check is not None and check[1] < 0.8 * check[0]


def test_a_crash_is_reported_and_the_table_says_each_run() -> None:
    def crash(bench: Bench, steps: int) -> None:
        raise ZeroDivisionError("the recipe's own bug")

    boom = Recipe("boom", "none", "nothing", 10, crash)
    crashed = measure(boom, "full")
    assert "ZeroDivisionError" in crashed.error
    loud = Recipe("loud", "one backward", "watch + step()", 10, crash)
    seen = Seen("update_ratio", 0, "fc1", "ALERT error update_ratio step=0 subject=fc1")
    results = {
        "boom": {"full": crashed},
        "loud": {
            "full": Measured("loud", "full", alerts=[seen]),
            "every": Measured("loud", "every"),
        },
    }
    text = table([boom, loud], results)
    assert "CRASHED: ZeroDivisionError" in text
    assert "| update_ratio@0[fc1] | none |" in text
    assert "0 of 2 silent" in text
