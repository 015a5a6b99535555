"""The do-no-harm loop (``tests/e2e/test_do_no_harm.py``): a small MLP with dropout, AdamW,
an evaluation under ``torch.no_grad()`` each epoch, and every user action in turn, each
in a segment of its own that starts from the same weights, optimizer state and seed
(so one action's harm does not spill into the next cell). No traintop here: the
scripts that watch hand in a ``Watching`` (how a step and an evaluation are wrapped).

Each segment writes, under ``summary[action]``: its losses (``float.hex``), the hashes
of what it saved (the file's bytes and the tensors loaded back), the weights at its end,
and ``error`` (``"Type: first line"``) when the action or its training raised.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import os
import pickle
import pickletools
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

CHEAP = [
    "train",
    "save_whole",
    "save_state_dict",
    "pickle",
    "deepcopy_ema",
    "to_float64",
    "checkpoint_resume",
    "keyboard_interrupt",
]
HEAVY = ["spawn_loader", "compile"]  # a spawned worker, dynamo: seconds each
ORDER = [*CHEAP[:-1], *HEAVY, CHEAP[-1]]  # the interrupt last: it may end a probe

STEPS_PER_EPOCH = 3
BATCH = 16


def setup_determinism() -> None:
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)


def build() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 32), nn.ReLU(),
        nn.Dropout(0.2), nn.Linear(32, 3),
    )  # fmt: skip


def batch(index: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + index)
    x = torch.randn(BATCH, 8, generator=generator).to(dtype)
    return x, torch.randint(0, 3, (BATCH,), generator=generator)


def hx(value: float) -> str:
    return float(value).hex()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pickle_sha(data: bytes) -> str:
    """The sha256 of a pickle read as its opcodes and their arguments, with each tensor
    storage's key replaced by its order of appearance. ``pickle`` names a storage by its
    address in memory (decimal text inside the tensor's bytes), which differs between
    any two runs whose allocations differ, traintop or not; everything else (the
    module's state, its hooks, the data) is compared as pickled."""
    text = io.StringIO()
    pickletools.dis(data, out=text)
    ops = [line.split(":", 1)[1] for line in text.getvalue().splitlines() if ":" in line]
    keys: dict[str, int] = {}

    def key(found: re.Match[str]) -> str:
        return f"X<storage {keys.setdefault(found.group(1), len(keys))}>q"

    return sha(STORAGE_KEY.sub(key, "\n".join(ops)).encode())


#: A storage's key as ``pickletools`` shows it inside the tensor's bytes: a short
#: unicode string of digits (``X``, its length in 4 bytes, the digits), then a memo put.
STORAGE_KEY = re.compile(r"X\\x[0-9a-f]{2}\\x00\\x00\\x00(\d+)q")


def record_save_whole(result: dict[str, Any], model: Any, path: str) -> None:
    """``torch.save(model)`` whole, loaded back: the file's bytes, the tensors, the hooks."""
    torch.save(model, path)
    loaded = torch.load(path, weights_only=False)
    result.update(file=file_sha(path), loaded=tensors_sha(loaded), loaded_hooks=hook_counts(loaded))


def record_pickle(result: dict[str, Any], model: Any) -> None:
    """``pickle.dumps(model)``, loaded back: the pickle, the tensors, the hooks."""
    data = pickle.dumps(model)
    loaded = pickle.loads(data)
    result.update(
        bytes=pickle_sha(data), loaded=tensors_sha(loaded), loaded_hooks=hook_counts(loaded)
    )


def file_sha(path: str) -> str:
    with open(path, "rb") as handle:
        return sha(handle.read())


def tensors_sha(tensors: Any) -> str:
    """The sha256 of named tensors (a state dict, a checkpoint's nested dicts, a module's
    state dict): names, dtypes, shapes and bytes, in sorted order."""
    digest = hashlib.sha256()

    def visit(prefix: str, value: Any) -> None:
        if isinstance(value, nn.Module):
            visit(prefix, value.state_dict())
        elif isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous()
            digest.update(f"{prefix}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
            digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(value, dict):
            for key in sorted(value, key=repr):
                visit(f"{prefix}/{key!r}", value[key])
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                visit(f"{prefix}[{i}]", item)
        else:
            digest.update(f"{prefix}={value!r}|".encode())

    visit("", tensors)
    return digest.hexdigest()


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


class Watching:
    """How the loop is watched: the bare loop's version wraps nothing."""

    def __init__(self, model: nn.Module | None = None, optimizer: Any = None) -> None:
        pass

    def step(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def evaluate(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def log(self, **scalars: Any) -> None:
        pass

    def close(self) -> None:
        pass


class ModelDataset(Dataset):
    """A dataset that holds the model (a teacher's logits, a hard-example miner): with a
    spawned worker the model is pickled into that process."""

    def __init__(self, model: nn.Module, count: int) -> None:
        self.model, self.count = model, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, y = batch(200)
        x, y = x[index], y[index]
        with torch.no_grad():
            score = sum(p.double().sum() for p in self.model.parameters())
        return x, y, torch.as_tensor(score)


class Run:
    """The model, its optimizer and the summary; one segment per action."""

    def __init__(self, watching_of: Callable[[nn.Module, torch.optim.Optimizer], Watching]):
        setup_determinism()
        self.model = build()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.initial_model = copy.deepcopy(self.model.state_dict())
        self.initial_optimizer = copy.deepcopy(self.optimizer.state_dict())
        self.watching = watching_of(self.model, self.optimizer)
        self.step_index = 0

    # -- the training loop ------------------------------------------------------------
    def reset(self, seed: int) -> None:
        """The segment's start: the same weights, a fresh AdamW, the same RNG."""
        self.model.float()
        self.model.load_state_dict(self.initial_model)
        self.optimizer.load_state_dict(self.initial_optimizer)
        self.model.train()
        torch.manual_seed(seed)

    def train_step(
        self,
        model: nn.Module,
        index: int,
        losses: list[str],
        dtype: torch.dtype = torch.float32,
        data: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        x, y = data if data is not None else batch(index, dtype)
        with self.watching.step():
            self.optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x.to(dtype)), y)
            loss.backward()
            self.optimizer.step()
            self.watching.log(loss=loss)
        losses.append(hx(loss.item()))

    def evaluate(self, model: nn.Module, losses: list[str], dtype: torch.dtype) -> None:
        with self.watching.evaluate():
            model.eval()
            total = torch.zeros((), dtype=dtype)
            with torch.no_grad():
                for i in range(2):
                    x, y = batch(500 + i, dtype)
                    total = total + nn.functional.cross_entropy(model(x), y)
            self.watching.log(val_loss=total / 2)
            model.train()
        losses.append("eval " + hx((total / 2).item()))

    def epoch(
        self, losses: list[str], model: nn.Module | None = None, dtype: torch.dtype = torch.float32
    ) -> None:
        model = model if model is not None else self.model
        for _ in range(STEPS_PER_EPOCH):
            self.train_step(model, self.step_index, losses, dtype)
            self.step_index += 1
        self.evaluate(model, losses, dtype)

    def finish(self, result: dict[str, Any], losses: list[str]) -> None:
        result["losses"] = losses
        result["weights"] = tensors_sha(self.model)

    # -- the segments -----------------------------------------------------------------
    def segment(self, action: str, out: str) -> dict[str, Any]:
        self.reset(seed=ORDER.index(action))
        self.step_index = 0
        result: dict[str, Any] = {}
        losses: list[str] = []
        try:
            self.epoch(losses)  # a training epoch and an evaluation before every action
            getattr(self, f"do_{action}")(result, losses, os.path.join(out, action))
        except (Exception, KeyboardInterrupt) as error:  # the cell names it
            result["error"] = first_line(error)
            result["traceback"] = traceback.format_exc()
        self.finish(result, losses)
        return result

    def do_train(self, result: dict[str, Any], losses: list[str], out: str) -> None:
        self.epoch(losses)

    def at_each_phase(self, losses: list[str], act: Callable[[str], None]) -> None:
        """An epoch with ``act(tag)`` after each training step and after its evaluation:
        whatever the probe has installed between steps (a sampled step's hooks, an
        evaluation's) is there at one of them (the watching scripts sample every 3rd)."""
        for i in range(STEPS_PER_EPOCH):
            self.train_step(self.model, self.step_index, losses)
            self.step_index += 1
            act(f"step{i}")
        self.evaluate(self.model, losses, torch.float32)
        act("eval")

    def do_save_whole(self, result: dict[str, Any], losses: list[str], out: str) -> None:
        def act(tag: str) -> None:
            result[tag] = {}
            record_save_whole(result[tag], self.model, f"{out}_{tag}.pt")

        self.at_each_phase(losses, act)
        self.epoch(losses)

    def do_save_state_dict(self, result: dict[str, Any], losses: list[str], out: str) -> None:
        path = out + ".pt"
        torch.save(self.model.state_dict(), path)
        result["file"] = file_sha(path)
        state = torch.load(path)  # weights_only, the default
        result["keys"] = list(state)
        result["loaded"] = tensors_sha(state)
        fresh = build()
        fresh.load_state_dict(state)
        fresh.eval()
        with torch.no_grad():
            result["fresh_output"] = tensors_sha(fresh(batch(500)[0]))
        self.epoch(losses)

    def do_pickle(self, result: dict[str, Any], losses: list[str], out: str) -> None:
        def act(tag: str) -> None:
            result[tag] = {}
            record_pickle(result[tag], self.model)

        self.at_each_phase(losses, act)
        self.epoch(losses)

    def do_deepcopy_ema(self, result: dict[str, Any], losses: list[str], out: str) -> None:
        copies: list[nn.Module] = []

        def act(tag: str) -> None:
            twin = copy.deepcopy(self.model)
            copies.append(twin)
            result[tag] = {"copy": tensors_sha(twin), "copy_hooks": hook_counts(twin)}

        self.at_each_phase(losses, act)
        ema = copies[-1]  # the copy made after the evaluation: an EMA of the weights
        ema.requires_grad_(False)
        ema_losses: list[str] = []
        for _ in range(2):
            for _ in range(STEPS_PER_EPOCH):
                self.train_step(self.model, self.step_index, losses)
                self.step_index += 1
                with torch.no_grad():
                    for e, p in zip(ema.parameters(), self.model.parameters(), strict=True):
                        e.mul_(0.9).add_(p, alpha=0.1)
            self.evaluate(self.model, losses, torch.float32)
            ema.eval()
            with torch.no_grad():  # the EMA's own evaluation, outside the watched model's
                x, y = batch(500)
                ema_losses.append(hx(nn.functional.cross_entropy(ema(x), y).item()))
        result["ema_losses"] = ema_losses
        result["ema"] = tensors_sha(ema)

    def do_spawn_loader(self, result: dict[str, Any], losses: list[str], out: str) -> None:
        loader = DataLoader(
            ModelDataset(self.model, 8),
            batch_size=4,
            num_workers=1,
            multiprocessing_context="spawn",
            timeout=120,
        )
        scores = []
        for x, y, score in loader:
            scores.append([hx(s) for s in score.tolist()])
            self.train_step(self.model, self.step_index, losses, data=(x, y))
            self.step_index += 1
        result["worker_scores"] = scores  # the model the worker saw: the weights at spawn
        self.epoch(losses)

    def do_to_float64(self, result: dict[str, Any], losses: list[str], out: str) -> None:
        self.model.to(torch.float64)
        # AdamW's moments are float32 still: a reload casts them to the parameters' dtype
        self.optimizer.load_state_dict(self.optimizer.state_dict())
        self.epoch(losses, dtype=torch.float64)
        result["dtype_weights"] = tensors_sha(self.model)
        self.epoch(losses, dtype=torch.float64)

    def do_compile(self, result: dict[str, Any], losses: list[str], out: str) -> None:
        from torch._dynamo.utils import counters

        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(self.model, backend="aot_eager")
        self.epoch(losses, model=compiled)
        self.epoch(losses, model=compiled)
        result["counters"] = {  # dynamo's counts; a graph break named by its first line
            group: {str(key).strip().splitlines()[0][:90]: n for key, n in sorted(v.items())}
            for group, v in sorted(counters.items())
        }
        result["graph_breaks"] = sum(counters["graph_break"].values())

    def do_checkpoint_resume(self, result: dict[str, Any], losses: list[str], out: str) -> None:
        path = out + ".pt"
        torch.save(
            {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}, path
        )
        result["file"] = file_sha(path)
        start = self.step_index
        torch.manual_seed(77)
        self.epoch(losses)
        result["weights_before_resume"] = tensors_sha(self.model)
        checkpoint = torch.load(path)
        result["loaded"] = tensors_sha(checkpoint)
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.step_index = start
        torch.manual_seed(77)
        losses.append("resumed")
        self.epoch(losses)

    def do_keyboard_interrupt(self, result: dict[str, Any], losses: list[str], out: str) -> None:
        path = out + ".pt"
        try:
            for i in range(2 * STEPS_PER_EPOCH):
                if i == 4:
                    with self.watching.step():
                        raise KeyboardInterrupt  # Ctrl-C, mid-step
                self.train_step(self.model, self.step_index, losses)
                self.step_index += 1
        except KeyboardInterrupt:
            torch.save(
                {
                    "model": self.model.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "step": self.step_index,
                },
                path,
            )
            result["interrupted_at"] = self.step_index
        result["file"] = file_sha(path) if os.path.exists(path) else None
        result["loaded"] = tensors_sha(torch.load(path)) if os.path.exists(path) else None


def hook_counts(model: nn.Module) -> list[int]:
    """How many hooks a (copied, loaded) model carries, all kinds together."""
    counts = []
    for module in model.modules():
        count = 0
        for name, value in vars(module).items():
            if name.endswith("hooks") and isinstance(value, dict):
                count += len(value)
        counts.append(count)
    return counts


@contextlib.contextmanager
def summary_file(out: str) -> Iterator[dict[str, Any]]:
    summary: dict[str, Any] = {"torch": torch.__version__}
    try:
        yield summary
    finally:
        with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=1)


def main(watching_of: Callable[[nn.Module, torch.optim.Optimizer], Watching]) -> None:
    """``script.py OUT [ACTION ...]``: the actions (default: the cheap ones) in order."""
    out = sys.argv[1]
    wanted = sys.argv[2:] or CHEAP
    os.makedirs(out, exist_ok=True)
    with summary_file(out) as summary:
        run = Run(watching_of)
        for action in ORDER:
            if action in wanted:
                summary[action] = run.segment(action, out)
        run.watching.close()
        summary["closed"] = True


#: What a framework writes that changes from one run to the next on its own (timings).
TIMING_KEYS = ("_runtime", "_per_second", "time", "timestamp")


def without_timings(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: without_timings(v)
            for k, v in value.items()
            if not (isinstance(k, str) and k.endswith(TIMING_KEYS))
        }
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def files_summary(root: str) -> dict[str, dict[str, Any]]:
    """Every file under ``root``: its bytes' sha256 and its content as loaded (a JSON
    file without its timings; a torch file's tensors and values; safetensors' tensors)."""
    found: dict[str, dict[str, Any]] = {}
    for folder, _, names in sorted(os.walk(root)):
        for name in sorted(names):
            path = os.path.join(folder, name)
            entry: dict[str, Any] = {"bytes": file_sha(path)}
            try:
                if name.endswith(".json"):
                    with open(path, encoding="utf-8") as handle:
                        entry["content"] = sha(
                            json.dumps(without_timings(json.load(handle)), sort_keys=True).encode()
                        )
                elif name.endswith(".safetensors"):
                    from safetensors.torch import load_file

                    entry["content"] = tensors_sha(load_file(path))
                elif name.endswith((".pt", ".pth", ".bin", ".ckpt")):
                    entry["content"] = tensors_sha(torch.load(path, weights_only=False))
            except Exception as error:  # the cell names it
                entry["content_error"] = first_line(error)
            found[os.path.relpath(path, root)] = entry
    return found
