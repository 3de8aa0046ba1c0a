"""Plain PyTorch scripts planned as the user wrote them: no recipe hooks, no framework, no --params.

``launch plan train.py [-- ARGS]`` runs such a script with its own arguments in the capture child
(launcher/capture/child/plain.py) up to its first ``optimizer.step()``, and traces the model,
batch, loss and optimizer it had built by then (launcher/capture/recipe_template.py). The script's
argparse tells which of its options is the batch size (the one whose value is the batch's rows),
and the plan reaches the script through that flag: ``--batch-size N`` in the job's arguments, and
an out-of-memory failure is resubmitted with a smaller one.

The scripts are written as their authors write them: pytorch/examples' mnist (argparse, a
DataLoader, ``F.nll_loss``), nanoGPT's train.py (module-level settings, a ``device`` chosen by
``torch.cuda.is_available()``, ``logits, loss = model(X, Y)``) and word_language_model's
``--batch_size``. The plans run once for the module, in a small pool (each imports torch in a
child and traces: seconds of CPU that overlap).
"""

# ruff: noqa: E501  (the scripts below keep their public originals' lines as they are)
from __future__ import annotations

import json
import runpy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher.capture.frameworks import Detected, measure_step
from tests.fakes.in_process import Runs
from tests.fakes.in_process import launch as _launch

MNIST = '''
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(2304, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print('Train Epoch: {} [{}/{}]\\tLoss: {:.6f}'.format(
                epoch, batch_idx * len(data), len(train_loader.dataset), loss.item()))


def main():
    parser = argparse.ArgumentParser(description='PyTorch MNIST Example')
    parser.add_argument('--batch-size', type=int, default=64, metavar='N',
                        help='input batch size for training (default: 64)')
    parser.add_argument('--test-batch-size', type=int, default=1000, metavar='N',
                        help='input batch size for testing (default: 1000)')
    parser.add_argument('--epochs', type=int, default=14, metavar='N',
                        help='number of epochs to train (default: 14)')
    parser.add_argument('--lr', type=float, default=1.0, metavar='LR',
                        help='learning rate (default: 1.0)')
    parser.add_argument('--no-cuda', action='store_true', default=False,
                        help='disables CUDA training')
    parser.add_argument('--seed', type=int, default=1, metavar='S')
    parser.add_argument('--log-interval', type=int, default=10, metavar='N')
    args = parser.parse_args()
    use_cuda = not args.no_cuda and torch.cuda.is_available()
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if use_cuda else "cpu")
    images = torch.randn(640, 1, 28, 28)  # MNIST's shapes, without the download
    labels = torch.randint(0, 10, (640,))
    train_loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch_size,
                              shuffle=True)
    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)


if __name__ == '__main__':
    main()
'''

NANOGPT = '''
import math
import time

import torch
import torch.nn as nn
from torch.nn import functional as F

# -----------------------------------------------------------------------------
# default config values
batch_size = 12
block_size = 64
n_layer = 2
n_head = 4
n_embd = 64
dropout = 0.0
bias = False
learning_rate = 6e-4
max_iters = 50
weight_decay = 1e-1
beta1, beta2 = 0.9, 0.95
device = 'cuda' if torch.cuda.is_available() else 'cpu'
# -----------------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(n_embd, dim=2)
        k = k.view(B, T, n_head, C // n_head).transpose(1, 2)
        q = q.view(B, T, n_head, C // n_head).transpose(1, 2)
        v = v.view(B, T, n_head, C // n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block() for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd, bias=bias),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)
        else:
            logits = self.lm_head(x[:, [-1], :])
            loss = None
        return logits, loss


train_data = torch.randint(0, 256, (20000,))  # the tokens of train.bin, made up


def get_batch(split):
    data = train_data
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    if device == 'cuda':
        x = x.pin_memory().to(device, non_blocking=True)
        y = y.pin_memory().to(device, non_blocking=True)
    else:
        x, y = x.to(device), y.to(device)
    return x, y


model = GPT(vocab_size=256)
model.to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(beta1, beta2),
                              weight_decay=weight_decay)
X, Y = get_batch('train')
t0 = time.time()
iter_num = 0
while True:
    logits, loss = model(X, Y)
    X, Y = get_batch('train')
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    print(f"iter {iter_num}: loss {loss.item():.4f}, time {(time.time() - t0) * 1000:.2f}ms")
    iter_num += 1
    if iter_num > max_iters:
        break
'''

#: word_language_model's --batch_size, with its activations made large: 128 MiB of address space
#: a row (never touched, the capture stays cheap). The run plans on model states only
#: (LAUNCH_NO_TRACE), as a plan that cannot see them would.
WORD_LM = '''
import argparse
import torch

parser = argparse.ArgumentParser(description="PyTorch Wikitext-2 RNN/LSTM Language Model")
parser.add_argument("--lr", type=float, default=20)
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--batch_size", type=int, default=16, metavar="N", help="batch size")
parser.add_argument("--bptt", type=int, default=35)
args = parser.parse_args()


class RNNModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.decoder = torch.nn.Linear(16, 16)

    def forward(self, input):
        hidden = input.new_empty(input.shape[0], 32 * 1024 * 1024)  # the activations
        return self.decoder(input) + hidden[:, :16].zero_()


model = RNNModel()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
for epoch in range(args.epochs):
    for i in range(2):
        data = torch.ones(args.batch_size, 16)
        output = model(data)
        loss = output.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("epoch", epoch, "batch_size", args.batch_size, float(loss))
'''


#: A loop written on and for a GPU box: "cuda" hard-coded everywhere, as people write it.
ON_A_GPU = '''
"""A training loop written on and for a GPU box: "cuda" everywhere, as people write it."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--steps", type=int, default=1000)
args = parser.parse_args()

device = "cuda"
torch.manual_seed(0)
torch.cuda.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.benchmark = True


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 10))

    def forward(self, x):
        return self.net(x)


model = MLP().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
scaler = torch.amp.GradScaler("cuda")
data = torch.randn(4096, 128)
labels = torch.randint(0, 10, (4096,))
for step in range(args.steps):
    idx = torch.randint(0, 4096, (args.batch_size,), device="cpu")
    x = data[idx].pin_memory().to(device, non_blocking=True)
    y = labels[idx].to(torch.device("cuda:0"))
    noise = torch.randn(args.batch_size, 128, device=device) * 0.01
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x + noise), y)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    if step % 100 == 0:
        torch.cuda.synchronize()
        print(step, loss.item(), torch.cuda.max_memory_allocated() / 2**20)
'''


