"""A character-level GPT trained with an accelerate loop, on CPU in seconds.

The loop is the one accelerate's documentation writes: build the model, optimizer and data,
``accelerator.prepare`` them, and for each batch ``accelerator.backward(loss)``. launch runs it
unmodified up to ``prepare`` and the first ``backward``, and traces that model, optimizer, batch
and loss:

    launch plan train.py --json
"""

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, Dataset

HERE = Path(__file__).resolve().parent


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), 1)
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, block: int, dim: int = 64, heads: int = 4, layers: int = 2):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(block, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class Chars(Dataset):
    def __init__(self, text: str, block: int) -> None:
        self.stoi = {c: i for i, c in enumerate(sorted(set(text)))}
        self.data = torch.tensor([self.stoi[c] for c in text], dtype=torch.long)
        self.block = block

    def __len__(self) -> int:
        return len(self.data) - self.block - 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.data[i:i + self.block + 1]
        return chunk[:-1], chunk[1:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    accelerator = Accelerator()
    data = Chars((HERE / "input.txt").read_text(encoding="utf-8"), args.block_size)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    model = TinyGPT(len(data.stoi), args.block_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    model.train()
    for step, (x, y) in enumerate(loader):
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if step % 5 == 0:
            accelerator.print(f"step {step}: loss {loss.item():.3f}")
        if step + 1 == args.steps:
            break


if __name__ == "__main__":
    main()
