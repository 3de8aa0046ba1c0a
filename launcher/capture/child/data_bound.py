"""The largest batch the training data makes, where its batches vary in shape.

A loader that pads each batch to its longest sample (a ``collate_fn`` or a Hugging Face data
collator with dynamic padding) makes batches of varying sequence length: the captured first batch
is one sample of them, and a step traced at it is short of the longest batch's (accelerate's
``nlp_example``: 112 tokens captured, 121 the data's longest, -7.2%). So, once the first batch is
captured, the training loader is scanned, cheaply:

- its samples are read (``dataset[i]``; a Hugging Face ``datasets.Dataset`` column by column),
  every one of them or as many as ``SCAN_SECONDS`` allow (``UNIFORM_SECONDS`` while they are all
  of one size), and each sample's size is the elements of its lists, texts and tensors; a dataset
  whose samples all have the same size changes nothing;
- else (a dataset without a length or indexing, a batch sampler of its own) up to
  ``SCAN_BATCHES`` of the loader's own batches, within ``SCAN_SECONDS``;

and the batch traced is the loader's collate of the largest sample with the first others (so it
pads, truncates and rounds as the script's collate does), or the largest batch iterated, when
its shapes are the captured batch's with some dimensions larger. A note says which dimensions
and how they were found. ``LAUNCH_CAPTURE_SCAN=0`` turns the scan off.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import torch

from launcher.capture.child.answer import ANSWER, STATE, note, write_answer

_TRACED_AT = "the loader's batches vary in shape: traced at the largest the data makes, "
#: The scan's time bound (seconds) and how many of the loader's batches it iterates at most.
SCAN_SECONDS = 5.0
SCAN_BATCHES = 200
#: Samples read one by one that are all of one size after this long: taken as constant (a
#: dataset that decodes an image a sample does not spend the whole scan for nothing).
UNIFORM_SECONDS = 0.5


def _size(value: Any) -> int:
    """A sample's elements: the lengths of its lists and texts and the numel of its tensors."""
    if isinstance(value, torch.Tensor):
        return value.numel()
    if isinstance(value, str):  # a text the collate tokenizes: its characters for its tokens
        return len(value)
    if isinstance(value, Mapping):
        return sum(_size(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, (int, float, bool)) for v in value):
            return len(value)
        return sum(_size(v) for v in value)
    if hasattr(value, "shape") and hasattr(value, "size"):  # a numpy array
        return int(value.size)
    return 0


def _leaves(value: Any) -> list[Any]:
    from launcher.capture.child.capture import leaves

    return leaves(value)


def _hf_sizes(dataset: Any, deadline: float) -> list[int] | None:
    """Each row's elements of a ``datasets.Dataset``, read a column at a time (no row is
    formatted): the lengths of its list columns. None when it is no such dataset."""
    if type(dataset).__module__.split(".")[0] != "datasets" or not hasattr(
            dataset, "column_names"):
        return None
    try:
        features = dataset.features
        columns = [c for c in dataset.column_names
                   if type(features[c]).__name__ in ("Sequence", "List", "LargeList")
                   or isinstance(features[c], list)]
        sizes = [0] * len(dataset)
        plain = dataset.with_format(None)
        for column in columns:
            for i, row in enumerate(plain[column]):
                sizes[i] += len(row) if row is not None else 0
            if time.monotonic() > deadline:
                return None
        return sizes
    except Exception:  # noqa: BLE001 - a dataset we cannot read this way: the generic path
        return None