#: pytorch/examples' imagenet loop order: the output computed, then ``optimizer.zero_grad()``,
#: then backward: every forward after the first runs with the last step's gradients allocated.
ZERO_AFTER_FORWARD = '''
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("-b", "--batch-size", default=32, type=int)
parser.add_argument("--epochs", default=2, type=int)
args = parser.parse_args()

model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                      nn.Linear(2048, 10))
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
images = torch.randn(256, 512)
target = torch.randint(0, 10, (256,))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, target),
                                     batch_size=args.batch_size)
for epoch in range(args.epochs):
    for i, (images, target) in enumerate(loader):
        # compute output
        output = model(images)
        loss = criterion(output, target)

        # compute gradient and do SGD step
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''

#: The PyTorch transformer tutorial's habit: a module-level ``device`` that the model's forward
#: reads (the recipe rebuilds the script's classes without running it).
DEVICE_GLOBAL = '''
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class PositionalEncoding(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        positions = torch.arange(x.size(1), device=device).float().unsqueeze(-1)
        return self.proj(x + positions)


model = PositionalEncoding(32).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(8, 16, 32, device=device)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
'''

#: nanoGPT as it is: its settings are module-level globals that configurator.py (below, nanoGPT's
#: own, verbatim) sets from ``--key=value`` arguments; a bare word is a config file to exec.
NANOGPT_CONFIGURATOR = NANOGPT.replace(
    "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n",
    "device = 'cuda'\n"  # nanoGPT's default: a GPU is assumed; the capture runs it on the CPU
    "config_keys = [k for k,v in globals().items() if not k.startswith('_') and isinstance(v, "
    "(int, float, bool, str))]\n"
    "exec(open('configurator.py').read()) # overrides from command line or config file\n"
    "config = {k: globals()[k] for k in config_keys} # will be useful for logging\n")
assert NANOGPT_CONFIGURATOR != NANOGPT
# ... and its loop as nanoGPT writes it: gradient accumulation with the loss divided, autocast
# ("cuda" here), a GradScaler, torch.compile, gradient clipping, and an evaluation of
# eval_iters batches per split under no_grad before the first optimizer step.
NANOGPT_CONFIGURATOR = NANOGPT_CONFIGURATOR.replace(
    "max_iters = 50\n", "max_iters = 50\ngradient_accumulation_steps = 2\neval_iters = 200\n"
    "eval_interval = 2000\ncompile = True\ngrad_clip = 1.0\n")
NANOGPT_CONFIGURATOR = NANOGPT_CONFIGURATOR[:NANOGPT_CONFIGURATOR.index("X, Y = get_batch(")] + \
    '''from contextlib import nullcontext
device_type = 'cuda' if 'cuda' in device else 'cpu'
dtype = 'bfloat16' if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else 'float16'
ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(device_type=device_type, dtype=ptdtype)
scaler = torch.cuda.amp.GradScaler(enabled=(dtype == 'float16'))
if compile:
    print("compiling the model... (takes a ~minute)")
    unoptimized_model = model
    model = torch.compile(model) # requires PyTorch 2.0


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ['train', 'val']:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            with ctx:
                logits, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


X, Y = get_batch('train') # fetch the very first batch
iter_num = 0
while True:
    if iter_num % eval_interval == 0:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    for micro_step in range(gradient_accumulation_steps):
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps # scale the loss to account for gradient accumulation
        X, Y = get_batch('train')
        scaler.scale(loss).backward()
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    if iter_num > max_iters:
        break
'''
CONFIGURATOR = '''"""
Poor Man's Configurator. Probably a terrible idea. Example usage:
$ python train.py config/override_file.py --batch_size=32
"""

import sys
from ast import literal_eval

for arg in sys.argv[1:]:
    if '=' not in arg:
        # assume it's the name of a config file
        assert not arg.startswith('--')
        config_file = arg
        print(f"Overriding config with {config_file}:")
        with open(config_file) as f:
            print(f.read())
        exec(open(config_file).read())
    else:
        # assume it's a --key=value argument
        assert arg.startswith('--')
        key, val = arg.split('=')
        key = key[2:]
        if key in globals():
            try:
                # attempt to eval it it (e.g. if bool, number, or etc)
                attempt = literal_eval(val)
            except (SyntaxError, ValueError):
                # if that goes wrong, just use the string
                attempt = val
            # ensure the types match ok
            assert type(attempt) == type(globals()[key])
            # cross fingers
            print(f"Overriding: {key} = {attempt}")
            globals()[key] = attempt
        else:
            raise ValueError(f"Unknown config key: {key}")
'''


#: A word-level language model written as PyTorch's nn.Transformer tutorial teaches it, with an
#: argparse of its own: ``batchify`` makes ``[seq, batch]`` columns, ``get_batch`` slices
#: ``--bptt`` rows of them and flattens the target, the encoder is sequence-first (torch's
#: default), the mask a second input of ``[bptt, bptt]``, the loss a cross-entropy of
#: ``output.view(-1, ntokens)``; SGD, a StepLR and clipping.
SEQ_FIRST_LM = '''
import argparse
import math

import torch
import torch.nn as nn

parser = argparse.ArgumentParser(description="Word-level language model on nn.TransformerEncoder")
parser.add_argument("--batch_size", type=int, default=16, help="batch size")
parser.add_argument("--bptt", type=int, default=32, help="sequence length")
parser.add_argument("--emsize", type=int, default=64)
parser.add_argument("--nlayers", type=int, default=2)
parser.add_argument("--lr", type=float, default=5.0)
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ntokens = 1000


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout=0.1, max_len=512):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x):
        return self.dropout(x + self.pe[:x.size(0)])


class TransformerLM(nn.Module):
    def __init__(self, ntoken, d_model, nhead, d_hid, nlayers, dropout=0.2):
        super().__init__()
        self.embedding = nn.Embedding(ntoken, d_model)
        self.pos_encoder = PositionalEncoding(d_model, dropout)
        layer = nn.TransformerEncoderLayer(d_model, nhead, d_hid, dropout)
        self.transformer_encoder = nn.TransformerEncoder(layer, nlayers)
        self.linear = nn.Linear(d_model, ntoken)
        self.d_model = d_model

    def forward(self, src, src_mask):
        src = self.pos_encoder(self.embedding(src) * math.sqrt(self.d_model))
        return self.linear(self.transformer_encoder(src, src_mask))


def batchify(data, bsz):
    seq_len = data.size(0) // bsz
    return data[:seq_len * bsz].view(bsz, seq_len).t().contiguous().to(device)


def get_batch(source, i):
    seq_len = min(args.bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


corpus = torch.randint(0, ntokens, (args.batch_size * args.bptt * 6,))  # the tokenized text
train_data = batchify(corpus, args.batch_size)
model = TransformerLM(ntokens, args.emsize, 2, 128, args.nlayers).to(device)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1.0, gamma=0.95)
src_mask = nn.Transformer.generate_square_subsequent_mask(args.bptt).to(device)
for epoch in range(1, args.epochs + 1):
    model.train()
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        data, targets = get_batch(train_data, i)
        seq_len = data.size(0)
        output = model(data, src_mask[:seq_len, :seq_len])
        loss = criterion(output.view(-1, ntokens), targets)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
    scheduler.step()
