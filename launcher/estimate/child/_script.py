"""The rendered training script, imported as a module: the step the estimator traces.

An estimate is only as good as its claim to be the program that will run. So the trace child
does not keep a copy of the training loop: it renders the strategy's script exactly as
``launcher.render`` does for a job, imports it (its ``main()`` only runs as ``__main__``), and
calls its own functions: ``build_model``, ``wrap_model``, ``build_optimizer``,
``synthetic_stream``, ``optimizer_step`` (the micro-batches with their gradient sync, clipping,
the update and ``zero_grad``), ``clip_gradients``.

What the trace replaces is transport, never memory: in a fake process group (one process
standing for rank 0 of N, ``_trace_dist``) the device mesh is built outside the fake mode and
DDP's constructor skips its cross-rank checks; bitsandbytes, which has no CPU or fake kernels,
is a stand-in with the same state (``_adam8bit.Adam8bitStandIn``). ``sha256`` of the text
imported is in every answer, so a test can hold it against ``render_script``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

_LOADED: dict[str, tuple[types.ModuleType, str]] = {}


def load(strategy: str) -> tuple[types.ModuleType, str]:
    """The rendered script of ``strategy`` as a module, and the sha256 of its text and of
    ``launch_runtime.py``'s (once per process: importing them runs only imports and
    definitions). The runtime is imported once, as ``launch_runtime``, as the script imports it
    in a job; its functions are the script's ``launch.`` names."""
    if strategy not in _LOADED:
        from launcher.render import render_script

        runtime_text = _runtime()
        text = render_script(strategy)
        folder = Path(tempfile.mkdtemp(prefix="launch-trace-script-"))
        path = folder / f"launch_train_{strategy}.py"
        path.write_text(text, encoding="utf-8")
        name = f"_launch_traced_{strategy}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        _patch_transport(module)
        digest = hashlib.sha256((text + runtime_text).encode()).hexdigest()
        _LOADED[strategy] = (module, digest)
    return _LOADED[strategy]


def _runtime() -> str:
    """Import ``launch_runtime.py`` as the job has it (once), and return its text."""
    from launcher.render import RUNTIME_NAME, runtime_source

    text = runtime_source()
    if "launch_runtime" not in sys.modules:
        folder = Path(tempfile.mkdtemp(prefix="launch-trace-runtime-"))
        path = folder / RUNTIME_NAME
        path.write_text(text, encoding="utf-8")
        spec = importlib.util.spec_from_file_location("launch_runtime", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["launch_runtime"] = module
        spec.loader.exec_module(module)
    return text


def _patch_transport(script: types.ModuleType) -> None:
    """Let the script's own wrapping run in a fake world (see the module's docstring)."""
    from launcher.estimate.child import _trace_dist

    if hasattr(script, "DistributedDataParallel"):
        script.DistributedDataParallel = _trace_dist.data_parallel
    if hasattr(script, "init_device_mesh"):
        script.init_device_mesh = _trace_dist.init_device_mesh


class Recipe:
    """The user's recipe, with ``build_model`` answering a model the tracer already built.

    The tracer builds the model itself (cut to a few blocks for depth scaling, its fake tensors
    moved to the traced device and dtype without ``Module._apply``'s swap, which fake
    parameters refuse) and hands it to the script's ``build_model``, which does the rest as in a
    job: its cast (a no-op by then), activation checkpointing.
    """

    def __init__(self, recipe: types.ModuleType, model: Any = None) -> None:
        self._recipe, self._model = recipe, model

    def build_model(self) -> Any:
        return self._model

    def __getattr__(self, name: str) -> Any:
        return getattr(self._recipe, name)


class Progress:
    """The script's ``Progress``, telling the tracker where the step is.

    ``optimizer_step`` sets ``phase`` (data, forward, backward, optimizer) and ``micro_step``;
    each change is passed to ``on_phase(phase, micro_step)``. With ``stop_at_optimizer`` the step
    ends where the optimizer would start (``StopStep``): the tracer measures the micro-batches
    at more sizes without paying for an update each time.
    """

    def __init__(self, on_phase: Any, stop_at_optimizer: bool = False) -> None:
        self._on_phase, self._stop = on_phase, stop_at_optimizer
        self.micro_step = 0
        self.step = 0
        self._phase = "setup"

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, value: str) -> None:
        self._phase = value
        self._on_phase(value, self.micro_step)
        if value == "optimizer" and self._stop:
            raise StopStep


class StopStep(Exception):
    """Raised by ``Progress`` where the optimizer phase starts, when asked to stop there."""


def bitsandbytes_stand_in() -> types.ModuleType:
    """A ``bitsandbytes`` module whose ``optim.AdamW8bit`` is the trace's stand-in (same state,
    no kernels), for the script's ``build_optimizer`` to import."""
    from launcher.estimate.child._adam8bit import Adam8bitStandIn

    module = types.ModuleType("bitsandbytes")
    module.optim = types.SimpleNamespace(AdamW8bit=Adam8bitStandIn)  # type: ignore[attr-defined]
    return module
