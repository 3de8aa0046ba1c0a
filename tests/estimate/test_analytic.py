"""Parameter counts from config.json against the published counts; activations by the formula."""

from dataclasses import replace

import pytest

from launcher.estimate.model_config import shape_from_config, shape_from_params

LLAMA2_7B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
             "vocab_size": 32000, "max_position_embeddings": 4096, "tie_word_embeddings": False}
MISTRAL_7B = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "vocab_size": 32000, "max_position_embeddings": 32768,
              "tie_word_embeddings": False}
MIXTRAL_8X7B = {**MISTRAL_7B, "model_type": "mixtral", "num_local_experts": 8,
                "num_experts_per_tok": 2}
GPT2 = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
        "n_positions": 1024}
BERT_BASE = {"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12,
             "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 30522,
             "max_position_embeddings": 512, "type_vocab_size": 2}
NEOX_20B = {"model_type": "gpt_neox", "hidden_size": 6144, "num_hidden_layers": 44,
            "num_attention_heads": 64, "intermediate_size": 24576, "vocab_size": 50432,
            "max_position_embeddings": 2048, "tie_word_embeddings": False}


@pytest.mark.parametrize("config,published", [
    (LLAMA2_7B, 6_738_415_616),      # Llama-2-7b-hf model card / safetensors index
    (MISTRAL_7B, 7_241_732_096),     # Mistral-7B-v0.1
    (MIXTRAL_8X7B, 46_702_792_704),  # Mixtral-8x7B-v0.1
    (GPT2, 124_439_808),             # gpt2 (GPT2Model)
    (BERT_BASE, 109_482_240),        # bert-base-uncased (BertModel with pooler)
    (NEOX_20B, 20_554_567_680),      # EleutherAI/gpt-neox-20b
])
def test_parameter_count_is_exact(config, published):
    assert shape_from_config(config).parameters == published


def test_mixtral_active_parameters_are_two_experts():
    shape = shape_from_config(MIXTRAL_8X7B)
    assert 12.5e9 < shape.active_parameters < 13.0e9  # "12.9B active parameters"


def test_korthikanti_formula_at_gpt3_shape():
    # GPT-3 175B-like layer without flash attention: s h (34 + 5 a s / h) per layer (16-bit).
    s, h, a = 2048, 12288, 96
    shape = shape_from_params(175_000_000_000, layers=1, hidden=h, heads=a, vocab=1, seq_len=s)
    per_layer = shape.activation_bytes_per_sample(flash=False) - s * 1 * 12 - 4 * s * h
    assert per_layer == s * h * 34 + 5 * a * s * s


def test_flash_attention_drops_the_quadratic_term_and_checkpointing_shrinks():
    shape = shape_from_config(LLAMA2_7B, seq_len=4096)
    eager = shape.activation_bytes_per_sample(flash=False)
    flash = shape.activation_bytes_per_sample(flash=True)
    ckpt = shape.activation_bytes_per_sample(flash=True, checkpointing=True)
    assert eager > flash > ckpt
    assert eager - flash == 32 * 5 * 32 * 4096 * 4096


def test_params_alone_leave_activations_unknown():
    assert shape_from_params(30_000_000_000).activation_bytes_per_sample() is None


# Encoder-decoder models: the configs of the checkpoints named, as their config.json has them.
T5_SMALL = {"model_type": "t5", "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6,
            "num_heads": 8, "vocab_size": 32128, "relative_attention_num_buckets": 32,
            "feed_forward_proj": "relu", "n_positions": 512}
FLAN_T5_SMALL = {"model_type": "t5", "d_model": 512, "d_kv": 64, "d_ff": 1024, "num_layers": 8,
                 "num_decoder_layers": 8, "num_heads": 6, "vocab_size": 32128,
                 "relative_attention_num_buckets": 32, "feed_forward_proj": "gated-gelu",
                 "tie_word_embeddings": False, "n_positions": 512}