'''

#: A character-level LSTM trained by hand, as pytorch/examples' word_language_model trains:
#: no torch.optim (clip, then ``p -= lr * p.grad`` under no_grad), sequence-first batches, the
#: hidden state carried from step to step (detached), ``--batch_size`` beside ``--bptt`` and
#: ``--nlayers``.
LSTM_BY_HAND = '''
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser(description="Character-level LSTM")
parser.add_argument("--batch_size", type=int, default=24)
parser.add_argument("--bptt", type=int, default=40)
parser.add_argument("--nhid", type=int, default=96)
parser.add_argument("--nlayers", type=int, default=2)
parser.add_argument("--lr", type=float, default=20.0)
parser.add_argument("--clip", type=float, default=0.25)
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()

vocab = 500


class CharLSTM(nn.Module):
    def __init__(self, nhid, nlayers):
        super().__init__()
        self.embed = nn.Embedding(vocab, nhid)
        self.lstm = nn.LSTM(nhid, nhid, nlayers, dropout=0.1)
        self.head = nn.Linear(nhid, vocab)
        self.nhid, self.nlayers = nhid, nlayers

    def forward(self, x, state):
        out, state = self.lstm(self.embed(x), state)
        return self.head(out), state

    def init_state(self, bsz):
        return (torch.zeros(self.nlayers, bsz, self.nhid), torch.zeros(self.nlayers, bsz, self.nhid))


def detach(state):
    return tuple(s.detach() for s in state)


