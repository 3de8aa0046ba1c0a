"""Eight small but real architectures, as launcher recipes, for the estimator's accuracy benchmark.

Each architecture is a set of recipe hooks (``build_model``, ``example_batch``, ``training_step``,
``wrap_modules``). ``write_recipe(arch, directory, **config)`` writes a ``train.py``-style file that
imports them from here, so the estimator traces them exactly as it traces a user's script (in a
child process, by file path). Sizes are small enough for a real CPU step on a 2-core machine in a
second or two, and big enough that activations, not weights, dominate where they do in real models.

| arch        | what it exercises                                                        |
| ----------- | ------------------------------------------------------------------------ |
| mlp         | Linear + GELU + Dropout, cross-entropy                                   |
| cnn         | Conv2d + BatchNorm2d (running-stat buffers) + ReLU + pooling, residuals  |
| lstm        | nn.LSTM (2 layers), embedding, LM loss                                   |
| gpt         | GPT-2 block: LayerNorm, fused QKV, SDPA causal, GELU MLP, tied embedding |
| llama       | RMSNorm, RoPE buffers, grouped-query attention, SwiGLU, untied head      |
| vit         | patchify Conv2d, class token, learned positions, pre-norm encoder        |
| encdec      | nn.Transformer encoder-decoder (MultiheadAttention), seq2seq loss        |
| moe         | GPT with top-2 mixture-of-experts FFN routed with ``nonzero`` (dynamic)  |
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

ARCHS = ("mlp", "cnn", "lstm", "gpt", "llama", "vit", "encdec", "moe")

# ----------------------------------------------------------------------------------------------
# MLP


class MLP(nn.Module):
    def __init__(self, d_in: int = 512, hidden: int = 1024, layers: int = 4, classes: int = 100):
        super().__init__()
        blocks: list[nn.Module] = []
        d = d_in
        for _ in range(layers):
            blocks += [nn.Linear(d, hidden), nn.GELU(), nn.Dropout(0.1)]
            d = hidden
        self.body = nn.Sequential(*blocks)
        self.head = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


# ----------------------------------------------------------------------------------------------
# CNN with BatchNorm


class ConvBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.skip = (
            nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
            if stride != 1 or c_in != c_out else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.skip(x))


class CNN(nn.Module):
    def __init__(self, width: int = 32, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU())
        self.blocks = nn.Sequential(
            ConvBlock(width, width, 1), ConvBlock(width, 2 * width, 2),
            ConvBlock(2 * width, 4 * width, 2),
        )
        self.head = nn.Linear(4 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


# ----------------------------------------------------------------------------------------------
# LSTM language model


class LSTMLM(nn.Module):
    def __init__(self, vocab: int = 2000, dim: int = 256, layers: int = 2):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, dim, num_layers=layers, batch_first=True, dropout=0.1)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.emb(idx))
        return self.head(out)


# ----------------------------------------------------------------------------------------------
# GPT


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class GPTBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int = 2048, seq: int = 128, dim: int = 192, heads: int = 6,
                 layers: int = 3, block: type[nn.Module] = GPTBlock):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


# ----------------------------------------------------------------------------------------------
# Llama-style: RMSNorm, RoPE, GQA, SwiGLU


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.type_as(x)


def rope_tables(head_dim: int, seq: int, theta: float = 10000.0) -> tuple[torch.Tensor, ...]:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(seq).float(), inv)
    return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]
    t = x.shape[-2]
    c, s = cos[:t].to(x.dtype), sin[:t].to(x.dtype)
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)


class LlamaAttention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = self.heads // self.kv_heads
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class LlamaBlock(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int):
        super().__init__()
        self.attn_norm = RMSNorm(dim)
        self.attn = LlamaAttention(dim, heads, kv_heads)
        self.ffn_norm = RMSNorm(dim)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, vocab: int = 2048, seq: int = 128, dim: int = 256, heads: int = 8,
                 kv_heads: int = 2, hidden: int = 688, layers: int = 3):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(LlamaBlock(dim, heads, kv_heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.out = nn.Linear(dim, vocab, bias=False)
        cos, sin = rope_tables(dim // heads, seq)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.out(self.norm(x))


# ----------------------------------------------------------------------------------------------
# ViT


class ViTBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    def __init__(self, image: int = 64, patch: int = 8, dim: int = 192, heads: int = 6,
                 layers: int = 3, classes: int = 100):
        super().__init__()
        self.patchify = nn.Conv2d(3, dim, patch, patch)
        n = (image // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(ViTBlock(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patchify(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


# ----------------------------------------------------------------------------------------------
# Encoder-decoder


class Seq2Seq(nn.Module):
    def __init__(self, vocab: int = 2000, dim: int = 192, heads: int = 6, layers: int = 2,
                 seq: int = 64):
        super().__init__()
        self.src_emb = nn.Embedding(vocab, dim)
        self.tgt_emb = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, seq, dim) * 0.02)
        self.transformer = nn.Transformer(
            dim, heads, num_encoder_layers=layers, num_decoder_layers=layers,
            dim_feedforward=4 * dim, dropout=0.1, batch_first=True,
        )
        self.head = nn.Linear(dim, vocab)
        mask = nn.Transformer.generate_square_subsequent_mask(seq)
        self.register_buffer("causal", mask, persistent=False)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        s, t = src.shape[1], tgt.shape[1]
        h = self.transformer(
            self.src_emb(src) + self.pos[:, :s], self.tgt_emb(tgt) + self.pos[:, :t],
            tgt_mask=self.causal[:t, :t], tgt_is_causal=True,
        )
        return self.head(h)


# ----------------------------------------------------------------------------------------------
# MoE: top-2 routing with nonzero (data-dependent shapes)


class MoE(nn.Module):
    def __init__(self, dim: int, experts: int = 4, top_k: int = 2, hidden: int | None = None):
        super().__init__()
        hidden = hidden or 2 * dim
        self.top_k = top_k
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
            for _ in range(experts)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights, chosen = torch.topk(F.softmax(self.router(flat), dim=-1), self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)  # data-dependent size
            y = expert(flat[token]) * weights[token, slot].unsqueeze(-1)
            out = out.index_add(0, token, y)
        return out.reshape(shape)


class MoEBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.moe = MoE(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.moe(self.ln2(x))


# ----------------------------------------------------------------------------------------------
# Recipes


def _tokens(vocab: int, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, vocab, (batch, seq + 1))
    return idx[:, :-1].contiguous(), idx[:, 1:].contiguous()


def _lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class Recipe:
    """The hooks of one architecture, with its configuration bound."""

    def __init__(self, arch: str, **config: Any) -> None:
        if arch not in ARCHS:
            raise ValueError(f"unknown arch {arch!r} ({', '.join(ARCHS)})")
        self.arch, self.config = arch, config

    def build_model(self) -> nn.Module:
        a, c = self.arch, self.config
        if a == "mlp":
            return MLP(**c)
        if a == "cnn":
            return CNN(**c)
        if a == "lstm":
            return LSTMLM(**{k: v for k, v in c.items() if k != "seq"})
        if a == "gpt":
            return GPT(**c)
        if a == "llama":
            return Llama(**c)
        if a == "vit":
            return ViT(**c)
        if a == "encdec":
            return Seq2Seq(**c)
        return GPT(block=MoEBlock, **c)  # moe

    def example_batch(self, batch_size: int) -> Any:
        a, c = self.arch, self.config
        if a == "mlp":
            return (torch.randn(batch_size, c.get("d_in", 512)),
                    torch.randint(0, c.get("classes", 100), (batch_size,)))
        if a == "cnn":
            return (torch.randn(batch_size, 3, 32, 32),
                    torch.randint(0, c.get("classes", 10), (batch_size,)))
        if a == "lstm":
            return _tokens(c.get("vocab", 2000), batch_size, c.get("seq", 64))
        if a in ("gpt", "moe", "llama"):
            return _tokens(c.get("vocab", 2048), batch_size, c.get("seq", 128))
        if a == "vit":
            image = c.get("image", 64)
            return (torch.randn(batch_size, 3, image, image),
                    torch.randint(0, c.get("classes", 100), (batch_size,)))
        vocab, seq = c.get("vocab", 2000), c.get("seq", 64)
        src = torch.randint(0, vocab, (batch_size, seq))
        tgt_in, tgt_out = _tokens(vocab, batch_size, seq)
        return src, tgt_in, tgt_out

    def training_step(self, model: nn.Module, batch: Any) -> torch.Tensor:
        if self.arch in ("mlp", "cnn", "vit"):
            x, y = batch
            return F.cross_entropy(model(x), y)
        if self.arch == "encdec":
            src, tgt_in, tgt_out = batch
            return _lm_loss(model(src, tgt_in), tgt_out)
        x, y = batch
        return _lm_loss(model(x), y)

    def wrap_modules(self) -> tuple[type, ...]:
        return {
            "mlp": (nn.Linear,), "cnn": (ConvBlock,), "lstm": (nn.LSTM,), "gpt": (GPTBlock,),
            "llama": (LlamaBlock,), "vit": (ViTBlock,),
            "encdec": (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer),
            "moe": (MoEBlock,),
        }[self.arch]


def write_recipe(arch: str, directory: str | Path, **config: Any) -> Path:
    """Write ``<directory>/<arch>.py``: a recipe file whose hooks come from this module."""
    return hooks_recipe(Path(directory) / f"{arch}.py",
                        f"from models_zoo import Recipe\n_recipe = Recipe({arch!r}, **{config!r})")


def hooks_recipe(path: Path, setup: str) -> Path:
    """Write a recipe file at ``path`` whose hooks delegate to ``_recipe``, which ``setup`` (code
    run with bench/ on sys.path) defines: the estimator then traces it by file path, as it
    traces a user's script."""
    path.parent.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).resolve().parent
    head = f"import sys\nsys.path.insert(0, {str(here)!r})\n{setup}\n"
    path.write_text(head + textwrap.dedent("""


        # Top-level functions, so that `launch` classifies the file as a recipe.
        def build_model():
            return _recipe.build_model()


        def example_batch(batch_size):
            return _recipe.example_batch(batch_size)


        def training_step(model, batch):
            return _recipe.training_step(model, batch)


        def wrap_modules():
            return _recipe.wrap_modules()
        """))
    return path


def llama_7b_config(seq: int = 2048, kv_heads: int = 8) -> dict[str, Any]:
    """Llama-2-7B's shape (32 layers, 4096 wide, 32 heads, 11008 SwiGLU, 32000 vocab)."""
    return {"vocab": 32000, "seq": seq, "dim": 4096, "heads": 32, "kv_heads": kv_heads,
            "hidden": 11008, "layers": 32}


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["ARCHS", "Recipe", "write_recipe", "llama_7b_config", "parameter_count"]
