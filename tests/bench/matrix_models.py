"""The matrix's models, each in the style of a widely used public training script,
at tiny sizes on the synthetic data of ``diagnosis_models``.

- ``GPT``: karpathy/nanoGPT's ``model.py`` (tied ``wte``/``lm_head``, its own
  ``LayerNorm`` class calling ``F.layer_norm``, ``c_attn``/``c_fc``/``c_proj`` names).
- ``WordLM``: pytorch/examples ``word_language_model`` (``RNNModel``: ``encoder``,
  ``nn.LSTM`` with dropout, ``decoder``, optional tied weights; trained by hand).
- ``MnistNet``: pytorch/examples ``mnist`` (``conv1``, ``conv2``, ``dropout1``,
  ``dropout2``, ``fc1``, ``fc2``, log-softmax and NLL, Adadelta with StepLR).
- ``SequenceLSTM``: pytorch/examples ``time_sequence_prediction`` (two ``LSTMCell``s
  and a linear head, LBFGS with a closure).
- ``EncoderClassifier``: an ``nn.TransformerEncoder`` over tokens, mean-pooled.
- ``ResidualStack``: a deep residual MLP (a forward overflow under fp16 autocast).

Each bug that lives in a model (a masked op whose backward is not finite, a functional
dropout that stays on in evaluation, one badly initialised block) is a constructor
argument, so the healthy twin is the same model with the one fix.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def masked_sqrt(x: torch.Tensor, *, safe: bool) -> torch.Tensor:
    """sqrt where x > 0, else 0: finite forward, but ``torch.where``'s backward multiplies
    the sqrt's NaN derivative at negative inputs by 0, which is NaN (pytorch/pytorch#68425
    and the many 'NaN gradient with torch.where' threads). ``safe`` clamps the input first,
    the documented fix."""
    inner = x.clamp(min=1e-6) if safe else x
    return torch.where(x > 0, inner.sqrt(), torch.zeros_like(x))


# --- nanoGPT --------------------------------------------------------------------------


class LayerNorm(nn.Module):
    """nanoGPT's LayerNorm with an optional bias (not ``nn.LayerNorm``)."""

    def __init__(self, ndim: int, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.resid_dropout = nn.Dropout(dropout)
        self.heads, self.dropout = heads, dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c)))


class MLP(nn.Module):
    def __init__(self, dim: int, dropout: float, masked: bool | None) -> None:
        super().__init__()
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.c_proj = nn.Linear(4 * dim, dim)
        self.dropout = nn.Dropout(dropout)
        self.masked = masked  # None: GELU; False/True: masked sqrt (True: the NaN one)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)
        h = F.gelu(h) if self.masked is None else masked_sqrt(h, safe=not self.masked)
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float, masked: bool | None) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, dropout)
        self.ln_2 = LayerNorm(dim)
        self.mlp = MLP(dim, dropout, masked)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A two-block nanoGPT. ``masked_block``/``nan_backward``: that block's MLP uses a
    masked sqrt (NaN in backward when ``nan_backward``, its safe form otherwise)."""

    def __init__(
        self,
        vocab: int = 16,
        block_size: int = 12,
        layers: int = 2,
        heads: int = 2,
        dim: int = 32,
        dropout: float = 0.0,
        masked_block: int | None = None,
        nan_backward: bool = False,
    ) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(vocab, dim),
                "wpe": nn.Embedding(block_size, dim),
                "drop": nn.Dropout(dropout),
                "h": nn.ModuleList(
                    Block(dim, heads, dropout, nan_backward if i == masked_block else None)
                    for i in range(layers)
                ),
                "ln_f": LayerNorm(dim),
            }
        )
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.transformer["wte"].weight = self.lm_head.weight  # weight tying, as nanoGPT
        self.apply(self._init_weights)
        for name, param in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        parts = self.transformer
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = parts["drop"](parts["wte"](idx) + parts["wpe"](pos))
        blocks: nn.ModuleList = parts["h"]  # type: ignore[assignment]
        for block in blocks:
            x = block(x)
        return self.lm_head(parts["ln_f"](x))


# --- pytorch/examples -----------------------------------------------------------------


class WordLM(nn.Module):
    """word_language_model's RNNModel (LSTM), batch first, no carried hidden state.
    ``dropout`` is the example's (on the embedding, the LSTM's output, between LSTM
    layers); ``rnn_dropout_only`` keeps only nn.LSTM's own ``dropout``; ``masked``:
    a masked sqrt on the LSTM's output (True: NaN in backward)."""

    def __init__(
        self,
        vocab: int = 16,
        dim: int = 32,
        layers: int = 2,
        dropout: float = 0.2,
        tie_weights: bool = False,
        rnn_dropout_only: bool = False,
        masked: bool | None = None,
    ) -> None:
        super().__init__()
        self.drop: nn.Module = nn.Identity() if rnn_dropout_only else nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, dim, layers, dropout=dropout, batch_first=True)
        self.decoder = nn.Linear(dim, vocab)
        if tie_weights:
            self.decoder.weight = self.encoder.weight
        self.masked = masked
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        output, _ = self.rnn(self.drop(self.encoder(tokens)))
        if self.masked is not None:
            output = masked_sqrt(output, safe=not self.masked)
        return self.decoder(self.drop(output))


