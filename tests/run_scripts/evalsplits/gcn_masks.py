"""A GCN (or GAT) script's evaluation in the style of pyGCN and PyG's examples: one
full-graph forward in eval mode, then a loss on each split's mask. A dense normalized
adjacency, no torch_geometric. ``python gcn_masks.py [named|loop]``: ``named`` writes
one line per split (``loss_val = F.nll_loss(output[idx_val], labels[idx_val])``);
``loop`` goes over the masks in a loop, as PyG's examples do for accuracy. Prints each
evaluation's three losses (train, val, test), as the script computes them."""

import sys

import torch
import torch.nn.functional as F
from torch import nn

HOW = sys.argv[1] if len(sys.argv) > 1 else "named"


class GCN(nn.Module):
    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.gc1 = nn.Linear(features, hidden)
        self.gc2 = nn.Linear(hidden, classes)
        self.dropout = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor, adj: torch.Tensor) -> torch.Tensor:
        x = F.relu(adj @ self.gc1(x))
        x = self.dropout(x)
        return F.log_softmax(adj @ self.gc2(x), dim=1)


def graph(nodes: int = 90, features: int = 12, classes: int = 4):
    torch.manual_seed(0)
    labels = torch.randint(0, classes, (nodes,))
    x = torch.randn(nodes, features) + F.one_hot(labels, features).float()
    edges = (torch.rand(nodes, nodes) < 0.08) | (labels[:, None] == labels[None, :]) & (
        torch.rand(nodes, nodes) < 0.2
    )
    adj = (edges | edges.T | torch.eye(nodes, dtype=torch.bool)).float()
    degree = adj.sum(1)
    adj = adj / torch.sqrt(degree[:, None] * degree[None, :])
    idx_train, idx_val, idx_test = torch.arange(0, 30), torch.arange(30, 55), torch.arange(55, 90)
    return x, adj, labels, idx_train, idx_val, idx_test


def main() -> None:
    x, adj, labels, idx_train, idx_val, idx_test = graph()
    model = GCN(x.shape[1], 16, 4)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    for _epoch in range(4):
        model.train()
        optimizer.zero_grad()
        output = model(x, adj)
        loss_train = F.nll_loss(output[idx_train], labels[idx_train])
        loss_train.backward()
        optimizer.step()

        model.eval()
        with torch.no_grad():
            output = model(x, adj)
            if HOW == "loop":
                losses = []
                for mask in [idx_train, idx_val, idx_test]:
                    losses.append(F.nll_loss(output[mask], labels[mask]).item())
                train_value, val_value, test_value = losses
            else:
                loss_train = F.nll_loss(output[idx_train], labels[idx_train])
                loss_val = F.nll_loss(output[idx_val], labels[idx_val])
                loss_test = F.nll_loss(output[idx_test], labels[idx_test])
                train_value, val_value = loss_train.item(), loss_val.item()
                test_value = loss_test.item()
        print(f"splits train={train_value!r} val={val_value!r} test={test_value!r}", flush=True)


if __name__ == "__main__":
    main()
