"""tinygpt: a `launch` recipe that trains a small GPT on a few of Shakespeare's sonnets.

A recipe says *what* to train; `launch` owns *how* (the training loop, the strategy, precision,
gradient accumulation, checkpoints, memory reports). It is a module with these functions:

    build_model()                        required: the model, on the CPU (launch moves it)
    example_batch(batch_size)            required: a random micro-batch; launch traces it to
                                         estimate memory, and trains on it if there is no loader
    training_step(model, batch)          required: forward pass and loss of one micro-batch
    build_dataloader(batch_size, rank, world_size)   optional: real data, this rank's share
    build_optimizer(params)              optional: default AdamW with the plan's learning rate
    wrap_modules()                       optional: the block classes to checkpoint or shard
    LAUNCH = {...}                       optional: defaults for the run; CLI flags override them

Try it: `launch examples/tinygpt/train.py` (runs with torchrun on this machine, CPU is fine).
The model is nanoGPT's, shrunk: 2 layers, 4 heads, 64-dim embeddings, byte-level vocabulary of
256, 64-token context; 30 steps of 16 sequences take seconds on two CPU cores and the loss falls
from ln(256) ~ 5.5 to about 3.3.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

LAUNCH = {"global_batch_size": 16, "steps": 30, "lr": 1e-3, "seq_len": 64}

# launch passes the plan to the recipe's process as LAUNCH_* variables too; the sequence length
# is needed before any function is called, to size the position embedding.
SEQ_LEN = int(os.environ.get("LAUNCH_SEQ_LEN", LAUNCH["seq_len"]))
TEXT = Path(__file__).with_name("input.txt").read_bytes()  # public-domain sonnets


@dataclass(frozen=True)
class GPTConfig:
    block_size: int = SEQ_LEN
    vocab_size: int = 256  # bytes: no tokenizer to ship
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        # SDPA never materializes the T x T attention matrix where a fused kernel exists.
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    """One transformer layer: the unit launch checkpoints (recomputes) or shards."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as in GPT-2
        self.apply(self._init_weights)
        # GPT-2's scaled init of the residual projections keeps the residual stream's variance
        # from growing with depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def build_model() -> nn.Module:
    return GPT(GPTConfig())


def example_batch(batch_size: int) -> dict[str, torch.Tensor]:
    """Random tokens of the real shape: enough to trace memory (launch seeds the generator)."""
    idx = torch.randint(0, GPTConfig.vocab_size, (batch_size, SEQ_LEN))
    targets = torch.randint(0, GPTConfig.vocab_size, (batch_size, SEQ_LEN))
    return {"idx": idx, "targets": targets}


def training_step(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(batch["idx"])
    return F.cross_entropy(logits.flatten(0, 1).float(), batch["targets"].flatten())


def wrap_modules() -> tuple[type, ...]:
    return (Block,)


class TextWindows:
    """Every 64-byte window of the text once per epoch, in a shuffled order, split over ranks.

    The order comes from torch's global random state, which launch seeds at the start of every
    epoch, so a resumed run sees the same order. Iterating again starts a new epoch.
    """

    def __init__(self, batch_size: int, rank: int, world_size: int) -> None:
        self.data = torch.tensor(list(TEXT), dtype=torch.long)
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        starts = torch.randperm(len(self.data) - SEQ_LEN - 1)[self.rank :: self.world_size]
        for i in range(0, len(starts) - self.batch_size + 1, self.batch_size):
            window = starts[i : i + self.batch_size, None] + torch.arange(SEQ_LEN + 1)
            tokens = self.data[window]
            yield {"idx": tokens[:, :-1], "targets": tokens[:, 1:]}


def build_dataloader(batch_size: int, rank: int, world_size: int) -> TextWindows:
    return TextWindows(batch_size, rank, world_size)
