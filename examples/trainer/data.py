"""A tiny dataset made on the spot: character-level sums such as `317+45=362;`.

The corpus is fixed (its own seed); the training seed only decides the order of the
samples. Iteration `i` always trains on the same global batch, whatever the plan: each
rank and gradient-accumulation step takes its own slice of it, so changing DP or GA
between two runs changes how the batch is split, never what it holds.
"""

from __future__ import annotations

import numpy as np
import torch

ALPHABET = "0123456789+=; "
CORPUS_SEED = 20250301


def _text(n_chars: int, rng: np.random.Generator) -> str:
    parts: list[str] = []
    size = 0
    while size < n_chars:
        a, b = (int(x) for x in rng.integers(0, 1000, size=2))
        part = f"{a}+{b}={a + b};"
        parts.append(part)
        size += len(part)
    return "".join(parts)


class SumsDataset:
    """`n_train` training and `n_eval` held-out sequences of `seq_len + 1` characters."""

    def __init__(self, seq_len: int = 32, n_train: int = 4096, n_eval: int = 256) -> None:
        rng = np.random.default_rng(CORPUS_SEED)
        stoi = {c: i for i, c in enumerate(ALPHABET)}
        text = _text((n_train + n_eval) * (seq_len + 1), rng)
        ids = np.fromiter((stoi[c] for c in text), dtype=np.int64, count=(n_train + n_eval) * (seq_len + 1))
        seqs = torch.from_numpy(ids.reshape(n_train + n_eval, seq_len + 1))
        self.seq_len = seq_len
        self.vocab_size = len(ALPHABET)
        self.train, self.eval = seqs[:n_train], seqs[n_train:]
        self._perms: dict[tuple[int, int], np.ndarray] = {}

    def batch_indices(self, iteration: int, global_batch: int, seed: int) -> np.ndarray:
        """The training samples of one iteration's global batch (epochs reshuffled by `seed`)."""
        n = len(self.train)
        start = iteration * global_batch
        out = np.empty(global_batch, dtype=np.int64)
        for k in range(global_batch):
            epoch, pos = divmod(start + k, n)
            out[k] = self._perm(seed, epoch)[pos]
        return out

    def _perm(self, seed: int, epoch: int) -> np.ndarray:
        key = (seed, epoch)
        if key not in self._perms:
            self._perms.clear()
            self._perms[key] = np.random.default_rng([seed, epoch]).permutation(len(self.train))
        return self._perms[key]

    def micro_batch(self, iteration: int, global_batch: int, seed: int, dp_rank: int, dp: int, ga_step: int,
                    ga_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of one rank's micro-batch within the iteration's global batch."""
        micro = global_batch // (dp * ga_steps)
        idx = self.batch_indices(iteration, global_batch, seed)
        part = idx[(ga_step * dp + dp_rank) * micro:(ga_step * dp + dp_rank + 1) * micro]
        seqs = self.train[torch.from_numpy(part)]
        return seqs[:, :-1], seqs[:, 1:]

    def eval_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.eval[:, :-1], self.eval[:, 1:]
