"""``traintop run`` adds its callback to a Hugging Face ``Trainer`` whose script passes
``callbacks`` by position (a positional parameter there: the 9th after ``self`` in
transformers 4.41, the 10th in 5.x), not only by keyword; the script's own callbacks
are kept. (Lightning's ``Trainer`` takes ``callbacks`` by
keyword only.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest

from tests.collector import Frame, raised_alerts
from tests.e2e.test_run import steps

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The Trainer's arguments by position, up to its ``callbacks`` (each one in between is
# left at its default, None), as a script written for the installed transformers has.
SCRIPT = '''
import inspect
import os
import sys
import tempfile

import torch
import transformers

VOCAB, LENGTH = 64, 16


class CountSteps(transformers.TrainerCallback):
    """The script's own callback: it must still run beside traintop's."""

    def __init__(self):
        self.steps = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1


def train(steps=6):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB, n_positions=LENGTH,
        bos_token_id=0, eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config)
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(32):
        ids = torch.randint(0, VOCAB, (LENGTH,), generator=g)
        rows.append({"input_ids": ids, "labels": ids})
    counter = CountSteps()
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=os.path.join(out, "run"), max_steps=steps,
            per_device_train_batch_size=4, report_to="none", save_strategy="no",
            use_cpu=True, disable_tqdm=True, logging_strategy="no", seed=0,
        )
        names = list(inspect.signature(transformers.Trainer.__init__).parameters)[1:]
        given = [model, args, None, rows]  # model, args, data_collator, train_dataset
        given += [None] * (names.index("callbacks") - len(given))
        trainer = transformers.Trainer(*given, [counter])  # callbacks, by position
        result = trainer.train()
    checksum = sum(p.double().sum().item() for p in model.parameters())
    print(f"result {result.training_loss!r} {checksum!r} steps {counter.steps}")


if __name__ == "__main__":
    train()
'''


def traintop_run(tmp_path: Any) -> tuple[subprocess.CompletedProcess[str], list[Frame]]:
    """The script under ``traintop run --headless --record LOG``: the process and the
    frames the monitor received."""
    script = os.path.join(tmp_path, "positional_callbacks.py")
    with open(script, "w", encoding="utf-8") as handle:
        handle.write(SCRIPT)
    log = os.path.join(tmp_path, "positional_callbacks.ndjson")
    command = [sys.executable, "-m", "tui.cli", "run", "--headless", "--record", log]
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [*command, sys.executable, script], env=env, capture_output=True, text=True, timeout=300
    )
    frames = []
    if os.path.exists(log):
        with open(log, encoding="utf-8") as handle:
            frames = [json.loads(line) for line in handle if line.strip()]
    return done, frames


@pytest.mark.slow  # the HF Trainer's import in a child: about 10 s (-m slow)
def test_a_trainer_given_its_callbacks_by_position_gets_traintops_too(tmp_path: Any) -> None:
    done, frames = traintop_run(tmp_path)
    assert "multiple values for argument 'callbacks'" not in done.stderr
    assert done.returncode == 0, done.stderr
    assert "traintop: no callback added" not in done.stderr
    # The script's own callback ran at each of the 6 updates (its line: the result
    # lines of tests/e2e/test_run.py, that test the same training bit for bit).
    assert re.findall(r"result \S+ \S+ steps (\d+)", done.stdout) == ["6"], done.stdout
    # traintop's callback watched: inside train() nothing else attaches (the Trainer's
    # optimizer is the callback's), so this one run is the callback's.
    assert [f["kind"] for f in frames].count("hello") == 1
    assert steps(frames) == list(range(6))
    assert [alert.line() for alert in raised_alerts(frames)] == []
