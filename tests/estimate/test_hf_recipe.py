"""A Hugging Face config.json planned through transformers: built on fake tensors and traced.

``launch plan train.py --model-config config.json`` with transformers installed writes a recipe
for the config (launcher/estimate/hf_recipe.py) and traces it instead of using the analytic
formulas. Checked here on a tiny Llama, a tiny BERT and a tiny T5 (encoder-decoder): the traced
parameter count is transformers' own, and the traced peak is within 1% of a real CPU step of the
same recipe (``measure_recipe``: the CPU allocator's own record). Each trace and measurement is a
child process importing torch and transformers: a few seconds each.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from launcher.estimate import model_config
from launcher.estimate.footprint import Footprint
from launcher.estimate.hf_recipe import RECIPE_SOURCE, SIDECAR_NAME, write_recipe
from launcher.script_info import Hardware, ScriptInfo
from launcher.spec import Spec

SEQ_LEN = 32
MICRO = 4

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    # A checkpoint's dtype: the recipe builds fp32 weights anyway (the precision is launch's).
    "torch_dtype": "bfloat16",
}
TINY_BERT = {
    "architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "vocab_size": 256, "max_position_embeddings": 64, "type_vocab_size": 2,
    "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
}

TINY_T5 = {
    "architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "d_model": 64,
    "d_kv": 16, "d_ff": 128, "num_layers": 2, "num_decoder_layers": 2, "num_heads": 4,
    "vocab_size": 256, "relative_attention_num_buckets": 8, "n_positions": 512,
    "feed_forward_proj": "relu", "decoder_start_token_id": 0, "pad_token_id": 0,
}
#: Encoder-decoder configs the recipe builds in-process (tiny, real CPU tensors).
SEQ2SEQ = {
    "t5": (TINY_T5, "T5ForConditionalGeneration", ("T5Block",)),
    # FLAN-T5's config: gated MLP, an output layer of its own; no architectures given.
    "flan_t5": ({**{k: v for k, v in TINY_T5.items() if k != "architectures"},
                 "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False},
                "T5ForConditionalGeneration", ("T5Block",)),
    # BartModel has no loss: the recipe takes the sequence-to-sequence head, not BartForCausalLM.
    "bart": ({"architectures": ["BartModel"], "model_type": "bart", "d_model": 64,
              "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
              "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128,
              "vocab_size": 256, "max_position_embeddings": 64},
             "BartForConditionalGeneration", ("BartDecoderLayer", "BartEncoderLayer")),
    "whisper": ({"model_type": "whisper", "d_model": 64, "encoder_layers": 2,
                 "decoder_layers": 2, "encoder_attention_heads": 4,
                 "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128,
                 "vocab_size": 256, "num_mel_bins": 16, "max_source_positions": 32,
                 "max_target_positions": 64, "pad_token_id": 0, "bos_token_id": 1,
                 "eos_token_id": 2, "decoder_start_token_id": 1},
                "WhisperForConditionalGeneration", ("WhisperDecoderLayer", "WhisperEncoderLayer")),
}


UNKNOWN = "llama_from_the_future"  # a model_type a newer transformers may know


def _write(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return path


def _spec_info(folder: Path, config: dict) -> tuple[Spec, ScriptInfo]:
    """A plain script described by ``config``, planned on this machine's CPU."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "train.py"
    script.write_text("print('training')\n")
    spec = Spec(script=script, mode="script", model_config=_write(folder, config),
                seq_len=SEQ_LEN, micro_batch_size=MICRO, global_batch_size=2 * MICRO,
                precision="fp32", optimizer="adamw")
    info = ScriptInfo(path=script, mode="script",
                      hardware=Hardware(cpus=2, host_memory_bytes=64 << 30))
    return spec, info


