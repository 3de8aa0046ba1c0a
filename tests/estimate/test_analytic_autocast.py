"""The analytic estimate under autocast: the fp32 residual stream, and the optimizer's
implementation (foreach or for-loop) at the step."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from launcher.estimate.footprint import foreach_temporary, from_shape
from launcher.estimate.model_config import shape_from_config
from launcher.plan.memory import Target, per_gpu_memory

BERT_LARGE = {"model_type": "bert", "hidden_size": 1024, "num_hidden_layers": 24,
              "num_attention_heads": 16, "intermediate_size": 4096, "vocab_size": 30522,
              "max_position_embeddings": 512, "type_vocab_size": 2}
GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
        "n_positions": 1024}
LLAMA = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632,
         "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 16,
         "vocab_size": 32000, "max_position_embeddings": 1024, "tie_word_embeddings": False}


def _stream(config: dict, **kw) -> tuple[int, int, int, int]:
    """(autocast - pure 16-bit activations per sample, layers, s, h), fused attention."""
    shape = shape_from_config(config, seq_len=256)
    mixed = shape.activation_bytes_per_sample(autocast=True, **kw)
    pure = shape.activation_bytes_per_sample(**kw)
    return mixed - pure, shape.layers, shape.seq_len, shape.hidden


def test_the_fp32_stream_adds_each_norms_input_and_each_projections_own_cast():
    """Under autocast over fp32 weights: 2 B more per element for each norm's fp32 input, and a
    16-bit copy for each matmul beyond the first that reads a norm's fp32 output; the stream's
    own tensors at the edges (embedding output, final norm input) are fp32 too (4 s h more)."""
    extra, n, s, h = _stream(BERT_LARGE)
    assert extra == n * 8 * s * h + 4 * s * h  # 2 norms + separate q, k and v: 2 copies more
    extra, n, s, h = _stream(GPT2)
    assert extra == n * 4 * s * h + 4 * s * h  # one fused query-key-value matmul: no copy more
    extra, n, s, h = _stream(LLAMA)
    assert extra == n * 10 * s * h + 4 * s * h  # and gate and up, each its own copy


def test_over_bf16_weights_only_layer_norm_models_keep_an_fp32_stream():
    """CUDA autocast runs layer_norm in fp32 whatever the weights' dtype; an RMSNorm's output
    takes the weights' dtype, so over FSDP's bf16 gathers a Llama's stream is bf16."""
    extra, n, s, h = _stream(BERT_LARGE, fp32_weights=False)
    assert extra == n * 8 * s * h + 4 * s * h
    extra, *_ = _stream(LLAMA, fp32_weights=False)
    assert extra == 0


def test_checkpointing_keeps_fp32_layer_inputs():
    """Full checkpointing keeps each layer's input: the fp32 stream, 4 B an element."""
    # a small vocabulary: the recomputed layer, not the loss, is the larger of the two (the
    # loss's backward is over before the layer is recomputed: only the larger counts)
    extra, n, s, h = _stream({**LLAMA, "vocab_size": 1000}, checkpointing=True)
    assert extra == n * 2 * s * h + 10 * s * h + 4 * s * h  # kept inputs, one layer, edges
    # selective: the recomputed layer's kept input is among the kept ones, not counted again
    extra, n, s, h = _stream({**LLAMA, "vocab_size": 1000}, checkpointing="selective")
    assert extra == n * 2 * s * h + 8 * s * h + 4 * s * h


def test_a_sharded_llama_plan_drops_the_fp32_stream_and_a_bert_plan_keeps_it():
    target = Target(name="8 GPUs", gpus=8, memory_bytes=80 * 2**30, generation="hopper")
    for config, dropped in ((LLAMA, True), (BERT_LARGE, False)):
        shape = shape_from_config(config, seq_len=256)
        fp = from_shape(shape, precision="bf16_mixed", optimizer="adamw", checkpointing=False)
        stream = _stream(config)[0]
        assert fp.fp32_weight_bytes_per_sample == (stream if dropped else 0)
        single = per_gpu_memory(fp, target, "single", 1, 1, 2)
        sharded = per_gpu_memory(fp, target, "fsdp", 1, 8, 2)
        copies = shape.autocast_copy_bytes()
        assert single.activations == fp.memory_at(2, 1).activations
        assert sharded.activations == (fp.memory_at(2, 1).activations - copies
                                       - (2 * stream if dropped else 0))


