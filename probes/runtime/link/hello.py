"""The hello: what a probe tells the monitor about its run when it connects."""

from __future__ import annotations

import os
import sys
import time

import torch
from torch import nn

from probes.kernel.schema import HelloRecord
from probes.runtime.evaluation.evaluation import count_mode_sensitive
from probes.runtime.job import JobIdentity
from probes.runtime.measure.layers import LayerMap, count_parameters
from probes.runtime.optimizers.optimizers import optimizer_name
from probes.runtime.options import WatchOptions


def hello_fields(
    *,
    run_id: str,
    name: str,
    model: nn.Module,
    module: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    layers: LayerMap,
    activations: list[list[object]],
    identity: JobIdentity,
    sync: str | None,
    options: WatchOptions,
) -> HelloRecord:
    """The hello frame's fields: the run, its place in its job, its model's layers (in
    the order of every per-layer array), and the settings the monitor reads."""
    hello: HelloRecord = {
        "run": run_id,
        "name": name,
        "pid": os.getpid(),
        "job": identity.job,
        "rank": identity.rank,
        "local_rank": identity.local_rank,
        "world_size": identity.world_size,
        "host": identity.host,
        "sync": sync,
        "torch": torch.__version__,
        "started": time.time(),
        "argv": sys.argv[:8],
        "model": type(module).__name__,
        "optimizer": optimizer_name(optimizer),
        "layers": list(layers.names),
        "param_counts": list(layers.param_counts),
        "trainable_params": count_parameters(model),
        "params": list(layers.param_names),
        "activations": activations,
        "mode_sensitive_modules": count_mode_sensitive(model),
        "config": {
            "every": options.every,
            "sample_every": options.sample_every,
            "grad_accumulation": options.grad_accumulation,
            "update_check": optimizer is not None,
        },
    }
    if layers.tied:  # the other names of tied weights (absent when none are tied)
        hello["tied"] = {name: list(others) for name, others in layers.tied.items()}
    return hello