def _sample_sizes(dataset: Any, deadline: float) -> tuple[list[int], int] | None:
    """(each scanned sample's elements, the samples in all), the first samples in order until
    the deadline; None for a dataset without a length or that cannot be indexed."""
    try:
        total = len(dataset)
    except (TypeError, NotImplementedError):
        return None
    if not total:
        return None
    sizes = _hf_sizes(dataset, deadline)
    if sizes is not None:
        return sizes, total
    sizes: list[int] = []
    uniform, uniform_until = True, time.monotonic() + UNIFORM_SECONDS
    for i in range(total):
        try:
            sizes.append(_size(dataset[i]))
        except Exception:  # noqa: BLE001 - a dataset that is not indexed by position
            return None if not sizes else (sizes, total)
        uniform = uniform and sizes[-1] == sizes[0]
        now = time.monotonic()
        if now > deadline or (uniform and now > uniform_until):
            break  # out of time, or samples slow to read (images decoded) all of one size
    return sizes, total


def _shapes(batch: Any) -> list[tuple[int, ...]]:
    return [tuple(t.shape) for t in _leaves(batch)]


def _larger(captured: list[tuple[int, ...]], found: list[tuple[int, ...]]) -> bool:
    """The same leaves and ranks, the rows the same, no dimension smaller, one larger."""
    if len(captured) != len(found) or not captured:
        return False
    larger = False
    for old, new in zip(captured, found, strict=True):
        if len(old) != len(new) or (old and old[0] != new[0]):
            return False
        if any(n < o for o, n in zip(old, new, strict=True)):
            return False
        larger = larger or any(n > o for o, n in zip(old, new, strict=True))
    return larger


def _by_collate(loader: Any, batch: Any, deadline: float) -> tuple[Any, str] | None:
    """The loader's collate of its largest sample and the first others, and how it was found;
    None when the dataset cannot be read by position (``_by_iteration`` then)."""
    rows = getattr(loader, "batch_size", None)
    if not isinstance(rows, int):  # accelerate's DataLoaderShard: a batch sampler of its own
        shapes = _shapes(batch)
        rows = shapes[0][0] if shapes and shapes[0] else None
    collate = getattr(loader, "collate_fn", None)
    if not isinstance(rows, int) or collate is None or not hasattr(loader, "dataset"):
        return None
    found = _sample_sizes(loader.dataset, deadline)
    if found is None:
        return None
    sizes, total = found
    how = (f"all {total} samples scanned" if len(sizes) == total
           else f"{len(sizes)} of {total} samples scanned")
    if len(set(sizes)) <= 1:
        return batch, how  # every sample the same size: the first batch is every batch
    largest = max(range(len(sizes)), key=sizes.__getitem__)
    others = [i for i in range(min(total, rows + 1)) if i != largest][:rows - 1]
    samples = [loader.dataset[i] for i in [largest, *others]]
    return collate(samples), how


def _by_iteration(loader: Any, batch: Any, deadline: float) -> tuple[Any, str]:
    """The largest of the loader's own batches (up to ``SCAN_BATCHES``, until the deadline)."""
    best, best_size, seen = batch, sum(t.numel() for t in _leaves(batch)), 0
    rows = _shapes(batch)[0][0] if _shapes(batch) and _shapes(batch)[0] else None
    try:
        total = len(loader)
    except TypeError:
        total = None
    every = True
    for candidate in loader:
        seen += 1
        shapes = _shapes(candidate)
        size = sum(t.numel() for t in _leaves(candidate))
        if size > best_size and shapes and shapes[0] and shapes[0][0] == rows:
            best, best_size = candidate, size
        if seen >= SCAN_BATCHES or time.monotonic() > deadline:
            every = total is not None and seen >= total
            break
    how = (f"all {seen} batches scanned" if every
           else f"{seen} of {total if total is not None else 'its'} batches scanned")
    return best, how