class Runs:
    """Every child process of these tests, started at once (each imports torch and
    transformers: seconds of CPU that overlap)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.pool = ThreadPoolExecutor(3)
        self.futures: dict[str, Future] = {}
        self.footprints: dict[Path, list[Footprint]] = {}
        self.lock = threading.Lock()

    def plan(self, name: str, config: dict) -> None:
        from launcher.preflight import preflight

        spec, info = _spec_info(self.dir / name, config)
        self.futures[name] = self.pool.submit(
            preflight, spec, info, self.dir / name / "state", {"LAUNCH_NO_TRACE": "0"})

    def measure(self, name: str) -> None:
        """A real CPU step of the recipe ``plan(name)`` has its preflight write (the same
        folder: it is named by the hash of the config, written by ``plan``)."""
        from launcher.estimate.traced import measure_recipe

        recipe = write_recipe(self.dir / name / "config.json", SEQ_LEN,
                              self.dir / name / "state" / "hf_recipes")
        self.futures[f"{name}_real"] = self.pool.submit(
            measure_recipe, recipe, micro_batch=MICRO, precision="fp32", optimizer="adamw",
            grad_accum_steps=2, timeout_s=300)

    def get(self, key: str):
        return self.futures[key].result()

    def made(self, name: str) -> list[Footprint]:
        self.get(name)
        return self.footprints[self.dir / name / "config.json"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    pytest.importorskip("transformers")
    import launcher.footprints as footprints_module

    r = Runs(tmp_path_factory.mktemp("hf"))
    real = footprints_module.hf_traced

    def spy(spec, *args, **kwargs):  # keeps the footprints preflight's Footprints made
        footprint = real(spec, *args, **kwargs)
        with r.lock:
            r.footprints.setdefault(spec.model_config, []).append(footprint)
        return footprint

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(footprints_module, "hf_traced", spy)
        # The analytic formulas size UNKNOWN like a Llama; transformers does not know it.
        patch.setattr(model_config, "LLAMA_LIKE", (*model_config.LLAMA_LIKE, UNKNOWN))
        patch.setattr(model_config, "SUPPORTED", (*model_config.SUPPORTED, UNKNOWN))
        r.plan("llama", TINY_LLAMA)
        r.measure("llama")
        r.plan("bert", TINY_BERT)
        r.measure("bert")
        r.plan("t5", TINY_T5)
        r.measure("t5")
        unknown = {k: v for k, v in TINY_LLAMA.items() if k != "architectures"}
        r.plan("unknown", {**unknown, "model_type": UNKNOWN})
        yield r
        r.pool.shutdown(wait=True)


def test_the_recipe_is_fixed_text_and_the_config_is_data(tmp_path):
    hostile = {**TINY_LLAMA, "name_or_path": '"""\nimport os; os.system("boom")\n"""'}
    one = write_recipe(_write(tmp_path / "a", TINY_LLAMA), SEQ_LEN, tmp_path / "recipes")
    two = write_recipe(_write(tmp_path / "b", hostile), SEQ_LEN, tmp_path / "recipes")
    again = write_recipe(_write(tmp_path / "c", TINY_LLAMA), SEQ_LEN, tmp_path / "recipes")
    assert one.read_text() == two.read_text() == RECIPE_SOURCE
    assert one.parent != two.parent and again == one  # one folder per config and length
    sidecar = json.loads((two.parent / SIDECAR_NAME).read_text())
    assert sidecar == {"config": hostile, "seq_len": SEQ_LEN}
    assert "boom" not in two.read_text()
    longer = write_recipe(_write(tmp_path / "d", TINY_LLAMA), 2 * SEQ_LEN, tmp_path / "recipes")
    assert longer.parent != one.parent


@pytest.mark.slow
@pytest.mark.parametrize("name, config, head", [("llama", TINY_LLAMA, "AutoModelForCausalLM"),
                                                ("bert", TINY_BERT, "AutoModelForMaskedLM"),
                                                ("t5", TINY_T5, "AutoModelForSeq2SeqLM")],
                         ids=["llama", "bert", "t5"])
def test_config_is_traced_through_transformers(runs, name, config, head):
    import transformers

    made = runs.made(name)
    assert len(made) == 1  # the first plan fits: one trace
    footprint = made[0]
    assert footprint.kind == "traced", footprint.note
    assert footprint.note == ""
    # The analytic shape still gives the FSDP unit and the FLOPs.
    shape = model_config.shape_from_config(config, seq_len=SEQ_LEN)
    assert footprint.unit_parameters == shape.layer_parameters
    assert footprint.flops_per_sample == shape.flops_per_sample()

    # The parameters are transformers' own count of the real model.
    model = getattr(transformers, head).from_config(transformers.AutoConfig.for_model(**config))
    assert footprint.parameters == model.num_parameters()
    if name in ("llama", "t5"):
        assert footprint.parameters == shape.parameters  # and the analytic count agrees

    # The recipe was written under the state dir; a real CPU step of it is what was traced.
    recipes = list((runs.dir / name / "state" / "hf_recipes").glob("*/recipe.py"))
    assert len(recipes) == 1
    real = runs.get(f"{name}_real").peak_allocated
    traced = footprint.memory_at(MICRO).peak_allocated
    assert traced == pytest.approx(real, rel=0.01), (traced, real)
    memory = footprint.memory_at(MICRO)
    assert memory.activations > 0
    # fp32 weights, whatever dtype the checkpoint's config names (plus a few small buffers).
    assert 0 <= memory.parameters - 4 * footprint.parameters < 4096
    chosen = runs.get(name).chosen
    assert chosen is not None and chosen.micro_batch_size == MICRO
    assert chosen.memory.peak_allocated == traced  # one CPU process: the footprint as traced


@pytest.mark.parametrize("name", SEQ2SEQ)
def test_encoder_decoder_recipe(tmp_path, name):
    """The recipe of an encoder-decoder config builds its sequence-to-sequence head, feeds its
    encoder and decoder, and holds the weights the analytic shape counts."""
    pytest.importorskip("transformers")
    import importlib.util

    import torch

    config, head, blocks = SEQ2SEQ[name]
    path = write_recipe(_write(tmp_path, config), 16, tmp_path / "recipes")
    spec = importlib.util.spec_from_file_location(f"hf_recipe_{name}", path)
    assert spec is not None and spec.loader is not None
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    model = recipe.build_model()
    assert type(model).__name__ == head and model.training
    batch = recipe.example_batch(3)
    assert batch["decoder_input_ids"].shape == batch["labels"].shape == (3, 16)
    if name == "whisper":  # the encoder's length is the config's: 2 frames per position
        assert batch["input_features"].shape == (3, 16, 64) and "input_ids" not in batch
    else:
        assert batch["input_ids"].shape == (3, 16)
    loss = recipe.training_step(model, batch)
    assert loss.ndim == 0 and torch.isfinite(loss)
    assert sorted(t.__name__ for t in recipe.wrap_modules()) == sorted(blocks)
    shape = model_config.shape_from_config(config, seq_len=16)
    assert model.num_parameters() == shape.parameters
    if name == "flan_t5":  # transformers ties T5's output layer regardless; the recipe unties
        assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight


@pytest.mark.slow
def test_unknown_model_type_falls_back_to_the_analytic_estimate(runs):
    result = runs.get("unknown")
    made = runs.made("unknown")
    footprint = made[0]
    assert footprint.kind == "config"
    assert f"does not know model_type {UNKNOWN!r}" in footprint.note
    assert "the estimate is analytic" in footprint.note
    assert any("does not know model_type" in note for note in result.notes)
    config = {**TINY_LLAMA, "model_type": UNKNOWN}
    shape = model_config.shape_from_config(config, seq_len=SEQ_LEN)
    assert footprint.parameters == shape.parameters
    assert footprint.memory_at(MICRO).activations == shape.activation_bytes_per_sample(
        element_bytes=4) * MICRO
    # The failure is remembered: any other configuration planned goes analytic at once.
    assert all(f.kind == "config" for f in made)


@pytest.mark.parametrize("environ, transformers", [({"LAUNCH_NO_TRACE": "1"}, True),
                                                   ({"LAUNCH_NO_TRACE": "0"}, False)],
                         ids=["no_trace", "no_transformers"])
def test_analytic_without_tracing_or_transformers(tmp_path, monkeypatch, environ, transformers):
    import importlib.util

    import launcher.footprints as footprints_module
    import launcher.preflight as preflight_module

    called = []
    monkeypatch.setattr(footprints_module, "hf_traced", lambda *a, **k: called.append(a))
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        None if name == "transformers" and not transformers else find_spec(name, *a)))
    spec, info = _spec_info(tmp_path, TINY_LLAMA)
    result = preflight_module.preflight(spec, info, tmp_path / "state", environ)
    assert not called and result.source == "config"
    assert result.chosen is not None and result.chosen.memory.activations is not None


def test_attention_math_traces_transformers_eager_attention(tmp_path):
    """``--attention math`` on a traced config builds the model with eager attention, which keeps
    each head's s x s probabilities for the backward; the default (SDPA, emulated as CUDA runs
    it) keeps O(s) statistics. Before, the flag changed only the analytic estimate."""
    pytest.importorskip("transformers")
    from launcher.estimate.traced import trace_recipe

    config = _write(tmp_path / "bert", TINY_BERT)
    default = write_recipe(config, 2 * SEQ_LEN, tmp_path / "recipes")
    math = write_recipe(config, 2 * SEQ_LEN, tmp_path / "recipes", attention="math")
    assert default.parent != math.parent
    assert json.loads((math.parent / SIDECAR_NAME).read_text())["attn_implementation"] == "eager"
    assert write_recipe(config, 2 * SEQ_LEN, tmp_path / "recipes", attention="flash") == default
    options = dict(micro_batch_sizes=(2, 4), precision="fp32", optimizer="adamw",
                   activation_checkpointing=False, device="cuda", timeout_s=300)
    sdpa = trace_recipe(default, **options).memory_at(4).activations
    eager = trace_recipe(math, **options).memory_at(4).activations
    heads, layers, s = TINY_BERT["num_attention_heads"], TINY_BERT["num_hidden_layers"], 2 * SEQ_LEN
    # at least the fp32 probabilities of every head and layer for 4 samples
    assert eager - sdpa >= 4 * layers * heads * s * s * 4, (eager, sdpa)


def test_a_sequence_classifier_is_built_and_traced_as_such(tmp_path):
    """A config whose ``architectures`` names a sequence classifier (a fine-tune for labels)
    builds that class, not the language-model head: its logits are a row of labels per sample,
    not ``s x vocab``. A decoder's classifier needs a pad token to pool each row's last token;
    the recipe gives it one. The trace is the real CPU step of the same recipe, and the
    analytic count is transformers' own."""
    pytest.importorskip("transformers")
    from launcher.estimate.traced import measure_recipe, trace_recipe

    config = {**TINY_LLAMA, "architectures": ["LlamaForSequenceClassification"],
              "num_labels": 3}
    config.pop("pad_token_id", None)
    recipe = write_recipe(_write(tmp_path / "cls", config), SEQ_LEN, tmp_path / "recipes")
    real = measure_recipe(recipe, micro_batch=MICRO, precision="fp32", optimizer="adamw",
                          timeout_s=300)
    traced = trace_recipe(recipe, device="cpu", micro_batch_sizes=(1, 2, MICRO),
                          precision="fp32", optimizer="adamw", timeout_s=300)
    assert traced.peak_at(MICRO) == pytest.approx(real.peak_allocated, rel=0.01)
    shape = model_config.shape_from_config(config, seq_len=SEQ_LEN)
    assert shape.labels == 3
    assert traced.parameters == shape.parameters
    lm = model_config.shape_from_config({**TINY_LLAMA}, seq_len=SEQ_LEN)
    assert lm.parameters - shape.parameters == TINY_LLAMA["vocab_size"] * TINY_LLAMA[
        "hidden_size"] - 3 * TINY_LLAMA["hidden_size"]  # its own lm_head, against a score


