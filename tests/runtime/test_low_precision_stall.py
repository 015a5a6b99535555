"""Updates too small for the weights' dtype are named (issue 29 item 3, part B):
bfloat16 weights that stop moving under a rate meant for float32 weights raise
``low_precision_stall``, per tensor (a LayerNorm gain stuck beside a bias that moves);
float32 runs, AMP runs (float32 weights), bfloat16 weights at a healthy rate, frozen
parameters and elements with no gradient raise nothing."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from probes.kernel.diagnosis.precision import LowPrecisionStall
from probes.kernel.diagnosis.thresholds import Thresholds
from probes.runtime.measure.dtype_stall import DtypeStall
from probes.runtime.measure.layers import map_layers
from tests.collector import (
    FrameCollector,
    diagnose,
    verdict_lines,
    verdicts,
    wait_for_bye,
    watch_unthinned,
)
from tests.e2e.test_run import SCRIPTS, result_lines, traintop_run

Frame = dict[str, Any]
T = Thresholds()


# --- the judge (no torch): per tensor, a share held over sampled steps ------------------------


def judge() -> LowPrecisionStall:
    return LowPrecisionStall(
        ["norm.weight", "norm.bias", "fc.weight", "fc.bias"],
        ["norm", "norm", "fc", "fc"],
        ["norm", "fc"],
        ["bfloat16"] * 4,
    )


def test_a_tensor_stuck_on_every_sample_is_named_beside_a_bias_that_moves() -> None:
    stall = judge()
    said = []
    for step in (0, 20, 40, 60):
        # the gain: all 64 elements unchanged; its bias: 5 of 64; fc: a healthy 30%
        counts = [(0, 64.0, 64.0), (1, 64.0, 5.0), (2, 640.0, 190.0), (3, 10.0, 3.0)]
        said += stall.observe(step, counts, lr=5e-5)
    [alert] = said  # once a run
    assert (alert.kind, alert.step, alert.subject, alert.layers) == (
        "low_precision_stall",
        40,  # the third sample in a row
        "norm",
        ("norm",),
    )
    assert alert.evidence["names"] == "norm.weight"  # not its bias, not fc
    assert alert.evidence["unchanged"] == 1.0 and alert.evidence["since_step"] == 0
    assert alert.evidence["dtype"] == "bfloat16" and alert.evidence["lr"] == 5e-5


def test_a_share_below_the_bound_or_a_dip_between_says_nothing() -> None:
    stall = judge()
    below = T.stall_unchanged - 0.05
    for step in range(0, 200, 20):
        assert stall.observe(step, [(2, 100.0, 100.0 * below)]) == []
    dipped = judge()
    shares = [1.0, 1.0, 0.5, 1.0, 1.0, 0.5, 1.0, 1.0]  # never stall_samples in a row
    for step, share in enumerate(shares):
        assert dipped.observe(20 * step, [(0, 64.0, 64.0 * share)]) == []


def test_no_element_with_a_gradient_is_no_news() -> None:
    stall = judge()
    for step in range(0, 200, 20):  # an embedding none of whose sampled rows were in the batch
        assert stall.observe(step, [(0, 0.0, 0.0)]) == []


# --- the measurement: low-precision tensors only ------------------------------------------------


class Block(nn.Module):
    def __init__(self, width: int = 32, norm: bool = True) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width) if norm else nn.Identity()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Tagger(nn.Module):
    def __init__(self, norm: bool = True, rows: int = 100) -> None:
        super().__init__()
        self.embed = nn.Embedding(rows, 32)
        nn.init.normal_(self.embed.weight, std=0.02)  # (GPT-2's: N(0, 1) weights barely move)
        self.block = Block(32, norm)
        self.head = nn.Linear(32, 8)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(tokens)).mean(1))


def batch(step: int, rows: int = 50) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    tokens = torch.randint(0, rows, (32, 8), generator=g)
    return tokens, tokens[:, 0] % 8


def train_watched(
    collector: FrameCollector,
    model: nn.Module,
    lr: float,
    *,
    steps: int = 20,
    amp: bool = False,
    rows: int = 50,
) -> list[Frame]:
    """``steps`` steps of AdamW at ``lr``, watched, sampled every 5th (three samples in
    11 steps: what 41 steps show at the default ``sample_every``; the traintop-run tests
    below keep the default)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr)
    with watch_unthinned(model, optimizer, collector, sample_every=5) as probe:
        for step in range(steps):
            tokens, labels = batch(step, rows)
            with probe.step():
                optimizer.zero_grad()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                    logits = model(tokens)
                loss = F.cross_entropy(logits.float(), labels)
                loss.backward()
                optimizer.step()
                probe.log(loss=loss)
    wait_for_bye(collector)
    return list(collector.frames)


