# ruff: noqa  (written as its public original is, not to this project's style)
"""A small ViT trained on CIFAR-10-shaped images as people write one for their GPU box:
``device = "cuda"`` hard-coded, ``.to(device)``, ``pin_memory=True``, ``nn.TransformerEncoder``
(batch-first, norm-first) over patch embeddings, a class token, ``torch.autocast("cuda",
dtype=torch.bfloat16)`` around the forward and the loss, AdamW, a cosine schedule, label
smoothing, gradient clipping, ``--batch-size``/``--epochs``. The images are random, CIFAR-10's
shape (the download is not made)."""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser(description="ViT on CIFAR-10")
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--epochs", type=int, default=50)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--weight-decay", type=float, default=0.05)
parser.add_argument("--dim", type=int, default=128)
parser.add_argument("--depth", type=int, default=3)
parser.add_argument("--heads", type=int, default=4)
parser.add_argument("--patch", type=int, default=4)
args = parser.parse_args()

device = "cuda"
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True


class ViT(nn.Module):
    def __init__(self, image_size=32, patch=4, dim=128, depth=3, heads=4, num_classes=10):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
        n = (image_size // patch) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=4 * dim, dropout=0.1,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1) + self.pos_embed
        x = self.encoder(x)
        return self.head(self.norm(x[:, 0]))


train_set = TensorDataset(torch.randn(512, 3, 32, 32), torch.randint(0, 10, (512,)))
train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, drop_last=True,
                          pin_memory=True)

model = ViT(patch=args.patch, dim=args.dim, depth=args.depth, heads=args.heads).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer,
                                                       T_max=args.epochs * len(train_loader))

for epoch in range(args.epochs):
    model.train()
    t0 = time.time()
    for step, (images, labels) in enumerate(train_loader):
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(images)
            loss = F.cross_entropy(logits, labels, label_smoothing=0.1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
    torch.cuda.synchronize()
    print(f"epoch {epoch} loss {loss.item():.4f} {time.time() - t0:.1f}s "
          f"{torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")
