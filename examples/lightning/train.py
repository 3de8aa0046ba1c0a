"""A character-level language model trained with Lightning, on CPU in seconds.

Written the way Lightning's documentation writes it: a LightningModule with ``training_step``
and ``configure_optimizers``, a LightningDataModule, and ``Trainer(...).fit(model, datamodule)``.
launch runs it unmodified up to ``Trainer.fit`` and traces that module's own training step:

    launch plan train.py --json
"""

import argparse
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

HERE = Path(__file__).resolve().parent


class Chars(Dataset):
    def __init__(self, data: torch.Tensor, block: int) -> None:
        self.data, self.block = data, block

    def __len__(self) -> int:
        return len(self.data) - self.block - 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.data[i:i + self.block + 1]
        return chunk[:-1], chunk[1:]


class TextData(L.LightningDataModule):
    def __init__(self, path: Path, block_size: int, batch_size: int) -> None:
        super().__init__()
        self.path, self.block_size, self.batch_size = path, block_size, batch_size
        text = path.read_text(encoding="utf-8")
        self.vocab = sorted(set(text))
        self.ids = torch.tensor([self.vocab.index(c) for c in text], dtype=torch.long)

    def setup(self, stage: str) -> None:
        self.train_set = Chars(self.ids, self.block_size)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)


class CharLM(L.LightningModule):
    """A small transformer encoder with a causal mask, trained on next-character prediction."""

    def __init__(self, vocab_size: int, block_size: int, dim: int = 64, layers: int = 2,
                 lr: float = 3e-4) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab_size, dim)
        self.pos = nn.Parameter(torch.zeros(1, block_size, dim))
        layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=4 * dim,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=layers)
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=x.device)
        h = self.encoder(self.embed(x) + self.pos[:, :t], mask=mask, is_causal=True)
        return self.head(h)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-steps", type=int, default=20)
    args = parser.parse_args()

    data = TextData(HERE / "input.txt", args.block_size, args.batch_size)
    model = CharLM(len(data.vocab), args.block_size)
    trainer = L.Trainer(max_steps=args.max_steps, accelerator="cpu", devices=1,
                        logger=False, enable_checkpointing=False, log_every_n_steps=5)
    trainer.fit(model, datamodule=data)


if __name__ == "__main__":
    main()