def stall_alerts(frames: list[Frame]) -> list[Frame]:
    return [
        f["alert"]
        for f in frames
        if f["kind"] == "alert" and f["alert"]["kind"] == "low_precision_stall"
    ]


def monitor_kinds(frames: list[Frame]) -> list[str]:
    alerts, _ = diagnose(frames)
    probe_alerts = [f["alert"] for f in frames if f["kind"] == "alert"]
    return [a.kind for a in verdicts(alerts)] + [
        a["kind"] for a in probe_alerts if a.get("severity") != "info"
    ]


def test_bf16_weights_at_a_fine_tuning_rate_are_named(collector: FrameCollector) -> None:
    torch.manual_seed(0)
    frames = train_watched(collector, Tagger().to(torch.bfloat16), lr=5e-5)
    [alert] = stall_alerts(frames)
    assert alert["step"] == 10 and alert["subject"] == "block.norm"  # the first stuck layer
    names = alert["evidence"]["names"].split(", ")
    assert "block.norm.weight" in names and "block.norm.bias" not in names  # per tensor
    assert alert["evidence"]["dtype"] == "bfloat16"
    assert alert["evidence"]["unchanged"] >= T.stall_unchanged
    assert monitor_kinds(frames) == ["low_precision_stall"]


def test_a_layer_norm_gain_stuck_at_1_is_named_even_at_lr_1e_3(collector: FrameCollector) -> None:
    """Not a near miss: a bfloat16 gain of 1.0 ignores any step under 2^-8; AdamW's
    steps at lr 1e-3 are under 1e-3. The gain alone is named; everything else moves."""
    torch.manual_seed(0)
    frames = train_watched(collector, Tagger().to(torch.bfloat16), lr=1e-3)
    [alert] = stall_alerts(frames)
    assert alert["evidence"]["names"] == "block.norm.weight"
    assert alert["layers"] == ["block.norm"]


@pytest.mark.parametrize(
    ("dtype", "lr", "amp", "frozen"),
    [
        (torch.bfloat16, 1e-3, False, False),  # bf16 weights that move
        (torch.float32, 5e-5, False, False),  # float32: not counted at all
        (torch.float32, 5e-5, True, False),  # AMP: float32 weights under autocast
        (torch.bfloat16, 1e-3, False, True),  # a frozen bf16 backbone, the head trained
    ],
    ids=["bf16-lr-1e-3", "fp32", "amp-bf16-autocast", "bf16-frozen-backbone"],
)
def test_healthy_runs_raise_nothing(
    collector: FrameCollector, dtype: torch.dtype, lr: float, amp: bool, frozen: bool
) -> None:
    torch.manual_seed(0)
    model = Tagger(norm=False).to(dtype)
    if frozen:  # stuck by design: no gradient, no count
        model.embed.requires_grad_(False)
        model.block.requires_grad_(False)
    frames = train_watched(collector, model, lr=lr, amp=amp)
    assert stall_alerts(frames) == []
    assert monitor_kinds(frames) == []


def test_embedding_rows_without_a_gradient_are_not_counted(collector: FrameCollector) -> None:
    """An embedding of 4,000 rows of which a batch touches 20: the rows not in it have a
    zero gradient (AdamW leaves them bit-identical); only elements with one count."""
    torch.manual_seed(0)
    frames = train_watched(collector, Tagger(norm=False, rows=4000).to(torch.bfloat16), 1e-3)
    assert stall_alerts(frames) == []