MT5_SMALL = {**FLAN_T5_SMALL, "model_type": "mt5", "vocab_size": 250112}
BART_BASE = {"model_type": "bart", "d_model": 768, "encoder_layers": 6, "decoder_layers": 6,
             "encoder_attention_heads": 12, "decoder_attention_heads": 12,
             "encoder_ffn_dim": 3072, "decoder_ffn_dim": 3072, "vocab_size": 50265,
             "max_position_embeddings": 1024}
BART_LARGE = {**BART_BASE, "d_model": 1024, "encoder_layers": 12, "decoder_layers": 12,
              "encoder_attention_heads": 16, "decoder_attention_heads": 16,
              "encoder_ffn_dim": 4096, "decoder_ffn_dim": 4096}
MBART_LARGE_CC25 = {**BART_LARGE, "model_type": "mbart", "vocab_size": 250027}
WHISPER_TINY = {"model_type": "whisper", "d_model": 384, "encoder_layers": 4,
                "decoder_layers": 4, "encoder_attention_heads": 6, "decoder_attention_heads": 6,
                "encoder_ffn_dim": 1536, "decoder_ffn_dim": 1536, "vocab_size": 51865,
                "num_mel_bins": 80, "max_source_positions": 1500, "max_target_positions": 448}


@pytest.mark.parametrize("config,published", [
    (T5_SMALL, 60_506_624),           # t5-small (T5ForConditionalGeneration, tied)
    (FLAN_T5_SMALL, 76_961_152),      # google/flan-t5-small (its own output layer)
    (MT5_SMALL, 300_176_768),         # google/mt5-small
    (BART_BASE, 139_420_416),         # facebook/bart-base
    (BART_LARGE, 406_291_456),        # facebook/bart-large
    (MBART_LARGE_CC25, 610_851_840),  # facebook/mbart-large-cc25
    (WHISPER_TINY, 37_760_640),       # openai/whisper-tiny
], ids=["t5", "flan_t5", "mt5", "bart_base", "bart_large", "mbart", "whisper"])
def test_encoder_decoder_parameter_count_is_exact(config, published):
    assert shape_from_config(config).parameters == published


#: Small configs with uneven stacks, so that an encoder counted as a decoder (or the other way
#: round) shows. transformers builds each on the meta device (no memory) and counts.
SMALL_ENCODER_DECODERS = {
    "t5": {"model_type": "t5", "d_model": 64, "d_kv": 8, "d_ff": 96, "num_layers": 2,
           "num_decoder_layers": 3, "num_heads": 4, "vocab_size": 256,
           "relative_attention_num_buckets": 8},
    "t5_gated": {"model_type": "t5", "d_model": 64, "d_kv": 16, "d_ff": 96, "num_layers": 3,
                 "num_decoder_layers": 2, "num_heads": 4, "vocab_size": 256,
                 "feed_forward_proj": "gated-gelu"},
    "mt5": {"model_type": "mt5", "d_model": 64, "d_kv": 16, "d_ff": 96, "num_layers": 2,
            "num_heads": 4, "vocab_size": 256},
    "bart": {"model_type": "bart", "d_model": 64, "encoder_layers": 2, "decoder_layers": 3,
             "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 96,
             "decoder_ffn_dim": 128, "vocab_size": 256, "max_position_embeddings": 40},
    "mbart": {"model_type": "mbart", "d_model": 64, "encoder_layers": 3, "decoder_layers": 2,
              "encoder_attention_heads": 4, "decoder_attention_heads": 4,
              "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "vocab_size": 256,
              "max_position_embeddings": 40},
    "whisper": {"model_type": "whisper", "d_model": 64, "encoder_layers": 2, "decoder_layers": 3,
                "encoder_attention_heads": 4, "decoder_attention_heads": 4,
                "encoder_ffn_dim": 128, "decoder_ffn_dim": 96, "vocab_size": 256,
                "num_mel_bins": 16, "max_source_positions": 32, "max_target_positions": 48,
                "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
                "decoder_start_token_id": 1},
}


