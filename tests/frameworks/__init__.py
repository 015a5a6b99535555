"""The Hugging Face Trainer and Lightning glue, with the real Trainers."""
