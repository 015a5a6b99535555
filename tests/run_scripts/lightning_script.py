"""A LightningModule fitted by the Lightning Trainer (its quick-start's shape)."""

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.last_loss = loss.detach()
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def train(steps: int = 8) -> str:
    pl.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    module = Regressor()
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
