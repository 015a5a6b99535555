"""A LightningModule whose training step gives ``F.nll_loss`` the raw scores (no
log-softmax): the loss goes negative. Fixed (``--fixed``): ``log_softmax`` first."""

import sys

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FIXED = "--fixed" in sys.argv


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def training_step(self, batch, batch_idx):
        x, y = batch
        scores = self.net(x)
        loss = F.nll_loss(F.log_softmax(scores, dim=1) if FIXED else scores, y)
        self.last_loss = loss.detach()
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def train(steps: int = 8) -> str:
    pl.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    data = DataLoader(TensorDataset(x, torch.randint(0, 3, (64,), generator=g)), batch_size=8)
    module = Classifier()
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, data)
    checksum = sum(p.double().sum().item() for p in module.parameters())
    return f"result {module.last_loss.item()!r} {checksum!r}"


if __name__ == "__main__":
    print(train())