#: A real CPU step of transformers' BertForMaskedLM in training mode under CUDA's autocast
#: lists, with CUDA's dropout (native_dropout: a 1-byte mask), eager attention: the bytes of the
#: tensors autograd saves, per layer and sample (2 and 4 layers, batch 1 and 2).
SAVED = textwrap.dedent('''
    import json, sys, torch, transformers
    from launcher.estimate.child import _autocast_cuda
    _autocast_cuda.install()
    library = torch.library.Library("aten", "IMPL")
    def dropout(x, p, train):
        if train and 0.0 < p < 1.0 and x.numel() > 0:
            return torch.ops.aten.native_dropout(x, p, train)[0]
        return torch.ops.aten.dropout.default.decompose(x, p, train)
    library.impl("dropout", dropout, "AutogradCPU")
    S, H, A, I = 32, 64, 4, 256
    def saved(layers, batch):
        torch.manual_seed(0)
        config = transformers.BertConfig(hidden_size=H, num_hidden_layers=layers,
                                         num_attention_heads=A, intermediate_size=I,
                                         vocab_size=100, max_position_embeddings=S)
        model = transformers.BertForMaskedLM(config).train()
        model.config._attn_implementation = "eager"
        storages = {}
        def pack(t):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t
        ids = torch.randint(0, 100, (batch, S))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                model(input_ids=ids, labels=ids)
        return sum(storages.values())
    per = {n: saved(n, 2) - saved(n, 1) for n in (2, 4)}
    print(json.dumps((per[4] - per[2]) // 2))
''')


@pytest.mark.slow
def test_a_real_bert_layer_under_autocast_saves_what_the_formula_counts():
    """Per layer and sample: Korthikanti's 34 s h, 7 B per score (fp32 probabilities, the mask,
    the values matmul's bf16 copy) and the fp32 stream's 8 s h, to the byte; the rest is each
    LayerNorm's fp32 mean and reciprocal deviation per token (2 norms x 8 B x s), which the
    formula leaves out. Without the stream term the formula is 8 s h (16 kB here) short."""
    pytest.importorskip("transformers")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", SAVED], cwd=root, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    s, h = 32, 64
    shape = shape_from_config({**BERT_LARGE, "hidden_size": h, "num_attention_heads": 4,
                               "intermediate_size": 256, "vocab_size": 100,
                               "max_position_embeddings": s}, attention="math")
    two, four = (replace(shape, layers=n).activation_bytes_per_sample(autocast=True)
                 for n in (2, 4))
    formula = (four - two) // 2
    assert formula == 34 * s * h + 7 * 4 * s * s + 8 * s * h
    assert measured == formula + 2 * 8 * s


def test_a_for_loop_adamw_holds_two_copies_of_the_largest_parameter():
    """PyTorch's single-tensor AdamW holds ``exp_avg_sq.sqrt()`` and its quotient at once, one
    parameter at a time; foreach holds a copy of every second moment."""
    bert = shape_from_config(BERT_LARGE, seq_len=512)
    assert bert.largest_parameter == 30522 * 1024  # the word embedding
    assert foreach_temporary(bert.parameters, "adamw", "fp32") == 4 * bert.parameters
    assert (foreach_temporary(bert.parameters, "adamw", "fp32", "for-loop",
                              bert.largest_parameter) == 2 * 4 * 30522 * 1024)
    assert foreach_temporary(100, "adamw", "bf16", "for-loop", None) == 200  # unknown: foreach
    assert foreach_temporary(100, "sgd", "fp32", "for-loop", 10) == 0
    fp = from_shape(bert, precision="fp32", optimizer="adamw", checkpointing=True,
                    optimizer_implementation="for-loop")
    assert fp.memory_at(1, 4).temporary == 2 * 4 * 30522 * 1024
    with pytest.raises(ValueError):
        from_shape(bert, precision="fp32", optimizer="adamw", checkpointing=True,
                   optimizer_implementation="fused")


def test_optimizer_impl_is_a_checked_choice(tmp_path):
    from launcher.script_info import ScriptInfo
    from launcher.spec import build_spec
    from launcher.status import UsageError

    info = ScriptInfo(path=tmp_path / "train.py", mode="script")
    spec = build_spec({"params": 7_000_000_000, "optimizer_impl": "for-loop"}, info)
    assert spec.optimizer_impl == "for-loop"
    with pytest.raises(UsageError, match="unknown optimizer_impl"):
        build_spec({"params": 7_000_000_000, "optimizer_impl": "fused"}, info)
