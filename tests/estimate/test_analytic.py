"""Parameter counts from config.json against the published counts; activations by the formula."""

import pytest

from launcher.estimate.analytic import shape_from_config, shape_from_params

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
    per_layer = shape.activation_bytes_per_sample(flash=False) - s * 1 * 10 - 4 * s * h
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