def bounded(loader: Any, batch: Any) -> Any:
    """``batch`` (the captured first batch of ``loader``), or the largest batch the loader's
    data makes when its batches vary in shape, with a note saying so."""
    if os.environ.get("LAUNCH_CAPTURE_SCAN", "1") == "0" or loader is None:
        return batch
    started = time.monotonic()
    deadline = started + SCAN_SECONDS
    try:
        found = _by_collate(loader, batch, deadline)
        if found is None:
            found = _by_iteration(loader, batch, deadline)
    except Exception as exc:  # noqa: BLE001 - the user's data: the captured batch stays
        note(f"the training data could not be scanned for its largest batch ({type(exc).__name__}:"
             f" {str(exc)[:120]}): the traced batch is the first one")
        return batch
    largest, how = found
    old, new = _shapes(batch), _shapes(largest)
    grown = sorted({(o[d], n[d], d) for o, n in zip(old, new, strict=True)
                    for d in range(1, len(o))
                    if n[d] > o[d]}) if _larger(old, new) else []
    # what was scanned, how long it took, and what grew (capture.json ``data_scan``)
    ANSWER["data_scan"] = {"how": how, "seconds": round(time.monotonic() - started, 3),
                           "grown": [{"dim": d, "first": o, "largest": n} for o, n, d in grown]}
    if "out" in STATE:
        write_answer()
    if not grown:
        return batch
    STATE["bound_sizes"] = {o: n for o, n, _d in grown}
    words = ", ".join(
        (f"sequence length {n}" if d == 1 else f"dimension {d} {n}") + f" (the first batch's {o})"
        for o, n, d in grown)
    note(f"{_TRACED_AT}{words}: {how}")
    return largest


def bounded_shape(shape: list[int]) -> list[int]:
    """A shape seen at the first batch (a held output's), its grown dimensions at the largest
    batch's sizes (not its first: the rows)."""
    sizes = STATE.get("bound_sizes") or {}
    return [shape[0], *[sizes.get(s, s) for s in shape[1:]]] if shape else shape


def last_loader_batch() -> tuple[Any, Any] | None:
    """The DataLoader and batch a plain script's loop fetched last (``record_loaders``)."""
    return STATE.get("loader_batch")


def record_loaders() -> None:
    """Every DataLoader iterator remembers its loader; each batch it yields is recorded with it
    (a plain script's loop: the batch that fed the model is found among them by identity)."""
    from torch.utils.data import dataloader

    base = dataloader._BaseDataLoaderIter
    init, following = base.__init__, base.__next__

    def recording_init(self: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
        init(self, loader, *args, **kwargs)
        self._launch_loader = loader

    def recording_next(self: Any) -> Any:
        batch = following(self)
        loader = getattr(self, "_launch_loader", None)
        if loader is not None and not STATE.get("scanning"):
            STATE["loader_batch"] = (loader, batch)
        return batch

    base.__init__ = recording_init  # type: ignore[method-assign]
    base.__next__ = recording_next  # type: ignore[method-assign]


def bounded_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """A plain script's captured inputs (``{"args", "kwargs", "extra"}``) with the tensors that
    came from the loader's last batch replaced by those of the largest batch its data makes."""
    found = last_loader_batch()
    if found is None:
        return batch
    loader, loaded = found
    mine = _leaves(loaded)
    index = {id(t): i for i, t in enumerate(mine)}
    used = [t for t in _leaves(batch) if id(t) in index]
    if not used:
        return batch
    STATE["scanning"] = True
    try:
        largest = bounded(loader, loaded)
    finally:
        STATE["scanning"] = False
    if largest is loaded:
        return batch
    new = _leaves(largest)
    grown = set(STATE.get("bound_sizes") or ())
    if any(id(t) not in index and any(s in grown for s in t.shape[1:]) for t in _leaves(batch)):
        # the model also takes tensors the loop computed from the batch: those stay the first
        # batch's size, so the inputs stay the first batch's
        STATE.pop("bound_sizes", None)
        ANSWER["notes"] = [n for n in ANSWER["notes"] if not n.startswith(_TRACED_AT)]
        note("the loader's batches vary in shape, but the model's inputs are computed from them: "
             "the traced batch is the first one")
        return batch

    def swap(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return new[index[id(value)]] if id(value) in index else value
        if isinstance(value, Mapping):
            return {k: swap(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(swap(v) for v in value)
        return value

    return {k: swap(v) for k, v in batch.items()}
