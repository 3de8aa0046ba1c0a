"""Where in the training step an error was raised: the phase its traceback points to.

:func:`phase_of` reads the lines of one traceback (or the launcher's own report) against
:data:`PHASES`, by precedence; :data:`TEMPLATE_PHASES` are the phases the generated training
script reports itself. The watcher (:mod:`._watch`) asks for the phase of each root cause.
"""

from __future__ import annotations

import re

# Where in the training step an error was raised, read off its traceback (or the launcher's own
# report). Listed by precedence: a traceback through optimizer.step() whose innermost frame runs a
# forward (activation checkpointing recomputes one inside backward) is still about what the outer
# frame was doing. A call of a function merely *named* ``optimizer_step(...)`` is not evidence: the
# rendered scripts' ``optimizer_step`` is the whole step (forward and backward of each
# micro-batch, then the update), so every traceback out of their loop passes through that call;
# where the update itself failed, ``optimizer.step()`` or torch/optim/ frames say so.
PHASES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("optimizer", re.compile(
        r"exp_avg|torch/optim/|/optim/\w+\.py|\boptimi[sz]er\w*\.step\(|_multi_tensor_adam|"
        r"_single_tensor_adam|_fused_adam|fused_adam|initialize_optimizer_states|_optimizer_step|"
        r"/zero/stage\w*\.py\", line \d+, in (?:step|_optimizer_step)|"
        r"clip_grad_norm")),
    ("init", re.compile(
        r"DistributedDataParallel\(|FullyShardedDataParallel\(|\bFSDP\(|\bDDP\(|"
        r"Parameter\(torch\.empty|torch\.empty\(|from_pretrained\(|"
        r"\b(?:model|module|net)\w*\.(?:to|cuda)\(|load_state_dict\(|_sync_module_states|"
        r"_sync_params_and_buffers|_verify_param_shape|deepspeed\.initialize\(|"
        r"accelerator\.prepare\(|build_model\(|"
        r"(?:model|modules|nn/|parallel|layers)[^\"\n]{0,300}\", line \d+, in __init__")),
    ("checkpoint", re.compile(
        r"torch\.save\(|save_checkpoint|/serialization\.py\", line \d+, in save|"
        r"in save_state_dict|full_state_dict|consolidate_state_dict")),
    ("backward", re.compile(
        r"\.backward\(|\bin backward\b|torch/autograd/|_engine_run_backward|run_backward|"
        r"\bin _backward|engine\.backward|manual_backward")),
    # An evaluation loop, which runs at its own batch size and keeps no gradients: HF Trainer's
    # evaluate / evaluation_loop / prediction_step (and _evaluate, _maybe_log_save_evaluate
    # around them), Lightning's loops/evaluation_loop.py (_evaluation_step) and the module's
    # validation_step / test_step / predict_step, a script's own eval* / evaluate* / validate*.
    ("evaluation", re.compile(
        r"\bevaluat\w*\(|\bin _?evaluat\w*|\bin _\w*_evaluat\w*|\bin eval\w*\b|"
        r"\bin _?validat\w*|validation_step|\beval_step|prediction_step|\bin predict\w*|"
        r"\bvalidate\(|evaluation_loop|\bin test_step|\bin _run_evaluation")),
    ("forward", re.compile(
        r"\bin forward\b|\bin _forward|\bin _call_impl|\bin _wrapped_call_impl|\bforward\(|"
        r"training_step\(|\bin training_step|\bmodel\(|outputs?\s*=\s*(?:self\.)?model\w*\(")),
    ("data", re.compile(
        r"DataLoader|dataloader|_next_data|collate|__getitem__|_worker_loop|pin_memory|"
        r"\.to\(device\)")),
)
_PHASE_RANK = {name: i for i, (name, _) in enumerate(PHASES)}
# Strings one of which each phase's pattern needs (as the rules' needles): most context lines hold
# none, and are passed over without running the patterns.
_PHASE_NEEDLES: dict[str, tuple[str, ...]] = {
    "optimizer": ("exp_avg", "optim", "adam", "/zero/stage", "clip_grad_norm"),
    "init": ("DataParallel(", "FSDP(", "DDP(", "torch.empty", "from_pretrained(", ".to(",
             ".cuda(", "load_state_dict(", "_sync_module_states", "_sync_params_and_buffers",
             "_verify_param_shape", "deepspeed.initialize(", "accelerator.prepare(",
             "build_model(", "__init__"),
    "checkpoint": ("torch.save(", "save_checkpoint", "/serialization.py", "save_state_dict",
                   "full_state_dict", "consolidate_state_dict"),
    "backward": ("backward", "torch/autograd/"),
    "evaluation": ("evaluat", "eval", "validat", "predict", "test_step"),
    "forward": ("forward", "_call_impl", "training_step", "model"),
    "data": ("DataLoader", "dataloader", "_next_data", "collate", "__getitem__", "_worker_loop",
             "pin_memory", ".to(device)"),
}
_PHASES_GATED = tuple((name, _PHASE_NEEDLES[name], pattern) for name, pattern in PHASES)
TEMPLATE_PHASES = {"setup", "resume", "data", "forward", "backward", "optimizer", "checkpoint",
                    "evaluation", "eval", "init"}


def phase_of(texts: list[str]) -> str | None:
    """The phase the lines of one traceback point to, by the precedence of :data:`PHASES`."""
    best: str | None = None
    for text in texts:
        for name, needles, pattern in _PHASES_GATED:
            if best is not None and _PHASE_RANK[name] >= _PHASE_RANK[best]:
                break
            if any(needle in text for needle in needles) and pattern.search(text):
                best = name
                break
    return best
