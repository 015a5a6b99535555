"""Way 5: Lightning's ``Trainer`` with ``callbacks=[TraintopCallback()]`` (none with
``HARM_BARE=1``, and ``probes`` never imported): an MLP with dropout, AdamW, validation
each epoch; the user's callback, after the first validation (the probe open), does
``torch.save(module)``, ``pickle.dumps``, ``copy.deepcopy`` as an EMA updated each step,
the state dict's keys and values and ``trainer.save_checkpoint``; then a second
``fit(ckpt_path=...)`` resumes from that checkpoint.

``python lightning_fit.py OUT`` writes ``OUT/summary.json``."""

import copy
import os
import sys
import traceback
from typing import Any

import common
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = common.build()
        self.losses: list[str] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.losses.append(common.hx(loss.detach().item()))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.losses.append("eval " + common.hx(loss.item()))
        self.log("val_loss", loss)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class UserActions(pl.Callback):
    def __init__(self, summary: dict[str, Any], out: str) -> None:
        self.summary, self.out = summary, out
        self.ema: Any = None

    def _do(self, action: str, act: Any) -> None:
        result = self.summary.setdefault(action, {})
        try:
            act(result)
        except Exception as error:  # the cell names it
            result["error"] = common.first_line(error)
            result["traceback"] = traceback.format_exc()

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        if trainer.sanity_checking or trainer.current_epoch != 0 or self.ema is not None:
            return
        self._do("save_whole", lambda r: self.do_save_whole(r, module))
        self._do("pickle", lambda r: self.do_pickle(r, module))
        self._do("deepcopy_ema", lambda r: self.do_deepcopy(r, module))
        self._do("state_dict", lambda r: self.do_state_dict(r, module))
        self._do("save_checkpoint", lambda r: self.do_save_checkpoint(r, trainer))

    def do_save_whole(self, result: dict[str, Any], module: Any) -> None:
        common.record_save_whole(result, module, os.path.join(self.out, "save_whole.pt"))

    def do_pickle(self, result: dict[str, Any], module: Any) -> None:
        common.record_pickle(result, module)

    def do_deepcopy(self, result: dict[str, Any], module: Any) -> None:
        self.ema = copy.deepcopy(module.net)
        self.ema.requires_grad_(False)
        result.update(copy=common.tensors_sha(self.ema), copy_hooks=common.hook_counts(self.ema))

    def do_state_dict(self, result: dict[str, Any], module: Any) -> None:
        state = module.state_dict()
        result.update(keys=list(state), values=common.tensors_sha(state))

    def do_save_checkpoint(self, result: dict[str, Any], trainer: Any) -> None:
        path = os.path.join(self.out, "lightning.ckpt")
        trainer.save_checkpoint(path)
        result["file"] = common.file_sha(path)
        checkpoint = torch.load(path, weights_only=False)
        result["keys"] = sorted(checkpoint)
        result["callbacks"] = sorted(map(str, checkpoint.get("callbacks", {})))
        result["loaded"] = common.tensors_sha(
            {k: v for k, v in checkpoint.items() if k != "callbacks"}
        )

    def on_train_batch_end(self, trainer: Any, module: Any, *args: Any) -> None:
        if self.ema is None:
            return
        with torch.no_grad():
            for e, p in zip(self.ema.parameters(), module.net.parameters(), strict=True):
                e.mul_(0.9).add_(p, alpha=0.1)


def loaders() -> tuple[DataLoader, DataLoader]:
    x, y = common.batch(0)
    x2, y2 = common.batch(1)
    train = TensorDataset(torch.cat([x, x2]), torch.cat([y, y2]))
    val = TensorDataset(*common.batch(500))
    return DataLoader(train, batch_size=8, shuffle=True), DataLoader(val, batch_size=8)


def fit(summary: dict[str, Any], out: str, epochs: int, ckpt: str | None = None) -> Any:
    pl.seed_everything(0, verbose=False)
    module = Classifier()
    callbacks: list[Any] = [UserActions(summary, out)]
    if not os.environ.get("HARM_BARE"):
        from probes.lightning import TraintopCallback

        callbacks.insert(0, TraintopCallback(sample_every=3))
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
        callbacks=callbacks,
    )
    train, val = loaders()
    trainer.fit(module, train, val, ckpt_path=ckpt)
    return module, callbacks[-1]


def main() -> None:
    out = os.path.abspath(sys.argv[1])
    os.makedirs(out, exist_ok=True)
    with common.summary_file(out) as summary:
        common.setup_determinism()
        train: dict[str, Any] = summary.setdefault("train", {})
        module = None
        try:
            module, actions = fit(summary, out, epochs=3)
            if actions.ema is not None:
                summary["deepcopy_ema"]["ema"] = common.tensors_sha(actions.ema)
        except Exception as error:  # the cell names it
            train["error"] = common.first_line(error)
            train["traceback"] = traceback.format_exc()
        if module is not None:
            train["losses"] = module.losses
            train["weights"] = common.tensors_sha(module)
        resumed: dict[str, Any] = summary.setdefault("checkpoint_resume", {})
        try:
            again, _ = fit({}, out, epochs=3, ckpt=os.path.join(out, "lightning.ckpt"))
            resumed["losses"] = again.losses
            resumed["weights"] = common.tensors_sha(again)
        except Exception as error:  # the cell names it
            resumed["error"] = common.first_line(error)
            resumed["traceback"] = traceback.format_exc()


if __name__ == "__main__":
    main()
