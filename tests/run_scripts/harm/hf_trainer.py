"""Way 4: the Hugging Face ``Trainer`` with ``callbacks=[TraintopCallback()]`` (none with
``HARM_BARE=1``, and ``probes`` never imported) on a tiny BERT built from a config (no
hub), dropout on; an evaluation each epoch, the Trainer's own checkpoints
(``save_strategy="steps"``), ``save_model`` and ``save_state``, a resume from its
checkpoint, and, from a callback of the user's while the probe is open (after the first
evaluation): ``torch.save(model)``, ``pickle.dumps(model)``, ``copy.deepcopy(model)`` as
an EMA updated each step after, the state dict's keys and values.

``python hf_trainer.py OUT`` (run with OUT as the working directory's neighbour; the
Trainer's folders are relative, so the two runs save the same paths) writes
``OUT/summary.json``."""

import copy
import os
import sys
import traceback
from typing import Any

import common
import torch
import transformers

VOCAB, LENGTH, LABELS = 64, 8, 3


def rows(count: int, seed: int) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        {
            "input_ids": torch.randint(0, VOCAB, (LENGTH,), generator=generator),
            "labels": torch.randint(0, LABELS, (), generator=generator),
        }
        for _ in range(count)
    ]


def tiny_bert() -> Any:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=LENGTH,
        num_labels=LABELS,
        hidden_dropout_prob=0.2,
        attention_probs_dropout_prob=0.1,
    )
    return transformers.BertForSequenceClassification(config)


class RecordingTrainer(transformers.Trainer):
    """Each training step's loss, exactly (the Trainer's logs round it)."""

    def __init__(self, *args: Any, losses: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.losses = losses

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.losses.append(common.hx(loss.detach().item()))
        return loss


class UserActions(transformers.TrainerCallback):
    """What a user's callback does with the model mid-run, each action recorded."""

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

    def on_evaluate(
        self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any
    ) -> None:
        if state.epoch is None or round(state.epoch) != 1 or self.ema is not None:
            return
        self._do("save_whole", lambda r: self.do_save_whole(r, model))
        self._do("pickle", lambda r: self.do_pickle(r, model))
        self._do("deepcopy_ema", lambda r: self.do_deepcopy(r, model))
        self._do("state_dict", lambda r: self.do_state_dict(r, model))

    def do_save_whole(self, result: dict[str, Any], model: Any) -> None:
        common.record_save_whole(result, model, os.path.join(self.out, "save_whole.pt"))

    def do_pickle(self, result: dict[str, Any], model: Any) -> None:
        common.record_pickle(result, model)

    def do_deepcopy(self, result: dict[str, Any], model: Any) -> None:
        self.ema = copy.deepcopy(model)
        self.ema.requires_grad_(False)
        result.update(copy=common.tensors_sha(self.ema), copy_hooks=common.hook_counts(self.ema))
        self.model = model

    def do_state_dict(self, result: dict[str, Any], model: Any) -> None:
        state = model.state_dict()
        result.update(keys=list(state), values=common.tensors_sha(state))

    def on_step_end(
        self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any
    ) -> None:
        if self.ema is None:
            return
        with torch.no_grad():
            for e, p in zip(self.ema.parameters(), model.parameters(), strict=True):
                e.mul_(0.9).add_(p, alpha=0.1)


def trainer(summary: dict[str, Any], out: str, losses: list[str], model: Any) -> Any:
    args = transformers.TrainingArguments(
        output_dir="hf_run",  # relative: the same in both runs' files
        num_train_epochs=2,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        eval_strategy="epoch",
        save_strategy="steps",
        save_steps=4,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        logging_strategy="no",
        seed=0,
        data_seed=0,
        full_determinism=True,
    )
    callbacks: list[Any] = [UserActions(summary, out)]
    if not os.environ.get("HARM_BARE"):
        from probes.hf import TraintopCallback

        callbacks.insert(0, TraintopCallback(sample_every=3))
    return RecordingTrainer(
        model=model,
        args=args,
        train_dataset=rows(16, 1),
        eval_dataset=rows(8, 2),
        callbacks=callbacks,
        losses=losses,
    )


def main() -> None:
    out = os.path.abspath(sys.argv[1])
    os.makedirs(out, exist_ok=True)
    os.chdir(out)
    with common.summary_file(out) as summary:
        common.setup_determinism()
        losses: list[str] = []
        model = tiny_bert()
        run = trainer(summary, out, losses, model)
        train: dict[str, Any] = summary.setdefault("train", {})
        try:
            result = run.train()
            train["training_loss"] = common.hx(result.training_loss)
            train["eval"] = common.without_timings(
                [row for row in run.state.log_history if "eval_loss" in row]
            )
        except Exception as error:  # the cell names it
            train["error"] = common.first_line(error)
            train["traceback"] = traceback.format_exc()
        train["losses"] = losses
        train["weights"] = common.tensors_sha(model)
        [actions] = [c for c in run.callback_handler.callbacks if isinstance(c, UserActions)]
        if actions.ema is not None:
            summary["deepcopy_ema"]["ema"] = common.tensors_sha(actions.ema)
        saved: dict[str, Any] = summary.setdefault("save_model", {})
        try:
            run.save_model("hf_saved")
            run.save_state()  # trainer_state.json in hf_run
        except Exception as error:  # the cell names it
            saved["error"] = common.first_line(error)
        saved["files"] = common.files_summary("hf_saved")
        summary["checkpoints"] = {"files": common.files_summary("hf_run")}

        resumed: dict[str, Any] = summary.setdefault("checkpoint_resume", {})
        resumed_losses: list[str] = []
        fresh = tiny_bert()
        again = trainer({}, out, resumed_losses, fresh)
        try:
            again.train(resume_from_checkpoint="hf_run/checkpoint-4")
        except Exception as error:  # the cell names it
            resumed["error"] = common.first_line(error)
            resumed["traceback"] = traceback.format_exc()
        resumed["losses"] = resumed_losses
        resumed["weights"] = common.tensors_sha(fresh)
        resumed["same_as_uninterrupted"] = resumed_losses == losses[4:]


if __name__ == "__main__":
    main()
