"""What traintop leaves on a watched module does not travel with it (module_hooks.py):
pickle, ``torch.save`` and ``copy.deepcopy`` give what an unwatched twin gives."""

from __future__ import annotations

import copy
import io
import pickle
import subprocess
import sys

import torch
from torch import nn

import probes
from probes.runtime.patches import module_hooks


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.ReLU(), nn.Linear(8, 2))


def _train_with_an_evaluation_left_open(model: nn.Module, steps: int = 25) -> None:
    """Train, then evaluate last: a found evaluation stays open (its hooks on every
    layer) until the next training forward, which never comes."""
    torch.manual_seed(2)  # (dropout's draws: the same in both twins)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(8, 4, generator=generator), torch.randint(0, 2, (8,))
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    with torch.no_grad():
        nn.functional.cross_entropy(model(torch.randn(8, 4)), torch.zeros(8).long())


def _our_hooks(model: nn.Module) -> int:
    return sum(
        len(getattr(module, name))
        for module in model.modules()
        for name in ("_forward_hooks", "_forward_pre_hooks")
    )


def test_a_watched_model_pickles_saves_and_copies_as_its_unwatched_twin() -> None:
    bare, watched = _model(), _model()
    probe = probes.watch(watched, run="pickled")
    try:
        _train_with_an_evaluation_left_open(watched)
        _train_with_an_evaluation_left_open(bare)
        assert module_hooks.noted() > 0 and _our_hooks(watched) > 0  # hooks are on it
        assert _our_hooks(bare) == 0
        # (pickle names a tensor's storage by its address: compare what comes back)
        pickled = pickle.dumps(watched)
        assert b"probes" not in pickled
        unpickled = pickle.loads(pickled)
        assert _our_hooks(unpickled) == 0
        assert len(pickled) == len(pickle.dumps(bare))
        saved_watched, saved_bare = io.BytesIO(), io.BytesIO()
        torch.save(watched, saved_watched)
        torch.save(bare, saved_bare)
        assert saved_watched.getvalue() == saved_bare.getvalue()
        twin = copy.deepcopy(watched)
        assert _our_hooks(twin) == 0  # an EMA copy carries nothing of traintop's
        assert twin.state_dict().keys() == bare.state_dict().keys()
        assert all(torch.equal(twin.state_dict()[k], v) for k, v in bare.state_dict().items())
    finally:
        probe.close()
    assert module_hooks.noted() == 0 and _our_hooks(watched) == 0


def test_a_file_saved_while_watched_loads_where_traintop_is_not_installed(tmp_path) -> None:
    model = _model()
    probe = probes.watch(model, run="saved")
    try:
        _train_with_an_evaluation_left_open(model, steps=3)
        path = tmp_path / "model.pt"
        torch.save(model, path)
    finally:
        probe.close()
    loading = (
        "import sys; sys.modules['probes'] = None\n"  # no traintop to import
        "import torch\n"
        f"model = torch.load({str(path)!r}, weights_only=False)\n"
        "print(type(model).__name__, len(model))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", loading], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["Sequential", "4"]


def test_a_watched_model_scripts_and_keeps_its_hooks() -> None:
    """``torch.jit.script`` compiles a module's hooks: traintop's (Python objects) made it
    fail with a TypeError. They are taken off for the call and put back in place."""
    model = _model()
    probe = probes.watch(model, run="scripted")
    try:
        _train_with_an_evaluation_left_open(model, steps=3)
        before = [list(m._forward_pre_hooks.items()) for m in model.modules()]
        assert any(before)
        scripted = torch.jit.script(model)
        assert [list(m._forward_pre_hooks.items()) for m in model.modules()] == before
        x = torch.randn(5, 4)
        model.eval()
        assert torch.equal(scripted(x), model(x))
    finally:
        probe.close()


class _LanguageModel(nn.Module):
    """word_language_model's shape: ``nn.LSTM`` writes its own ``__getstate__``."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Embedding(20, 8)
        self.rnn = nn.LSTM(8, 8, 2, dropout=0.2)
        self.decoder = nn.Linear(8, 20)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.rnn(self.encoder(tokens))[0])


def test_an_lstm_whose_class_writes_its_own_getstate_pickles_without_our_hooks() -> None:
    """Before (and with a filter on ``nn.Module.__getstate__`` alone): ``torch.save`` of
    an LSTM model after an evaluation died on ``EvalScope._counter.<locals>.count``."""
    torch.manual_seed(0)
    model = _LanguageModel()
    optimizer = torch.optim.AdamW(model.parameters())
    tokens = torch.randint(0, 20, (12, 2))
    probe = probes.watch(model, optimizer, run="lstm")
    try:
        for _ in range(3):
            loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        with torch.no_grad():
            model(tokens)  # the evaluation stays open: hooks on the LSTM
        assert len(model.rnn._forward_pre_hooks) > 0
        saved = io.BytesIO()
        torch.save(model, saved)
        assert b"probes" not in saved.getvalue()
        twin = copy.deepcopy(model)
        assert _our_hooks(twin) == 0 and _our_hooks(pickle.loads(pickle.dumps(model))) == 0
    finally:
        probe.close()
