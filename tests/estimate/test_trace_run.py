"""The sequence traced (``_trace_run``): what a recipe's own code may do while it is built.

A ``build_model`` that casts or moves its model (``.to(torch.bfloat16)``, ``.half()``,
``.to("cpu")``), as many scripts do, failed to trace with "_apply(): Couldn't swap
Embedding.weight" and was told to fix itself; it is traced as the same model built in bf16.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from launcher.estimate.traced import trace_recipe
from tests.estimate._recipes import GPT

CAST = {
    "to_bf16": "    return _build().to(torch.bfloat16)\n",
    "bfloat16": "    return _build().bfloat16()\n",
    "to_cpu_bf16": "    return _build().to('cpu', torch.bfloat16)\n",
    "built_bf16": ("    torch.set_default_dtype(torch.bfloat16)\n"
                   "    try:\n        return _build()\n"
                   "    finally:\n        torch.set_default_dtype(torch.float32)\n"),
}


def _recipe(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(GPT) + "\n_build = build_model\n\ndef build_model():\n"
                    + CAST[name])
    return path


def test_a_model_cast_in_build_model_is_traced_as_one_built_in_that_dtype(tmp_path: Path
                                                                          ) -> None:
    traces = {name: trace_recipe(_recipe(tmp_path, name), micro_batch_sizes=(1, 2),
                                 precision="bf16_mixed", device="cpu", timeout_s=120.0)
              for name in CAST}
    reference = traces.pop("built_bf16")
    assert reference.parameter_bytes == 2 * reference.parameters
    for name, trace in traces.items():
        assert (trace.parameter_bytes, trace.gradient_bytes, trace.optimizer_state_bytes) == (
            reference.parameter_bytes, reference.gradient_bytes,
            reference.optimizer_state_bytes), name
        assert trace.peak_at(2) == reference.peak_at(2), name


def test_a_cast_swaps_whichever_fake_tensor_missed_the_cache() -> None:
    """The fake mode's memo (a weak reference) is on the tensor whose op missed the cache: on a
    second build the parameter's own op hits and its converted copy carries it instead."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from launcher.estimate.child import _trace_run

    _trace_run._fake_swap()
    with FakeTensorMode():
        torch.nn.LayerNorm(7)  # the parameters' ops now hit the cache, the cast's does not
        again = torch.nn.LayerNorm(7)
        again.to(torch.bfloat16)
    assert {p.dtype for p in again.parameters()} == {torch.bfloat16}
