"""The Hugging Face Trainer on a small classifier of its own whose forward returns the
loss: the head's softmax goes into ``F.cross_entropy``. Fixed (``--fixed``): the logits."""

import os
import sys
import tempfile

import torch
import torch.nn.functional as F
import transformers
from torch import nn

FIXED = "--fixed" in sys.argv


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 6))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.net(x)
        scores = logits if FIXED else F.softmax(logits, dim=-1)
        return {"loss": F.cross_entropy(scores, labels), "logits": logits}


def train(steps: int = 6) -> str:
    torch.manual_seed(0)
    model = Classifier()
    g = torch.Generator().manual_seed(0)
    rows = [
        {"x": torch.randn(12, generator=g), "labels": torch.randint(0, 6, (), generator=g)}
        for _ in range(64)
    ]
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=os.path.join(out, "run"),
            max_steps=steps,
            per_device_train_batch_size=8,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
            logging_strategy="no",
            seed=0,
        )
        trainer = transformers.Trainer(model=model, args=args, train_dataset=rows)
        result = trainer.train()
    checksum = sum(p.double().sum().item() for p in model.parameters())
    return f"result {result.training_loss!r} {checksum!r}"


if __name__ == "__main__":
    print(train())
