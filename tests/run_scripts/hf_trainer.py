"""The Hugging Face Trainer on a tiny GPT-2 built from a config (no hub)."""

import os
import sys
import tempfile

import torch
import transformers

VOCAB, LENGTH = 64, 16


def train(steps: int = 6) -> str:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1,
        n_embd=16,
        n_head=2,
        vocab_size=VOCAB,
        n_positions=LENGTH,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config)
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(32):
        ids = torch.randint(0, VOCAB, (LENGTH,), generator=g)
        rows.append({"input_ids": ids, "labels": ids})
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=os.path.join(out, "run"),
            max_steps=steps,
            per_device_train_batch_size=4,
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
    print(train(*map(int, sys.argv[1:])))
