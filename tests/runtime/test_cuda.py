"""On a GPU: the probe's training-thread path never synchronises host and device.

These run only where CUDA is available (CI has no GPU, so they are reported skipped
there, never counted as passing).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import probes
from tests.collector import FrameCollector

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def train(
    probe: probes.Probe,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    steps: int,
) -> None:
    for _ in range(steps):
        with probe.step():
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            probe.log(loss=loss)


def cuda_model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)).cuda()
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


@cuda
def test_default_probe_path_makes_no_host_device_sync(collector: FrameCollector) -> None:
    model, opt = cuda_model()
    x, y = torch.randn(64, 256, device="cuda"), torch.randn(64, 1, device="cuda")
    probe = probes.watch(model, opt, address=collector.address, max_steps_per_s=1e9)
    train(probe, model, opt, x, y, 3)  # warm up: allocator, pinned host buffers
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising call raises
    try:
        train(probe, model, opt, x, y, 40)  # sampled steps (every 20) included
    finally:
        torch.cuda.set_sync_debug_mode(0)
    probe.close()
    assert collector.wait_for(lambda frames: any(f["kind"] == "bye" for f in frames))
    steps = {f["step"]: f for f in collector.kinds("step")}
    assert max(steps) == 42 and all(g is not None and g > 0 for g in steps[42]["grad_norms"])
    assert "param_norms" in steps[40] and "update_ratios" in steps[40]


@cuda
def test_guard_on_cuda_skips_a_non_finite_update(collector: FrameCollector) -> None:
    model, opt = cuda_model()
    x, y = torch.randn(64, 256, device="cuda"), torch.randn(64, 1, device="cuda")
    probe = probes.watch(model, opt, address=collector.address, guard=True)
    before = [p.detach().clone() for p in model.parameters()]
    with probe.step():
        loss = nn.functional.mse_loss(model(x), y) * float("nan")
        loss.backward()
        opt.step()
    assert probe.update_skipped
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    probe.close()


@cuda
def test_phases_are_the_devices_and_the_memory_the_allocators(collector: FrameCollector) -> None:
    import time

    model, opt = cuda_model()
    x, y = torch.randn(64, 256, device="cuda"), torch.randn(64, 1, device="cuda")
    probe = probes.watch(model, opt, address=collector.address, max_steps_per_s=1e9)
    for _ in range(30):
        torch.cuda.synchronize()  # (the device idle: what the host does next, it waits for)
        time.sleep(0.005)  # a slow loader
        with probe.step():
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    probe.close()
    assert collector.wait_for(lambda frames: any(f["kind"] == "bye" for f in frames))
    [hello] = collector.kinds("hello")
    assert hello["memory_source"] == "cuda"
    records = collector.kinds("step")[5:]
    assert all(r["memory"] > 0 and r["memory_reserved"] >= r["memory"] for r in records)
    assert all(r["memory_peak"] >= r["memory"] for r in records)
    timed = [r for r in records if "data_time" in r]
    assert timed, "the device phases were never read"
    assert sorted(r["data_time"] for r in timed)[len(timed) // 2] >= 0.004  # the idle device


@cuda
def test_a_cuda_out_of_memory_is_reported_with_the_largest_tensors(
    collector: FrameCollector,
) -> None:
    model, opt = cuda_model()
    probe = probes.watch(model, opt, address=collector.address)
    x = torch.randn(64, 256, device="cuda")
    with pytest.raises(torch.OutOfMemoryError), probe.step():
        torch.empty(2**50, dtype=torch.uint8, device="cuda")
    probe.close()
    assert collector.wait_for(lambda frames: any(f["kind"] == "bye" for f in frames))
    [alert] = [
        f["alert"] for f in collector.kinds("alert") if f["alert"]["kind"] == "out_of_memory"
    ]
    assert alert["evidence"]["peak"] != "unknown"
    del x
