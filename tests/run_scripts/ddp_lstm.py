"""A word-level LSTM language model under DistributedDataParallel (gloo, torchrun), in
the style of the PyTorch examples' word_language_model; ``--lr`` as its command line
takes it (Adam here). Synthetic tokens: each next token is the token plus one."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

VOCAB = 50


class RNNModel(nn.Module):
    def __init__(self, ntoken: int = VOCAB, ninp: int = 32, nhid: int = 32) -> None:
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, num_layers=2, batch_first=True)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        output, _ = self.rnn(self.encoder(tokens))
        return self.decoder(output)


def train(lr: float = 3e-3, steps: int = 200) -> str:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(RNNModel())
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for step in range(steps):
        g = torch.Generator().manual_seed(step * 10 + rank)
        tokens = torch.randint(0, VOCAB, (8, 24), generator=g)
        optimizer.zero_grad()
        logits = model(tokens)
        loss = nn.functional.cross_entropy(
            logits.reshape(-1, VOCAB), ((tokens + 1) % VOCAB).reshape(-1)
        )
        loss.backward()
        optimizer.step()
    checksum = sum(p.double().sum().item() for p in model.parameters())
    dist.destroy_process_group()
    return f"result{os.environ.get('RANK', '0')} {loss.item()!r} {checksum!r}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=3e-3)
    print(train(parser.parse_args().lr))
