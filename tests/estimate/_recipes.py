"""Recipes several estimator tests trace (as source text: each is written to a file)."""

#: A small GPT: two pre-norm blocks with SDPA, tied-free head; wrap_modules() is the block.
GPT = '''
import torch, torch.nn as nn, torch.nn.functional as F
V, D, H, L, S = 256, 64, 4, 2, 32

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        q, k, v = (t.view(B, T, H, D // H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, D))
        return x + self.mlp(self.ln2(x))

class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(S, D)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))

def build_model():
    return GPT()

def example_batch(batch_size):
    idx = torch.randint(0, V, (batch_size, S + 1))
    return idx[:, :-1].contiguous(), idx[:, 1:].contiguous()

def training_step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))

def wrap_modules():
    return (Block,)
'''