stream = torch.randint(0, vocab, (args.batch_size * args.bptt * 5 + 1,))  # the text, encoded
columns = (stream.size(0) - 1) // args.batch_size
data = stream[:columns * args.batch_size].view(args.batch_size, columns).t().contiguous()
model = CharLSTM(args.nhid, args.nlayers)
criterion = nn.CrossEntropyLoss()
for epoch in range(args.epochs):
    state = model.init_state(args.batch_size)
    for i in range(0, data.size(0) - 1, args.bptt):
        seq_len = min(args.bptt, data.size(0) - 1 - i)
        inputs, targets = data[i:i + seq_len], data[i + 1:i + 1 + seq_len].reshape(-1)
        state = detach(state)
        model.zero_grad()
        logits, state = model(inputs, state)
        loss = criterion(logits.view(-1, vocab), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        with torch.no_grad():
            for p in model.parameters():
                p -= args.lr * p.grad
    print("epoch", epoch, "loss", loss.item())
'''






@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    r = Runs(tmp_path_factory.mktemp("plain"))
    r.plan("mnist", MNIST)
    r.plan("nanogpt", NANOGPT)
    r.plan("mnist_32", MNIST, "--micro-batch-size", "16", "--", "--batch-size", "32")
    r.plan("on_a_gpu", ON_A_GPU)
    r.plan("zero_after", ZERO_AFTER_FORWARD)
    r.plan("mnist_lr", MNIST, "--lr", "0.5")
    r.plan("device_global", DEVICE_GLOBAL)
    r.futures["zero_after_real"] = r.pool.submit(measure_step, r.scripts["zero_after"],
                                                 Detected("plain"))
    r.plan("nanogpt_as_is", NANOGPT_CONFIGURATOR, "--micro-batch-size", "4", "--",
           "--batch_size=8", "--n_layer=2", files={"configurator.py": CONFIGURATOR})
    r.plan("on_a_gpu_50", ON_A_GPU, "--steps", "50")
    folder = r.dir / "on_a_gpu_run"
    folder.mkdir()
    (folder / "main.py").write_text(ON_A_GPU)
    r.futures["on_a_gpu_run"] = r.pool.submit(_launch, [str(folder / "main.py")], folder)
    for name in ("mnist", "nanogpt"):  # the scripts' own first two steps, for real
        r.futures[f"{name}_real"] = r.pool.submit(measure_step, r.scripts[name], Detected("plain"))
    r.plan("seq_first_lm", SEQ_FIRST_LM)
    r.plan("lstm_by_hand", LSTM_BY_HAND)
    # the plan's own micro-batch, 12 of the script's 24 rows: the batch resized along dim 1
    r.plan("lstm_by_hand_12", LSTM_BY_HAND, "--micro-batch-size", "12",
           "--global-batch-size", "12")
    for name in ("seq_first_lm", "lstm_by_hand"):
        r.futures[f"{name}_real"] = r.pool.submit(measure_step, r.scripts[name], Detected("plain"))
    r.futures["lstm_by_hand_12_real"] = r.pool.submit(
        measure_step, r.scripts["lstm_by_hand"], Detected("plain"), argv=["--batch_size", "12"])
    yield r
    r.pool.shutdown(wait=True, cancel_futures=True)


def _parameters(module: Any) -> int:
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def test_an_argparse_loop_is_traced_without_params_and_its_batch_flag_learned(runs: Runs
                                                                              ) -> None:
    data = runs.json("mnist")
    assert data["model"]["source"] == "traced"
    net = runpy.run_path(str(runs.scripts["mnist"]), run_name="not_main")["Net"]()
    assert data["model"]["parameters"] == _parameters(net)
    chosen = data["chosen"]
    assert chosen["fits"] is True and chosen["memory"]["peak_allocated"] > 0
    assert chosen["global_batch_size"] == 64  # the script's own --batch-size default
    assert "the script's own: --batch-size 64" in data["origins"]["global_batch_size"]
    assert "micro-batch -> --batch-size (the script's own flag)" in data["notes"]
    assert data["script_args"] == []  # the plan's micro-batch is the script's own: no flag
    capture = next((runs.dir / "mnist" / "state" / "framework_recipes").glob("*/capture.json"))
    answer = json.loads(capture.read_text())
    assert answer["flags"] == {"micro_batch_size": "--batch-size", "epochs": "--epochs",
                               "lr": "--lr"}
    assert answer["step"]["loss"] == "function" and answer["step"]["target"] == "target"
    assert answer["optimizer"]["class"] == "torch.optim.adadelta.Adadelta"


def test_the_plan_prices_the_scripts_own_length(runs: Runs) -> None:
    """Not launch's default of 100 steps: mnist's --epochs 14 of its loader's 10 batches."""
    data = runs.json("mnist")
    assert data["chosen"]["steps"] == 14 * 10
    assert data["origins"]["steps"] == "the script's own: 14 epochs of 10 batches"


def test_the_plan_names_the_scripts_own_optimizer_by_its_class(runs: Runs) -> None:
    """mnist's Adadelta, as its traced step built it: not launch's default name (adamw)."""
    data = runs.json("mnist")
    assert data["chosen"]["optimizer_class"] == "Adadelta"
    assert data["origins"]["optimizer"] == "the script's own optimizer"


def test_a_script_hard_coded_for_cuda_is_traced_on_a_machine_without_one(runs: Runs) -> None:
    """``.to("cuda")``, ``device="cuda"``, ``torch.device("cuda:0")``, ``pin_memory()``,
    ``torch.cuda.synchronize()``, ``autocast("cuda")``, ``GradScaler("cuda")``, ``fused=True``:
    the capture runs it on the CPU (a CPU-only torch refused the first of them before)."""
    data = runs.json("on_a_gpu")
    assert data["model"]["source"] == "traced"
    assert data["model"]["parameters"] == 128 * 512 + 512 + 512 * 10 + 10
    assert data["chosen"]["global_batch_size"] == 32
    assert data["chosen"]["steps"] == 1000
    assert data["origins"]["steps"] == "the script's own: --steps 1000"
    assert data["script_args"] == []
    assert "steps -> --steps (the script's own flag)" in data["notes"]
    # its forward ran under autocast("cuda", bfloat16), which torch turned off here
    assert data["chosen"]["precision"] == "bf16_mixed"
    assert data["origins"]["precision"] == ("the script's own: torch.autocast('cuda', "
                                            "dtype=torch.bfloat16)")


def test_a_script_hard_coded_for_cuda_is_not_run_where_there_is_no_gpu(runs: Runs) -> None:
    """The capture ran it on the CPU; the job runs it as it is and would die at its first
    ``.to("cuda")``: the local plan says so with the script's line, and ``launch main.py``
    starts nothing (exit 2, one line). nanoGPT's ``--device=cuda`` global names its own way
    out."""
    data = runs.json("on_a_gpu")
    assert data["chosen"]["machine"] == "local-cpu"  # this machine has no GPU
    source = runs.scripts["on_a_gpu"].read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "model = MLP().to(device)" in text)
    said = [n for n in data["notes"] if "puts its tensors on a GPU" in n]
    assert said == [f"main.py puts its tensors on a GPU (main.py:{line}: .to('cuda')) and this "
                    "machine has none: the local job would fail: choose the device with "
                    "torch.cuda.is_available() in the script, or pass --provider "
                    "vertex|sagemaker"]
    status, out, err = runs.futures["on_a_gpu_run"].result()
    assert status == 2 and out == ""
    assert err.strip().splitlines()[0].startswith("launch: error: main.py puts its tensors on a GPU")
    assert "Traceback" not in err
    assert not (runs.dir / "on_a_gpu_run" / "state" / "runs").exists()  # nothing started
    nanogpt = [n for n in runs.json("nanogpt_as_is")["notes"] if "on a GPU" in n]
    assert len(nanogpt) == 1 and "launch train.py -- --device=cpu" in nanogpt[0]


def test_nanogpts_configurator_settings_are_its_flags(runs: Runs) -> None:
    """nanoGPT's train.py sets its globals from ``--batch_size=8`` through configurator.py: the
    capture runs it so (``device = 'cuda'`` on a machine without one), learns the globals as
    glued flags, and the plan reaches it the only way the configurator reads (``--batch_size=4``
    replacing the user's ``--batch_size=8``, one argument: ``--batch_size 4`` would be read as a
    config file named 4)."""
    data = runs.json("nanogpt_as_is")
    assert data["model"]["source"] == "traced"
    chosen = data["chosen"]
    # the user's --batch_size=8 (not the default 12) x its own 2 accumulation steps
    assert chosen["global_batch_size"] == 16
    assert data["origins"]["global_batch_size"] == (
        "the script's own: --batch_size=8 x --gradient_accumulation_steps=2")
    assert (chosen["micro_batch_size"], chosen["grad_accum_steps"]) == (4, 4)
    assert data["script_args"] == ["--batch_size=4", "--n_layer=2",
                                   "--gradient_accumulation_steps=4"]
    assert chosen["steps"] == 50 and data["origins"]["steps"] == "the script's own: --max_iters=50"
    assert "micro-batch -> --batch_size=N (the script's own flag)" in data["notes"]
    # autocast('cuda', float16) as nanoGPT picks it without bf16 support: the same bytes
    assert chosen["precision"] == "bf16_mixed"
    # the loss it calls backward on is the model's, divided by the accumulation steps
    assert not any("traced step sums the output" in n for n in data["notes"])
    capture = json.loads(next((runs.dir / "nanogpt_as_is" / "state" / "framework_recipes").glob(
        "*/capture.json")).read_text())
    assert capture["flags"] == {"micro_batch_size": "--batch_size=",
                                "grad_accum_steps": "--gradient_accumulation_steps=",
                                "steps": "--max_iters=", "lr": "--learning_rate="}
    assert capture["step"]["loss"] == "index" and capture["step"]["index"] == 1


def test_a_pinned_steps_reaches_the_script_through_its_steps_flag(runs: Runs) -> None:
    data = runs.json("on_a_gpu_50")
    assert data["chosen"]["steps"] == 50
    assert data["script_args"] == ["--steps", "50"]


def test_the_plans_micro_batch_reaches_the_script_through_its_flag(runs: Runs) -> None:
    data = runs.json("mnist_32")
    chosen = data["chosen"]
    assert chosen["global_batch_size"] == 32  # the script's own, as its arguments set it
    assert chosen["micro_batch_size"] == 16
    # replaced where the user gave it (argparse would take the last one anyway)
    assert data["script_args"] == ["--batch-size", "16"]
    assert any("has no accumulation flag" in n for n in data["notes"])


def test_a_nanogpt_style_script_is_traced_from_its_module_level_settings(runs: Runs) -> None:
    data = runs.json("nanogpt")
    assert data["model"]["source"] == "traced"
    chosen = data["chosen"]
    assert chosen["fits"] is True and chosen["memory"]["peak_allocated"] > 0
    assert chosen["global_batch_size"] == 12
    # 2 layers of 12 x 64^2 weights and 2 x 64 norms, tied 256 x 64 embedding, 64 x 64 positions,
    # the final norm
    assert data["model"]["parameters"] == 2 * (12 * 64 * 64 + 2 * 64) + 256 * 64 + 64 * 64 + 64
    assert chosen["optimizer"] == "adamw" and chosen["lr"] == 6e-4
    # no argparse: nothing carries the micro-batch, and the plan says so
    assert any("reads none of LAUNCH_MICRO_BATCH_SIZE" in n for n in data["notes"])
    capture = next((runs.dir / "nanogpt" / "state" / "framework_recipes").glob("*/capture.json"))
    answer = json.loads(capture.read_text())
    assert answer["step"] == {"kind": "plain", "loss": "index", "index": 1,
                              # `logits, loss = model(X, Y)` holds them into the next forward
                              "held_output": [[[12, 64, 256], "float32"], [[], "float32"]]}


@pytest.mark.parametrize("name", ["mnist", "nanogpt"])
def test_the_traced_peak_is_near_the_scripts_own_steps(runs: Runs, name: str) -> None:
    """The traced peak at the script's own batch against its own first two optimizer steps
    (the CPU allocator's record, ``frameworks.measure_step``), within the issue's -3%..+5% for
    nanoGPT (-0.11% in bench/bench_plain.py: the -6.7% before was the capture keeping step 1's
    logits and batch alive through the measurement). mnist's -3.7% is the CPU plan's
    extrapolation from micro-batches 1, 2 and 4, whose kernel scratch does not grow with the
    batch (a GPU plan has no such probes): within 10% here, the bench records it."""
    traced = runs.json(name)["chosen"]["memory"]["peak_allocated"]
    real = runs.futures[f"{name}_real"].result()["peak_allocated"]
    low, high = (-0.03, 0.05) if name == "nanogpt" else (-0.10, 0.10)
    assert low <= (traced - real) / real <= high, (traced, real)


def test_a_loop_that_zeroes_after_its_forward_holds_the_last_gradients_through_it(
        runs: Runs) -> None:
    """21 MB of gradients (5.3M parameters) alive through each forward after the first: traced
    as the loop runs (-26% without them), against its own steps."""
    data = runs.json("zero_after")
    capture = json.loads(next((runs.dir / "zero_after" / "state" / "framework_recipes").glob(
        "*/capture.json")).read_text())
    assert capture["step"]["grads_through_forward"] is True
    traced = data["chosen"]["memory"]["peak_allocated"]
    real = runs.futures["zero_after_real"].result()["peak_allocated"]
    assert -0.03 <= (traced - real) / real <= 0.05, (traced, real)
    # the usual order (zero_grad before the forward) holds none
    mnist = json.loads(next((runs.dir / "mnist" / "state" / "framework_recipes").glob(
        "*/capture.json")).read_text())
    assert "grads_through_forward" not in mnist["step"]


def test_a_pinned_lr_reaches_the_script_through_its_lr_flag_and_only_a_pinned_one(
        runs: Runs) -> None:
    """--lr 0.5 reaches mnist as `--lr 0.5`; unpinned, the script's own lr is left alone (a
    schedule's first lr, what the optimizer holds at the first step, is not the option's:
    nanoGPT's warm-up starts at 0, and its --learning_rate=6e-4 is not rewritten)."""
    pinned = runs.json("mnist_lr")
    assert pinned["chosen"]["lr"] == 0.5 and pinned["script_args"] == ["--lr", "0.5"]
    assert "a pinned lr -> --lr (the script's own flag)" in pinned["notes"]
    assert runs.json("mnist")["script_args"] == []
    assert not any(a.startswith("--learning_rate") for a in runs.json("nanogpt_as_is")[
        "script_args"])


def test_a_module_level_device_the_forward_reads_is_rebuilt_for_the_trace(runs: Runs) -> None:
    """It failed with NameError: device (the recipe kept only plain constants)."""
    data = runs.json("device_global")
    assert data["model"]["source"] == "traced"
    assert data["model"]["parameters"] == 32 * 32 + 32


def test_with_flags_replaces_or_appends_the_learned_flag() -> None:
    from types import SimpleNamespace

    from launcher.script_info import with_flags

    plan = SimpleNamespace(micro_batch_size=8, grad_accum_steps=2)
    flags = {"micro_batch_size": "--batch_size", "epochs": "--epochs"}
    own = {"micro_batch_size": 20, "epochs": 1}
    assert with_flags(("--epochs", "3"), flags, own, plan) == ("--epochs", "3",
                                                               "--batch_size", "8")
    assert with_flags(("--batch_size", "20"), flags, own, plan) == ("--batch_size", "8")
    assert with_flags(("--batch_size=20",), flags, own, plan) == ("--batch_size=8",)
    assert with_flags((), flags, {"micro_batch_size": 8}, plan) == ()  # its own: untouched


def test_an_oom_is_fixed_in_one_resubmission_through_the_scripts_batch_flag(tmp_path: Path
                                                                              ) -> None:
    """word_language_model reads --batch_size: planned without --params, the capture learns the
    flag, and the out-of-memory failure at 16 rows (2 GiB of its own a step, under a 2.5 GiB
    cap) is resubmitted once with --batch_size 8, which fits."""
    script = tmp_path / "main.py"
    script.write_text(WORD_LM)
    status, out, err = _launch([str(script), "--json", "--memory-limit", "2560MiB",
                                "--max-attempts", "3"], tmp_path,
                               environ={"LAUNCH_NO_TRACE": "1"})
    assert status == 0, (out, err)
    data = json.loads(out)
    assert len(data["attempts"]) == 2, [a.get("change") for a in data["attempts"]]
    run = tmp_path / "state" / "runs" / data["run_id"]
    first = json.loads((run / "attempt-1" / "request.json").read_text())
    second = json.loads((run / "attempt-2" / "request.json").read_text())
    assert "--batch_size" not in first["argv"]  # its own 16
    assert second["argv"][-2:] == ["--batch_size", "8"]


def _learned(options: list[tuple[str, str, Any]], rows: int) -> tuple[dict[str, str], list[str]]:
    """The flags ``_learn_flags`` takes from a parser with ``options`` (flag, dest, value)."""
    from launcher.capture.child import answer, plain

    saved_answer, saved_state = dict(answer.ANSWER), dict(answer.STATE)
    try:
        answer.ANSWER.clear()
        answer.ANSWER.update(reached=False, notes=[])
        answer.STATE.clear()
        answer.STATE["plain_parsers"] = [{"prog": "main.py", "options": [
            {"options": [flag], "dest": dest, "type": "int", "default": value, "value": value}
            for flag, dest, value in options]}]
        plain._learn_flags(rows)
        return dict(answer.ANSWER["flags"]), list(answer.ANSWER["notes"])
    finally:
        answer.ANSWER.clear()
        answer.ANSWER.update(saved_answer)
        answer.STATE.clear()
        answer.STATE.update(saved_state)


def test_the_batch_flag_is_the_option_holding_the_batchs_rows_by_name_first() -> None:
    # the batch size by name among options of the same value (a hidden size of 32 too)
    flags, _ = _learned([("--hidden", "hidden", 32), ("--batch-size", "batch_size", 32),
                         ("--eval-batch-size", "eval_batch_size", 32),
                         ("--gradient_accumulation_steps", "gradient_accumulation_steps", 4),
                         ("--max_iters", "max_iters", 5000)], 32)
    assert flags == {"micro_batch_size": "--batch-size",
                     "grad_accum_steps": "--gradient_accumulation_steps", "steps": "--max_iters"}
    # the only option of that value, whatever its name (word_language_model's -b would be one)
    assert _learned([("--nb", "nb", 20), ("--lr", "lr", 5)], 20)[0] == {
        "micro_batch_size": "--nb", "lr": "--lr"}
    # two batch sizes of that value: none is taken, and the plan says so
    flags, notes = _learned([("--bs", "bs", 16), ("--batch_size", "batch_size", 16)], 16)
    assert "micro_batch_size" not in flags
    assert any("several options hold the batch's 16 rows" in n for n in notes)
    # two options of that value, neither named as a batch: none
    flags, notes = _learned([("--a", "a", 8), ("--b", "b", 8)], 8)
    assert flags == {} and notes


def _capture_of(runs: Runs, name: str) -> dict[str, Any]:
    return json.loads(next((runs.dir / name / "state" / "framework_recipes").glob(
        "*/capture.json")).read_text())


def test_a_sequence_first_loops_batch_is_its_second_dimension(runs: Runs) -> None:
    """``data [32, 16]`` is 32 tokens (``--bptt``) of 16 sequences (``--batch_size``): the
    encoder is sequence-first, so the batch is dimension 1, the plan's micro-batch is 16 and the
    flag that carries it is --batch_size (the first dimension made them 32 and --bptt before);
    the flattened ``[32 * 16]`` target is the loss's (the step summed the output before), and
    the ``[32, 32]`` mask the model also takes is copied, not resized."""
    data = runs.json("seq_first_lm")
    assert data["model"]["source"] == "traced"
    chosen = data["chosen"]
    assert (chosen["micro_batch_size"], chosen["global_batch_size"]) == (16, 16)
    assert data["origins"]["global_batch_size"] == "the script's own: --batch_size 16"
    assert "micro-batch -> --batch_size (the script's own flag)" in data["notes"]
    assert any("the batch is dimension 1 of the model's input [32, 16]" in n
               for n in data["notes"])
    assert not any("traced step sums the output" in n for n in data["notes"])
    capture = _capture_of(runs, "seq_first_lm")
    assert capture["flags"]["micro_batch_size"] == "--batch_size"
    assert (capture["batch_size"], capture["batch_dim"]) == (16, 1)
    # data, the mask (not the batch's), the flattened target
    assert capture["batch_layout"] == [{"dim": 1}, None, {"dim": 1, "flat": [32, 16]}]
    assert capture["step"]["loss"] == "function"
    assert capture["step"]["function"] == "cross_entropy" and capture["step"]["flatten"]


def test_an_lstm_updated_by_hand_is_captured_at_its_next_step(runs: Runs) -> None:
    """No torch.optim: the step ends where the next starts (its ``zero_grad``, the weights
    changed since the backward); traced with no optimizer state, its hidden state carried in as
    an input ``[layers, batch, hidden]`` resized with the batch, and the plan says that no
    optimizer setting reaches the script. --batch_size (24) is learned, not --nlayers (2, the
    hidden state's first dimension) nor --bptt (40, the input's)."""
    data = runs.json("lstm_by_hand")
    assert data["model"]["source"] == "traced"
    chosen = data["chosen"]
    assert (chosen["micro_batch_size"], chosen["global_batch_size"]) == (24, 24)
    assert "micro-batch -> --batch_size (the script's own flag)" in data["notes"]
    assert any("updates its weights itself" in n and "no optimizer state" in n
               for n in data["notes"])
    assert data["origins"]["optimizer"].startswith("the script's own: none: main.py updates")
    capture = _capture_of(runs, "lstm_by_hand")
    assert capture["flags"]["micro_batch_size"] == "--batch_size"
    assert capture["optimizer"]["by_hand"] is True
    assert capture["optimizer"]["defaults"]["momentum"] == 0.0
    # the tokens, the carried (h, c), the flattened target
    assert capture["batch_layout"] == [{"dim": 1}, {"dim": 1}, {"dim": 1},
                                       {"dim": 1, "flat": [40, 24]}]
    assert capture["batch_shapes"]["dict"]["args"]["list"][1]["list"][0]["shape"] == [2, 24, 96]


@pytest.mark.parametrize("name", ["seq_first_lm", "lstm_by_hand", "lstm_by_hand_12"])
def test_a_sequence_first_scripts_traced_peak_is_near_its_own_steps(runs: Runs, name: str
                                                                     ) -> None:
    """The traced peak against the script's own steps (``measure_step``: its first two
    optimizer steps, or steps by hand), within issue 28's -3%..+5%; ``lstm_by_hand_12`` is
    traced at the plan's micro-batch 12 (the captured 24 rows resized along dimension 1: the
    tokens, the hidden state, the flattened target) against the script run with
    ``--batch_size 12``, which the plan gives it."""
    data = runs.json(name)
    if name == "lstm_by_hand_12":
        assert data["chosen"]["micro_batch_size"] == 12
        assert data["script_args"] == ["--batch_size", "12"]
    traced = data["chosen"]["memory"]["peak_allocated"]
    real = runs.futures[f"{name}_real"].result()["peak_allocated"]
    assert -0.03 <= (traced - real) / real <= 0.05, (traced, real)


def test_the_batch_dimension_is_the_models_word_and_a_doubt_is_said() -> None:
    """word_language_model's inputs, ``data [35, 20]`` and the LSTM's ``(h, c)`` of ``[2, 20,
    64]``: with its sequence-first LSTM seen taking 20 rows, the batch is dimension 1 of the
    tokens, 20 rows; a flattened target (``[35 * 20]``, and a batch-first loop's ``[12 * 64]``)
    is resized as the dimensions it was flattened from. Without the model's word the most common
    first dimension (2, the layers) is taken, and the plan says it may not be the batch."""
    import torch

    from launcher.capture.child import answer, batch_dim

    inputs = {"args": [torch.zeros(35, 20, dtype=torch.long),
                       (torch.zeros(2, 20, 64), torch.zeros(2, 20, 64))], "kwargs": {},
              "extra": {}}
    saved_answer, saved_state = dict(answer.ANSWER), dict(answer.STATE)
    try:
        answer.ANSWER.clear()
        answer.ANSWER.update(reached=False, notes=[])
        answer.STATE.clear()
        guessed = batch_dim.find_batch_dim(inputs)
        assert (guessed.dim, guessed.rows) == (0, 2)
        assert any("differ in their first dimension (35, 2, 2)" in n and "may not be its batch"
                   in n for n in answer.ANSWER["notes"])
        answer.ANSWER["notes"].clear()
        answer.STATE["sequence_first_rows"] = [20, 20]
        found = batch_dim.find_batch_dim(inputs)
        assert (found.dim, found.rows, found.main) == (1, 20, (35, 20))
        assert answer.ANSWER["notes"] == []
        assert batch_dim.layout_of(torch.zeros(700, dtype=torch.long), found) == {
            "dim": 1, "flat": [35, 20]}
        assert batch_dim.layout_of(torch.zeros(35, 35), found) is None  # a mask: copied
        # without the model's word, the script's --batch_size 20 tells the dimension
        answer.STATE.clear()
        answer.STATE["plain_parsers"] = [{"prog": "main.py", "options": [
            {"options": ["--bptt"], "dest": "bptt", "value": 35},
            {"options": ["--batch_size"], "dest": "batch_size", "value": 20}]}]
        named = batch_dim.find_batch_dim(inputs)
        assert (named.dim, named.rows) == (1, 20) and answer.ANSWER["notes"] == []
        # a sequence-first layer handed [batch, seq] (batch_first forgotten) saw 35 "rows":
        # the script's batch size, the input's first dimension, overrules it, with a note
        answer.STATE["sequence_first_rows"] = [35]
        slip = batch_dim.find_batch_dim({"args": [torch.zeros(20, 35, dtype=torch.long)],
                                         "kwargs": {}, "extra": {}})
        assert (slip.dim, slip.rows) == (0, 20)
        assert any("batch_first=True" in n for n in answer.ANSWER["notes"])
        batch_first = batch_dim.BatchDim(0, 12, (12, 64))
        assert batch_dim.layout_of(torch.zeros(768), batch_first) == {"dim": 0, "flat": [12, 64]}
        assert batch_dim.layout_of(torch.zeros(12, 64), batch_first) == {"dim": 0}
    finally:
        answer.ANSWER.clear()
        answer.ANSWER.update(saved_answer)
        answer.STATE.clear()
        answer.STATE.update(saved_state)


#: Gradients accumulated over three backwards, then an update by hand: every forward after a
#: backward but the fourth sees the weights unchanged. Each update is written to updates.log.
ACCUMULATED_BY_HAND = '''
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--accum", type=int, default=3)
args = parser.parse_args()
model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 4))
for step in range(4):
    for micro in range(args.accum):
        x, y = torch.randn(args.batch_size, 32), torch.randint(0, 4, (args.batch_size,))
        loss = nn.functional.cross_entropy(model(x), y)
        (loss / args.accum).backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-0.1)
            p.grad = None
    with open("updates.log", "a") as log:
        log.write(f"update {step}\\n")
