"""The example trainer: a small GPT-style model on a synthetic dataset, run by DeepSpeed under torchrun."""
