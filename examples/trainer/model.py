"""A small GPT-style decoder (pre-norm blocks, causal attention), sized to train on a CPU.

No dropout: two runs that see the same batches in the same order compute the same
gradients, whatever their data-parallel size or gradient-accumulation split.

The attention's query, key and value projections are separate layers, so tensor parallelism can
split each of them by heads (`parallel.py`: torch's ColwiseParallel on `q`, `k`, `v` and the MLP's
first layer, RowwiseParallel on `proj` and its second); a block takes its head count from the
width of what its projections return, so the same code runs whole or split. `Stage` runs a
contiguous range of blocks (with the embeddings on the first stage, the final norm and the output
layer on the last) for pipeline parallelism; its parameters keep the whole model's names.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    seq_len: int = 32
    hidden: int = 64
    layers: int = 2
    heads: int = 4


SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden": 64, "layers": 2, "heads": 4},
    "small": {"hidden": 128, "layers": 4, "heads": 4},
    "medium": {"hidden": 256, "layers": 6, "heads": 8},
}
"""Model sizes the trainer offers (--size); every model type of a job runs as one of them."""


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.head_dim = cfg.hidden // cfg.heads
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.q = nn.Linear(cfg.hidden, cfg.hidden)
        self.k = nn.Linear(cfg.hidden, cfg.hidden)
        self.v = nn.Linear(cfg.hidden, cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden, 4 * cfg.hidden), nn.GELU(), nn.Linear(4 * cfg.hidden, cfg.hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        y = self.ln1(x)
        # heads from the projections' width: all of them, or this rank's under tensor parallelism
        q, k, v = (z.view(b, t, -1, self.head_dim).transpose(1, 2) for z in (self.q(y), self.k(y), self.v(y)))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, -1))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, cfg: GPTConfig, gradient_checkpointing: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        self.gradient_checkpointing = gradient_checkpointing
        self.tok = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.pos = nn.Embedding(cfg.seq_len, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of a batch."""
        return loss_of(self.run(tokens, 0, len(self.blocks), first=True, last=True), targets)

    def run(self, x: torch.Tensor, lo: int, hi: int, *, first: bool, last: bool) -> torch.Tensor:
        """Blocks `lo`..`hi - 1`; from tokens when `first` (embeddings), to logits when `last`."""
        if first:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks[lo:hi]:
            if self.gradient_checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(self.ln(x)) if last else x


def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def stage_blocks(layers: int, stages: int, stage: int) -> tuple[int, int]:
    """The blocks of pipeline stage `stage` of `stages`: an equal, contiguous share (`stages` divides `layers`)."""
    if stages < 1 or layers % stages:
        raise ValueError(f"{stages} pipeline stages do not divide the model's {layers} layers")
    per = layers // stages
    return stage * per, (stage + 1) * per


class Stage(nn.Module):
    """One pipeline stage of a model: `forward(x)` takes tokens (first stage) or hidden states and returns
    hidden states or logits (last stage). The whole model is its `model`: parameters outside the stage are
    not part of it (`parameters()` lists the stage's own, under the whole model's names)."""

    def __init__(self, model: TinyGPT, stage: int, stages: int) -> None:
        super().__init__()
        self.lo, self.hi = stage_blocks(len(model.blocks), stages, stage)
        self.first, self.last = stage == 0, stage == stages - 1
        self._model = [model]  # not a submodule: only the stage's parts are registered below
        if self.first:
            self.tok, self.pos = model.tok, model.pos
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in range(self.lo, self.hi)})
        if self.last:
            self.ln, self.head = model.ln, model.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._model[0].run(x, self.lo, self.hi, first=self.first, last=self.last)


def build_model(size: str, vocab_size: int, seq_len: int, seed: int, gradient_checkpointing: bool) -> TinyGPT:
    torch.manual_seed(seed)
    return TinyGPT(GPTConfig(vocab_size=vocab_size, seq_len=seq_len, **SIZES[size]), gradient_checkpointing)
