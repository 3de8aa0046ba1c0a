"""A model known only by ``--params``: the published Llama shape assumed for it."""

from __future__ import annotations

import pytest

from launcher.estimate.model_config import (
    ASSUMED_SEQ_LEN,
    REFERENCE_DECODERS,
    assumed_shape,
    shape_from_config,
)

#: The published parameter counts of the references (their model cards / the configs' sums).
PUBLISHED = {"Llama 2 7B": 6_738_415_616, "Llama 2 13B": 13_015_864_320,
             "Llama 2 70B": 68_976_648_192, "Llama 3.1 8B": 8_030_261_248,
             "Llama 3.1 70B": 70_553_706_496, "Llama 3.1 405B": 405_853_388_800}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_each_reference_config_counts_to_its_published_size(name):
    ref = next(r for r in REFERENCE_DECODERS if r.name == name)
    assert shape_from_config(ref.config()).parameters == PUBLISHED[name]


@pytest.mark.parametrize(("params", "reference", "layers", "kv_heads"), [
    (7_000_000_000, "Llama 2 7B", 32, 32),
    (8_000_000_000, "Llama 3.1 8B", 32, 8),
    (13_000_000_000, "Llama 2 13B", 40, 40),
    (30_000_000_000, "LLaMA 30B", 55, 52),
    (70_000_000_000, "Llama 3.1 70B", 80, 8),
])
def test_a_count_takes_the_nearest_published_shape(params, reference, layers, kv_heads):
    assumed = assumed_shape(params)
    shape = assumed.shape
    assert assumed.reference.name == reference
    assert (shape.layers, shape.kv_heads) == (layers, kv_heads)
    assert shape.parameters == params  # the model states stay the declared count
    assert shape.seq_len == ASSUMED_SEQ_LEN
    assert shape.knows_activations
    assert shape.layer_parameters is not None and shape.layer_parameters < params / layers


def test_a_count_between_references_changes_the_depth_to_match():
    shape = assumed_shape(20_000_000_000).shape  # between 13B and 30B: Llama 2 13B's layers
    counted = shape_from_config(
        next(r for r in REFERENCE_DECODERS if r.name == "Llama 2 13B").config(shape.layers))
    assert abs(counted.parameters - 20e9) < counted.layer_parameters  # within a layer


def test_the_note_says_what_was_assumed_and_how_to_override():
    note = assumed_shape(30_000_000_000, seq_len=2048).note
    assert "LLaMA 30B" in note and "huggyllama/llama-30b" in note
    assert "55 layers deep (it has 60)" in note
    assert "sequence 2048;" in note  # given: not called an assumption
    assert "--model-config" in note and "--layers" in note
    assert assumed_shape(30_000_000_000, seq_len=2048).shape.seq_len == 2048


@pytest.mark.parametrize("params", ["9", "1M", "125M"])
def test_a_count_below_the_references_assumes_no_shape(cli, params):
    """Below a billion parameters a Llama shape would be mostly vocabulary (a "9-parameter"
    model became a one-layer decoder with 128K tokens at sequence 4096, and nothing fit): the
    model is planned on its states, as before, and no shape is said to be assumed."""
    result = cli("plan", "--params", params, "--json")
    assert result.status == 0, result.stderr
    data = result.json()
    assert data["chosen"] is not None
    assert not any("shape assumed" in note for note in data["notes"])