class MnistNet(nn.Module):
    """The mnist example's Net on 12x12 images: log-probabilities out (NLL loss).
    ``masked``: a masked sqrt after fc1 instead of its ReLU (True: NaN in backward)."""

    def __init__(self, classes: int = 4, masked: bool | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(16 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, classes)
        self.masked = masked

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = self.fc1(torch.flatten(self.dropout1(x), 1))
        x = F.relu(x) if self.masked is None else masked_sqrt(x, safe=not self.masked)
        return F.log_softmax(self.fc2(self.dropout2(x)), dim=1)


class SequenceLSTM(nn.Module):
    """time_sequence_prediction's Sequence: two LSTMCells over the series, a linear head
    per time step (float32 here). ``dropout`` between the cells is not the example's
    (it has none): it makes evaluation mode matter."""

    def __init__(self, hidden: int = 16, dropout: float = 0.0) -> None:
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, hidden)
        self.lstm2 = nn.LSTMCell(hidden, hidden)
        self.drop = nn.Dropout(dropout) if dropout else None
        self.linear = nn.Linear(hidden, 1)
        self.hidden = hidden

    def forward(self, series: torch.Tensor) -> torch.Tensor:
        b = series.shape[0]
        h1 = c1 = h2 = c2 = series.new_zeros(b, self.hidden)
        outputs = []
        for x in series.split(1, dim=1):
            h1, c1 = self.lstm1(x, (h1, c1))
            h2, c2 = self.lstm2(self.drop(h1) if self.drop else h1, (h2, c2))
            outputs.append(self.linear(h2))
        return torch.cat(outputs, dim=1)


class EncoderClassifier(nn.Module):
    """Token embedding, a two-layer ``nn.TransformerEncoder`` (dropout 0.1), mean
    pooling and a linear head. ``functional_dropout``: ``F.dropout(h, 0.3)`` before
    the head, whose ``training`` defaults to True (on in evaluation too); its twin
    passes ``training=self.training``."""

    def __init__(
        self, vocab: int = 16, dim: int = 32, classes: int = 4, functional_dropout: bool = False
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, 2, 64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)
        self.functional_dropout = functional_dropout

    def backbone(self) -> list[nn.Parameter]:
        return [*self.embed.parameters(), *self.encoder.parameters()]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(tokens)).mean(dim=1)
        if self.functional_dropout:
            h = F.dropout(h, 0.3)  # the bug: training=True whatever the mode
        else:
            h = F.dropout(h, 0.3, training=self.training)
        return self.head(h)


class ResidualStack(nn.Module):
    """x + relu(block(x)) over ``depth`` linear blocks. ``hot_block``: that block's
    weights are initialised 1e5 times too large, so under fp16 autocast its output
    is past 65,504 (inf) at the first step while float32 would hold it."""

    def __init__(self, depth: int = 8, dim: int = 16, hot_block: int | None = None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))
        self.head = nn.Linear(dim, 1)
        if hot_block is not None:
            with torch.no_grad():
                hot: nn.Linear = self.blocks[hot_block]  # type: ignore[assignment]
                hot.weight.mul_(1e5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + F.relu(block(x))
        return self.head(x)