'''


def test_a_loop_accumulating_by_hand_is_captured_after_its_update_not_between_backwards(
        tmp_path: Path) -> None:
    """Three backwards, then the update: the forwards between them (weights unchanged) are no
    step boundary; the one after the update is, so the capture stops after exactly one update."""
    from launcher.capture.frameworks import capture

    script = tmp_path / "main.py"
    script.write_text(ACCUMULATED_BY_HAND)
    found = capture(script, Detected("plain"), folder=tmp_path / "capture", hardware=False)
    assert found.reached, found.notes
    assert (tmp_path / "updates.log").read_text() == "update 0\n"
    assert any("updates its weights itself" in n and "next forward" in n for n in found.notes)
    assert found.flags["micro_batch_size"] == "--batch-size"



# --- a step of several modules: an encoder and a decoder, an optimizer each -------------------

#: A translation model as users write one: an LSTM encoder, an attention decoder that takes the
#: encoder's outputs and its ``(h, c)`` (re-packed by the loop, as keywords), the target shifted
#: in the loop, a functional loss, and **two optimizers** of one class with different settings
#: (the encoder's SGD keeps momentum, the decoder's none: 11 MB of state that must not be
#: counted twice nor missed).
ENCODER_DECODER = '''
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, TensorDataset

SRC_VOCAB, TGT_VOCAB, SRC_LEN, TGT_LEN = 3000, 4000, 16, 21


