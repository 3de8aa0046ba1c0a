"""Model states follow from the parameter count: the ZeRO paper's 16 bytes/param and friends."""

from launcher.estimate.states import model_states

N = 30_000_000_000


def test_mixed_precision_adamw_is_16_bytes_per_param():
    states = model_states(N, "bf16_mixed", "adamw")
    assert states.total == 16 * N  # 480 GB for 30B: the sagemaker-30b-ddp-oom seed


def test_pure_bf16_adamw_is_8_bytes_per_param():
    assert model_states(N, "bf16", "adamw").total == 8 * N


def test_sharding_divides_model_states():
    full = model_states(N, "bf16_mixed", "adamw")
    sharded = model_states(N, "bf16_mixed", "adamw", shard_degree=16)
    assert sharded.total == full.total // 16


def test_frozen_parameters_have_no_gradients_or_optimizer_state():
    states = model_states(1000, "fp32", "adamw", trainable=100)
    assert (states.parameters, states.gradients, states.optimizer) == (4000, 400, 800)


def test_adafactor_depends_on_shapes():
    assert model_states(1000, "fp32", "adafactor").optimizer is None