@pytest.mark.parametrize("name", SMALL_ENCODER_DECODERS)
def test_encoder_decoder_count_is_transformers_own(name):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = SMALL_ENCODER_DECODERS[name]
    head = (transformers.AutoModelForSpeechSeq2Seq if name == "whisper"
            else transformers.AutoModelForSeq2SeqLM)
    with torch.device("meta"):
        model = head.from_config(transformers.AutoConfig.for_model(**config))
    shape = shape_from_config(config)
    assert shape.parameters == model.num_parameters()
    # The FSDP unit: the largest block (a decoder layer, with its cross-attention).
    blocks = [b for m in model.modules() if isinstance(m, torch.nn.ModuleList) for b in m]
    assert shape.layer_parameters == max(sum(p.numel() for p in b.parameters()) for b in blocks)
    encoder = model.get_encoder()
    assert shape.encoder_parameters == sum(
        p.numel() for n, p in encoder.named_parameters() if "embed_tokens" not in n)


def test_encoder_decoder_lengths():
    # T5 and BART: one --seq-len for both stacks, else the config's positions.
    t5 = shape_from_config(T5_SMALL)
    assert (t5.layers, t5.encoder_layers, t5.seq_len, t5.encoder_seq_len) == (6, 6, 512, None)
    assert shape_from_config(BART_BASE, seq_len=256).seq_len == 256
    # Whisper: the encoder is as long as its config says whatever the decoder's length.
    whisper = shape_from_config(WHISPER_TINY, seq_len=128)
    assert (whisper.seq_len, whisper.encoder_seq_len) == (128, 1500)
    assert shape_from_config(WHISPER_TINY).seq_len == 448


def test_encoder_decoder_activations():
    s, h, a, v = 512, 512, 8, 32128
    t5 = shape_from_config(T5_SMALL, seq_len=s)
    flash = t5.activation_bytes_per_sample(flash=True)
    eager = t5.activation_bytes_per_sample(flash=False)
    # Without flash: the encoder's and the decoder's self-attention scores, and the decoder's
    # cross-attention scores (queries of the decoder x keys of the encoder).
    assert eager - flash == 6 * 5 * a * s * s + 6 * (5 * a * s * s + 5 * a * s * s)
    # A decoder layer is an encoder layer plus cross-attention (5 s h + 4 e h) and a norm
    # (2 s h); the encoder adds its embedding's output and final norm (4 e h) at the edges.
    single = replace(t5, encoder_layers=0, layers=12)  # the same 12 layers, none crossing
    assert flash - single.activation_bytes_per_sample() == (
        6 * (5 * s * h + 4 * s * h + 2 * s * h) + 4 * s * h)
    assert t5.activation_bytes_per_sample(element_bytes=4) > flash
    ckpt = t5.activation_bytes_per_sample(checkpointing=True)
    assert flash > ckpt > 12 * 2 * s * h + s * v * 10
    # Whisper: a short decoder over a long encoder, and the convolution front end.
    whisper = shape_from_config(WHISPER_TINY, seq_len=64)
    longer = shape_from_config(WHISPER_TINY, seq_len=128)
    assert longer.activation_bytes_per_sample() > whisper.activation_bytes_per_sample()
    front = replace(whisper, audio_channels=0)
    e, hw = 1500, 384
    assert (whisper.activation_bytes_per_sample() - front.activation_bytes_per_sample()
            == 4 * 80 * e + 10 * e * hw)


def test_encoder_decoder_flops():
    s, h = 512, 512
    t5 = shape_from_config(T5_SMALL, seq_len=s)
    # Both stacks s tokens long: 6 N s, and the attention of 6 encoder, 6 decoder self- and 6
    # cross-attention layers.
    assert t5.flops_per_sample() == 6 * t5.parameters * s + 12 * h * (6 + 6 + 6) * s * s
    whisper = shape_from_config(WHISPER_TINY, seq_len=448)
    e, d = 1500, 448
    decoder = whisper.parameters - whisper.encoder_parameters
    assert whisper.flops_per_sample() == 6 * (whisper.encoder_parameters * e + decoder * d) + (
        12 * 384 * (4 * e * e + 4 * d * d + 4 * d * e))