class Encoder(nn.Module):
    def __init__(self, vocab, emb, hidden):
        super().__init__()
        self.embed = nn.Embedding(vocab, emb)
        self.rnn = nn.LSTM(emb, hidden, batch_first=True)

    def forward(self, src):
        outputs, (h, c) = self.rnn(self.embed(src))
        return outputs, (h, c)


class Decoder(nn.Module):
    def __init__(self, vocab, emb, hidden):
        super().__init__()
        self.embed = nn.Embedding(vocab, emb)
        self.rnn = nn.LSTM(emb, hidden, batch_first=True)
        self.out = nn.Linear(2 * hidden, vocab)

    def forward(self, tgt, state, memory):
        out, _ = self.rnn(self.embed(tgt), state)
        scores = torch.bmm(out, memory.transpose(1, 2))
        context = torch.bmm(F.softmax(scores, dim=-1), memory)
        return self.out(torch.cat([out, context], dim=-1))


def main():
    parser = argparse.ArgumentParser(description='seq2seq with attention')
    parser.add_argument('--batch-size', type=int, default=32)
    parser.add_argument('--epochs', type=int, default=2)
    parser.add_argument('--lr', type=float, default=0.5)
    parser.add_argument('--hidden', type=int, default=256)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    src = torch.randint(0, SRC_VOCAB, (512, SRC_LEN))
    tgt = torch.randint(0, TGT_VOCAB, (512, TGT_LEN))
    loader = DataLoader(TensorDataset(src, tgt), batch_size=args.batch_size, shuffle=True)
    encoder = Encoder(SRC_VOCAB, 128, args.hidden).to(device)
    decoder = Decoder(TGT_VOCAB, 128, args.hidden).to(device)
    enc_opt = optim.SGD(encoder.parameters(), lr=args.lr, momentum=0.9)
    dec_opt = optim.SGD(decoder.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        for step, (src, tgt) in enumerate(loader):
            src, tgt = src.to(device), tgt.to(device)
            tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
            enc_opt.zero_grad()
            dec_opt.zero_grad()
            memory, (h, c) = encoder(src)
            logits = decoder(tgt_in, state=(h, c), memory=memory)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt_out.reshape(-1))
            loss.backward()
            enc_opt.step()
            dec_opt.step()
            if step % 10 == 0:
                print(f'epoch {epoch} step {step} loss {loss.item():.4f}')