@pytest.mark.parametrize("extra, shape, dtype", [
    ({"num_labels": 3, "problem_type": "multi_label_classification"}, (2, 3), "float32"),
    ({"num_labels": 1}, (2,), "float32"),  # a reward model: one value, regression
    ({"num_labels": 3, "problem_type": "regression"}, (2, 3), "float32"),
    ({"id2label": {"0": "no", "1": "yes"}}, (2,), "int64"),
], ids=["multi_label", "one_label", "regression", "id2label"])
def test_a_classifier_batch_is_what_its_loss_takes(tmp_path, extra, shape, dtype):
    """The labels follow the classifier's ``problem_type`` (BCE takes 0/1 rows, MSE values,
    cross-entropy classes): a real step of the recipe runs, on real tensors."""
    pytest.importorskip("transformers")
    import importlib.util

    config = {**TINY_BERT, "architectures": ["BertForSequenceClassification"], **extra}
    recipe = write_recipe(_write(tmp_path / "cls", config), 16, tmp_path / "recipes")
    spec = importlib.util.spec_from_file_location(f"recipe_{tmp_path.name}", recipe)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.build_model()
    batch = module.example_batch(2)
    assert tuple(batch["labels"].shape) == shape and str(batch["labels"].dtype)[6:] == dtype
    module.training_step(model, batch).backward()
    assert type(model).__name__ == "BertForSequenceClassification"