def test_float32_models_pay_nothing_and_rates_of_0_are_not_counted() -> None:
    model = Tagger()
    assert DtypeStall.of(map_layers(model), lambda alert, step: None) is None
    half = Tagger().to(torch.bfloat16)
    stall = DtypeStall.of(map_layers(half), lambda alert, step: None)
    assert stall is not None and len(stall.params) == len(list(half.parameters()))
    optimizer = torch.optim.SGD(half.parameters(), lr=0.0)  # updates_not_applied's
    tokens, labels = batch(0)
    F.cross_entropy(half(tokens).float(), labels).backward()
    stall.before(optimizer)
    assert not stall.taken


def test_counts_on_their_way_from_a_device_are_judged_once_landed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On CUDA the counts travel to pinned memory with an event: judged at the first
    step whose end finds it done (``poll``), never waited for."""
    import probes.runtime.measure.dtype_stall as dtype_stall

    class Event:
        done = False

        def query(self) -> bool:
            return self.done

    event = Event()
    monkeypatch.setattr(
        dtype_stall, "to_host", lambda values, ring=None: (torch.stack(values), event)
    )
    said: list[Any] = []
    torch.manual_seed(0)
    model = Tagger().to(torch.bfloat16)
    stall = DtypeStall.of(map_layers(model), lambda alert, step: said.append((alert, step)))
    assert stall is not None
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    for step in range(3):  # three sampled steps
        tokens, labels = batch(step)
        optimizer.zero_grad()
        F.cross_entropy(model(tokens).float(), labels).backward()
        stall.before(optimizer)
        optimizer.step()
        stall.after(step)
    assert said == [] and stall.waiting  # not landed: nothing read, nothing waited for
    event.done = True
    stall.poll()
    [(alert, step)] = said
    assert step == 2 and "block.norm.weight" in alert.evidence["names"]
    assert not stall.waiting


# --- through ``traintop run``: an unmodified script ---------------------------------------------


@pytest.mark.slow  # a traintop run child (~5 to 10 s); the watch() tests cover it by default
def test_bf16_weights_that_stop_moving_are_named_under_traintop_run(tmp_path: Any) -> None:
    done, frames = run_bf16(tmp_path, "--bf16")
    assert done.returncode == 0, done.stderr
    [line] = verdict_lines(done.stdout)
    assert line.startswith("ALERT warning low_precision_stall step=40 subject=block.norm"), line
    assert "block.norm.weight" in line
    [alert] = stall_alerts(frames)
    assert "block.norm.bias" not in alert["evidence"]["names"]
    bare = os.path.join(SCRIPTS, "coverage", "bf16.py")
    assert result_lines(done.stdout) == [untouched(bare, "--bf16")]  # bit for bit


@pytest.mark.slow  # (each is test_healthy_runs_raise_nothing's case, in the test process)
@pytest.mark.parametrize(
    "args",
    [["--bf16", "--lr", "1e-3", "--no-norm"], ["--amp"], []],
    ids=["bf16-lr-1e-3", "amp", "fp32"],
)
def test_healthy_twins_raise_nothing_under_traintop_run(tmp_path: Any, args: list[str]) -> None:
    done, frames = run_bf16(tmp_path, *args)
    assert done.returncode == 0, done.stderr
    assert verdict_lines(done.stdout) == [], done.stdout
    assert [f for f in frames if f["kind"] == "alert"] == []


def run_bf16(tmp_path: Any, *args: str) -> tuple[Any, list[Frame]]:
    """``traintop run --headless`` on ``coverage/bf16.py`` with ``args``."""
    os.makedirs(os.path.join(tmp_path, "coverage"), exist_ok=True)  # (where its log goes)
    return traintop_run(tmp_path, os.path.join("coverage", "bf16"), *args)


def untouched(script: str, *args: str) -> str:
    """The script's result line, run without traintop (a process of its own)."""
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, script, *args], env=env, capture_output=True, text=True, timeout=300
    )
    [line] = result_lines(done.stdout)
    return line