if __name__ == '__main__':
    main()
'''

#: The same with an Adam for the encoder and an SGD for the decoder: two classes of optimizer.
ADAM_AND_SGD = ENCODER_DECODER.replace(
    "enc_opt = optim.SGD(encoder.parameters(), lr=args.lr, momentum=0.9)",
    "enc_opt = optim.Adam(encoder.parameters(), lr=1e-3)")

#: A backbone and a head whose input the loop computes from the backbone's output
#: (``features.mean(1)``): the loop's operation is replayed between the two calls.
BACKBONE_HEAD = '''
import torch
import torch.nn as nn
import torch.nn.functional as F

backbone = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256))
head = nn.Linear(256, 10)
optimizer = torch.optim.Adam(list(backbone.parameters()) + list(head.parameters()), lr=1e-3)
for step in range(10):
    x = torch.randn(32, 8, 64)
    y = torch.randint(0, 10, (32,))
    features = backbone(x)
    logits = head(features.mean(1))
    loss = F.cross_entropy(logits, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
'''


#: A domain classifier behind a gradient-reversal ``autograd.Function`` (DANN): an operation
#: between the modules that launch cannot call again (its forward runs without gradients).
GRADIENT_REVERSAL = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return -grad


features_net = nn.Sequential(nn.Linear(64, 256), nn.ReLU())
domain_head = nn.Linear(256, 2)
optimizer = torch.optim.SGD(list(features_net.parameters()) + list(domain_head.parameters()), lr=0.1)
for step in range(10):
    x = torch.randn(32, 64)
    d = torch.randint(0, 2, (32,))
    features = features_net(x)
    logits = domain_head(GradReverse.apply(features))
    loss = F.cross_entropy(logits, d)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
'''


@pytest.fixture(scope="module")
def pipeline_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    r = Runs(tmp_path_factory.mktemp("pipeline"))
    r.plan("encoder_decoder", ENCODER_DECODER)
    r.plan("backbone_head", BACKBONE_HEAD)
    r.plan("gradient_reversal", GRADIENT_REVERSAL)
    r.plan("adam_and_sgd", ADAM_AND_SGD)
    for name in ("encoder_decoder", "backbone_head", "adam_and_sgd"):
        r.futures[f"{name}_real"] = r.pool.submit(measure_step, r.scripts[name],
                                                  Detected("plain"))
    yield r
    r.pool.shutdown(wait=True, cancel_futures=True)


def test_an_encoder_and_a_decoder_with_an_optimizer_each_are_traced_as_the_loop_runs_them(
        pipeline_runs: Runs) -> None:
    """Both modules are in the traced step, the decoder given the encoder's outputs as the loop
    gave them, and both optimizers' states are counted, each with its own settings: the traced
    peak against the script's own two steps (``measure_step``, whose weights are both
    modules'). Only the module holding most of the first optimizer's parameters was traced
    before: the encoder alone, with the sum of its output (seq2seq_gru in bench_plain: -50.8%)."""
    data = pipeline_runs.json("encoder_decoder")
    capture = json.loads(next((pipeline_runs.dir / "encoder_decoder" / "state"
                               / "framework_recipes").glob("*/capture.json")).read_text())
    namespace = runpy.run_path(str(pipeline_runs.scripts["encoder_decoder"]),
                               run_name="not_main")
    encoder = namespace["Encoder"](3000, 128, 256)
    decoder = namespace["Decoder"](4000, 128, 256)
    assert capture["pipeline"] == ["__main__.Encoder", "__main__.Decoder"]
    assert capture["parameters"] == _parameters(encoder) + _parameters(decoder)
    assert capture["optimizers"] == ["SGD", "SGD"]
    groups = capture["optimizer"]["groups"]
    assert [g["settings"]["momentum"] for g in groups] == [0.9, 0]
    assert len(groups[0]["params"]) == len(list(encoder.parameters()))
    decoder_call = capture["step"]["calls"][1]
    assert decoder_call["kwargs"]["dict"]["memory"] == {"out": 0, "path": [0]}
    assert capture["step"]["function"] == "cross_entropy"
    assert data["model"]["source"] == "traced"
    assert data["chosen"]["micro_batch_size"] == 32
    traced = data["chosen"]["memory"]["peak_allocated"]
    real = pipeline_runs.futures["encoder_decoder_real"].result()["peak_allocated"]
    assert -0.03 <= (traced - real) / real <= 0.05, (traced, real)


def test_optimizers_of_two_classes_each_keep_their_own_states(pipeline_runs: Runs) -> None:
    """An Adam for the encoder (two states a weight), an SGD without momentum for the decoder
    (none): each is rebuilt for its own parameters and stepped with the other, as the loop
    steps them; the plan says so. Adam's states for all would be 22 MB over."""
    data = pipeline_runs.json("adam_and_sgd")
    capture = json.loads(next((pipeline_runs.dir / "adam_and_sgd" / "state"
                               / "framework_recipes").glob("*/capture.json")).read_text())
    parts = capture["optimizer"]["parts"]
    assert [p["class"] for p in parts] == ["torch.optim.adam.Adam", "torch.optim.sgd.SGD"]
    assert any("the step's optimizers are Adam, SGD: each is rebuilt" in n
               for n in data["notes"])
    traced = data["chosen"]["memory"]["peak_allocated"]
    real = pipeline_runs.futures["adam_and_sgd_real"].result()["peak_allocated"]
    assert -0.03 <= (traced - real) / real <= 0.05, (traced, real)


def test_the_loops_operation_between_two_modules_is_replayed(pipeline_runs: Runs) -> None:
    """``head(features.mean(1))``: the mean is the loop's, between the two calls; it is
    replayed there (the backbone alone was traced before, with a note)."""
    data = pipeline_runs.json("backbone_head")
    capture = json.loads(next((pipeline_runs.dir / "backbone_head" / "state"
                               / "framework_recipes").glob("*/capture.json")).read_text())
    assert [c.get("op") for c in capture["step"]["calls"]] == [None, "Tensor.mean", None]
    assert capture["step"]["calls"][2]["args"]["list"] == [{"out": 1, "path": []}]
    assert capture["parameters"] == 64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10
    traced = data["chosen"]["memory"]["peak_allocated"]
    real = pipeline_runs.futures["backbone_head_real"].result()["peak_allocated"]
    assert -0.03 <= (traced - real) / real <= 0.05, (traced, real)


def test_a_step_whose_modules_it_cannot_replay_is_not_traced_and_says_why(
        pipeline_runs: Runs) -> None:
    """The head's input comes out of a custom autograd Function: the plan says so and shows
    no traced number (the feature net alone was traced before, the reversal's modules unsaid)."""
    status, out, err = pipeline_runs.futures["gradient_reversal"].result()
    assert status == 2, out
    assert "the training step runs 2 modules (Sequential, Linear)" in err
    assert "computed with gradients outside the step's modules" in err
    assert "peak_allocated" not in out


#: pytorch/examples' dcgan loop, cut down: the discriminator's Adam steps first (on real and a
#: detached fake), then the generator's, through the discriminator.
GAN = """
import argparse
import torch
import torch.nn as nn
import torch.optim as optim

parser = argparse.ArgumentParser()
parser.add_argument('--batchSize', type=int, default=16)
parser.add_argument('--niter', type=int, default=2)
opt = parser.parse_args()
nz = 32
netG = nn.Sequential(nn.ConvTranspose2d(nz, 64, 4, 1, 0), nn.BatchNorm2d(64), nn.ReLU(True),
                     nn.ConvTranspose2d(64, 3, 4, 2, 1), nn.Tanh())
netD = nn.Sequential(nn.Conv2d(3, 16, 4, 2, 1), nn.LeakyReLU(0.2, inplace=True),
                     nn.Conv2d(16, 1, 4, 1, 0), nn.Sigmoid())
criterion = nn.BCELoss()
optimizerD = optim.Adam(netD.parameters(), lr=0.0002, betas=(0.5, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=0.0002, betas=(0.5, 0.999))
data = torch.randn(64, 3, 8, 8)
for epoch in range(opt.niter):
    for i in range(0, len(data), opt.batchSize):
        real = data[i:i + opt.batchSize]
        netD.zero_grad()
        label = torch.full((real.size(0),), 1.0)
        errD_real = criterion(netD(real).view(-1), label)
        errD_real.backward()
        fake = netG(torch.randn(real.size(0), nz, 1, 1))
        label.fill_(0.0)
        errD_fake = criterion(netD(fake.detach()).view(-1), label)
        errD_fake.backward()
        optimizerD.step()
        netG.zero_grad()
        label.fill_(1.0)
        errG = criterion(netD(fake).view(-1), label)
        errG.backward()
        optimizerG.step()
"""


def test_a_gan_whose_models_train_in_turns_is_refused_not_half_traced(tmp_path: Path) -> None:
    """Its first optimizer step updates the discriminator alone: tracing that step would plan
    a tenth of the script's parameters as if they were all of it. The plan says why, in one
    line (exit 2), and points to --params."""
    script = tmp_path / "main.py"
    script.write_text(GAN)
    status, out, err = _launch(["plan", str(script), "--json"], tmp_path)
    assert status == 2, out
    generator = 32 * 64 * 16 + 64 + 64 * 2 + 64 * 3 * 16 + 3
    assert f"another optimizer, for {generator:,} parameters outside the model" in err
    assert "--params" in err and "Traceback" not in err
