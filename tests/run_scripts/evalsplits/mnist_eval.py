"""pytorch/examples' MNIST, its ``test()`` as written there: each batch's
``F.nll_loss(output, target, reduction='sum').item()`` added up, then divided by
``len(test_loader.dataset)`` (a last batch shorter than the others). Synthetic data, a
small MLP. ``python mnist_eval.py [sum|mean|module]``: ``mean`` weighs each batch's mean
by its size instead; ``module`` sums with ``nn.NLLLoss(reduction="sum")``."""

import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

HOW = sys.argv[1] if len(sys.argv) > 1 else "sum"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(20, 32)
        self.dropout = nn.Dropout(0.25)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.dropout(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def train(model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer) -> None:
    model.train()
    for data, target in loader:
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()


def test(model: nn.Module, test_loader: DataLoader) -> None:
    model.eval()
    test_loss = 0.0
    criterion = nn.NLLLoss(reduction="sum")
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            if HOW == "mean":
                test_loss += F.nll_loss(output, target).item() * len(data)
            elif HOW == "module":
                test_loss += criterion(output, target).item()
            else:
                test_loss += F.nll_loss(output, target, reduction="sum").item()  # sum up batch loss
    test_loss /= len(test_loader.dataset)
    print(f"test {test_loss!r}", flush=True)


def main() -> None:
    torch.manual_seed(1)
    x, y = torch.randn(256, 20), torch.randint(0, 10, (256,))
    x_test, y_test = torch.randn(230, 20), torch.randint(0, 10, (230,))
    train_loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    test_loader = DataLoader(TensorDataset(x_test, y_test), batch_size=64)  # 64*3 + 38
    model = Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    for _epoch in range(3):
        train(model, train_loader, optimizer)
        test(model, test_loader)
        scheduler.step()


if __name__ == "__main__":
    main()