def test_attention_kind_math_adds_the_quadratic_term():
    """``--attention math`` (or a config whose ``attn_implementation`` is eager) keeps the
    probabilities, dropout mask (1 B) and dropout output: 5 a s^2 bytes a layer at 16 bits, 9
    at fp32; flash and efficient keep O(s) statistics, and so does SDPA's choice (the
    default)."""
    s, h, a, n = 1024, 1600, 25, 48  # GPT-2 XL
    xl = {**GPT2, "n_embd": h, "n_layer": n, "n_head": a, "n_positions": s}
    default = shape_from_config(xl)
    assert default.attention is None and default.fused_attention
    math = shape_from_config(xl, attention="math")
    for kind in ("flash", "efficient"):
        assert (shape_from_config(xl, attention=kind).activation_bytes_per_sample()
                == default.activation_bytes_per_sample())
    for element, per_score in ((2, 5), (4, 9)):
        assert (math.activation_bytes_per_sample(element_bytes=element)
                - default.activation_bytes_per_sample(element_bytes=element)
                == n * per_score * a * s * s)
    # checkpointing recomputes one layer at a time: one layer's scores, where that layer is
    # more than the loss's backward (which is over before the last layer is recomputed)
    small_vocab = {**xl, "vocab_size": 1000}
    assert (shape_from_config(small_vocab, attention="math").activation_bytes_per_sample(
        checkpointing=True) - shape_from_config(small_vocab).activation_bytes_per_sample(
        checkpointing=True) == 5 * a * s * s)
    # GPT-2's 50,257 logits at 12 B outweigh one layer with its scores: attention changes
    # nothing there
    assert (math.activation_bytes_per_sample(checkpointing=True)
            == default.activation_bytes_per_sample(checkpointing=True))
    # per layer and sample, 16-bit: s h (34 + 5 a s / h) with math, 34 s h fused
    one = {**xl, "n_layer": 1, "vocab_size": 1}
    edges = s * 12 + 4 * s * h  # logits of a 1-token vocabulary, embedding output, final norm
    assert (shape_from_config(one, attention="math").activation_bytes_per_sample() - edges
            == s * h * (34 + 5 * a * s // h))
    assert shape_from_config(one).activation_bytes_per_sample() - edges == 34 * s * h


def test_config_attn_implementation_names_the_kernel():
    assert shape_from_config({**GPT2, "attn_implementation": "eager"}).attention == "math"
    assert shape_from_config({**GPT2, "_attn_implementation": "flash_attention_2"}
                             ).attention == "flash"
    assert shape_from_config({**GPT2, "attn_implementation": "sdpa"}).attention is None
    # the flag wins over the config
    assert shape_from_config({**GPT2, "attn_implementation": "eager"},
                             attention="flash").attention == "flash"
    assert shape_from_params(7_000_000_000, attention="math").attention == "math"


def test_attention_flag_is_a_checked_choice(tmp_path):
    from launcher.script_info import ScriptInfo
    from launcher.spec import build_spec
    from launcher.status import UsageError

    info = ScriptInfo(path=tmp_path / "train.py", mode="script")
    spec = build_spec({"params": 7_000_000_000, "attention": "math"}, info)
    assert spec.attention == "math"
    with pytest.raises(UsageError, match="unknown attention"):
        build_spec({"params": 7_000_000_000, "attention": "sliding"}, info)


def test_autocast_keeps_fp32_probabilities_in_eager_attention():
    """Under autocast (bf16_mixed) softmax runs in fp32: eager attention keeps fp32
    probabilities (4 B), the 1-byte dropout mask and the 16-bit copy the matmul with the values
    casts and saves (2 B): 7 B per score, 2 more than Korthikanti's 16-bit 5. Fused kernels keep
    no scores, so autocast changes nothing there."""
    s, h, a, n = 1024, 1600, 25, 48
    xl = {**GPT2, "n_embd": h, "n_layer": n, "n_head": a, "n_positions": s}
    math = shape_from_config(xl, attention="math")
    assert math.score_bytes(2, autocast=True) == 7 and math.score_bytes(2) == 5
    assert math.score_bytes(4) == 9
    fused = shape_from_config(xl)
    # the fp32 stream under autocast (test_analytic_autocast.py) is the same with either kernel
    stream = n * 4 * s * h + 4 * s * h  # GPT-2: its norms' fp32 inputs, one fused qkv cast
    assert (fused.activation_bytes_per_sample(autocast=True)
            - fused.activation_bytes_per_sample() == stream)
    assert (math.activation_bytes_per_sample(autocast=True)
            - math.activation_bytes_per_sample() == n * 2 * a * s * s + stream)


def test_loss_keeps_12_bytes_per_logit_in_any_precision():
    """At the loss's backward: the fp32 log-softmax output, its gradient and its input's
    gradient, 4 B each, whatever the logits' dtype."""
    s, v = 512, 50_000
    shape = shape_from_config({**LLAMA2_7B, "vocab_size": v}, seq_len=s)
    no_vocab = replace(shape, vocab=0)
    for element in (2, 4):
        assert (shape.activation_bytes_per_sample(element_bytes=element)
                - no_vocab.activation_bytes_per_sample(element_bytes=element) == 12 * s * v)


def test_autocast_weight_copies_are_per_step_and_left_out_of_sharded_plans():
    """bf16_mixed (autocast over fp32 weights) keeps a 2-byte copy of every matmul weight from
    the forward to the backward: every weight but the embedding lookup's, plus the embedding
    matrix again when the output layer is tied to it. Per step, not per sample; FSDP's bf16
    gathered weights are not cast, so a sharded plan has none."""
    from launcher.estimate.footprint import from_shape
    from launcher.plan.memory import Target, per_gpu_memory

    llama = shape_from_config(LLAMA2_7B, seq_len=256)
    assert not llama.tied_output
    assert llama.autocast_copy_bytes() == 2 * (llama.parameters - 32000 * 4096)
    bert = shape_from_config({"model_type": "bert", "hidden_size": 1024,
                              "num_hidden_layers": 24, "num_attention_heads": 16,
                              "intermediate_size": 4096, "vocab_size": 30522,
                              "max_position_embeddings": 512, "type_vocab_size": 2})
    assert bert.tied_output
    assert bert.autocast_copy_bytes() == 2 * (bert.parameters - bert.embedding_parameters
                                              + 30522 * 1024)
    assert shape_from_params(7_000_000_000).autocast_copy_bytes() is None
    mixed = from_shape(llama, precision="bf16_mixed", optimizer="adamw", checkpointing=False)
    pure = from_shape(llama, precision="bf16", optimizer="adamw", checkpointing=False)
    copies = llama.autocast_copy_bytes()
    # and per sample the fp32 stream over fp32 weights (test_analytic_autocast.py)
    stream = mixed.fp32_weight_bytes_per_sample
    assert stream > 0
    for b in (1, 3):
        assert (mixed.memory_at(b, 1).activations - pure.memory_at(b, 1).activations
                == copies + b * stream)
    target = Target(name="8 GPUs", gpus=8, memory_bytes=80 * 2**30, generation="hopper")
    single = per_gpu_memory(mixed, target, "single", 1, 1, 2)
    sharded = per_gpu_memory(mixed, target, "fsdp", 1, 8, 2)
    assert single.activations == mixed.memory_at(2, 1).activations
    assert sharded.activations == mixed.memory_at(2, 1).activations - copies - 2 * stream


def test_a_matmul_under_autocast_saves_one_cached_16_bit_copy_of_its_weight():
    """What ``autocast_copy_bytes`` counts, on torch's own autocast (CPU's, which caches casts
    as CUDA's does): the linear's backward keeps the bf16 copy of its fp32 weight, 2 B per
    weight, and a second use of the weight in the same region reuses the cached copy."""
    torch = pytest.importorskip("torch")
    linear = torch.nn.Linear(256, 512)
    x = torch.randn(4, 256, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        first, second = linear(x), linear(x)
    saved = first.grad_fn._saved_mat2
    assert saved.dtype == torch.bfloat16
    assert saved.untyped_storage().nbytes() == 2 * linear.weight.numel()
    assert (second.grad_fn._saved_mat2.untyped_storage().data_ptr()
            == saved.untyped_storage().data_ptr())


LOSS_HEAD = '''
import torch, torch.nn as nn, torch.nn.functional as F
V, D, S = 16384, 32, 128

class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.head = nn.Embedding(V, D), nn.Linear(D, V, bias=False)

    def forward(self, idx):
        return self.head(self.wte(idx))

def build_model():
    return Head()

def example_batch(batch_size):
    idx = torch.randint(0, V, (batch_size, S + 1))
    return idx[:, :-1].contiguous(), idx[:, 1:].contiguous()

def training_step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x).reshape(-1, V).float(), y.reshape(-1))
'''


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16_mixed"])
def test_a_real_cpu_step_keeps_12_bytes_per_logit(tmp_path, precision):
    """``LOSS_BYTES_PER_LOGIT`` against the CPU allocator's record of two real steps of a
    model that is all logits: each more sample adds 12 B per logit to the peak, in fp32 and
    under autocast alike (measured 12.005 and 12.009 B at 256 x 32768 logits a sample)."""
    from launcher.estimate.analytic import LOSS_BYTES_PER_LOGIT
    from launcher.estimate.traced import measure_recipe

    recipe = tmp_path / "head.py"
    recipe.write_text(LOSS_HEAD)
    peaks = [measure_recipe(recipe, micro_batch=b, precision=precision, optimizer="sgd",
                            max_grad_norm=None).peak_allocated for b in (1, 2)]
    per_logit = (peaks[1] - peaks[0]) / (128 * 16384)
    assert per_logit == pytest.approx(LOSS_BYTES_PER_LOGIT, rel=0.01)


#: Fine-tunes for labels: ``architectures`` names a sequence classifier (decoders score every
#: position with a bias-free ``score``; BERT and RoBERTa classify the pooled first token).
CLASSIFIERS = {
    "bert": {**BERT_BASE, "architectures": ["BertForSequenceClassification"]},
    "roberta": {"model_type": "roberta", "hidden_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 300,
                "max_position_embeddings": 66, "type_vocab_size": 1, "num_labels": 3,
                "architectures": ["RobertaForSequenceClassification"]},
    "llama": {**LLAMA2_7B, "architectures": ["LlamaForSequenceClassification"],
              "id2label": {str(i): f"l{i}" for i in range(5)}},
    "gpt2": {**GPT2, "architectures": ["GPT2ForSequenceClassification"]},
    "gpt_neox": {"model_type": "gpt_neox", "hidden_size": 64, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 300,
                 "max_position_embeddings": 64,
                 "architectures": ["GPTNeoXForSequenceClassification"]},
}


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_a_sequence_classifier_is_counted_as_transformers_builds_it(name):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = CLASSIFIERS[name]
    with torch.device("meta"):
        model = getattr(transformers, config["architectures"][0])(
            transformers.AutoConfig.for_model(**config))
    shape = shape_from_config(config, seq_len=128)
    assert shape.parameters == model.num_parameters()
    assert shape.labels == model.config.num_labels
    # no s x vocab logits and no output matrix for autocast to cast: what the LM head had more
    lm = shape_from_config({k: v for k, v in config.items() if k != "architectures"},
                           seq_len=128)
    s, v, labels = 128, config["vocab_size"], shape.labels
    dropped = lm.activation_bytes_per_sample() - shape.activation_bytes_per_sample()
    assert dropped == s * (v - labels) * 12
    assert not shape.tied_output


@pytest.mark.parametrize("config", [
    # transformers 5: num_labels wins over an id2label of another length
    {**BERT_BASE, "architectures": ["BertForSequenceClassification"], "num_labels": 5,
     "id2label": {"0": "a", "1": "b", "2": "c"}},
    # a GPT-2 whose config unties the output layer (GPT2LMHeadModel then has its own)
    {**GPT2, "architectures": ["GPT2LMHeadModel"], "tie_word_embeddings": False},
], ids=["num_labels_over_id2label", "gpt2_untied"])
def test_counts_follow_transformers_on_conflicting_fields(config):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = getattr(transformers, config["architectures"][0])(
            transformers.AutoConfig.for_model(**config))
    shape = shape_from_config(config)
    assert shape.parameters == model.num_parameters()
    if "num_labels" in config:
        assert shape.labels == model.config.num_labels == 5
