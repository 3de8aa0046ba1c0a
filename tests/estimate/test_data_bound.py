"""A loader whose batches vary in shape is traced at the largest batch its data makes.

A script that pads each batch to its longest sample (a ``collate_fn`` with dynamic padding, as
accelerate's ``nlp_example`` and most NLP loops do) makes batches of varying sequence length:
the capture's first batch is one sample of them (issue 28: 112 tokens captured, 121 the data's
longest, -7.2% with no note). The capture scans the training loader's data
(``launcher/capture/child/data_bound.py``) and the plan traces the longest, and says so; a
loader with constant shapes changes nothing and adds no note.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from launcher.capture.frameworks import detect, measure_step
from tests.fakes.in_process import launch as _launch

#: accelerate's nlp_example as it pads (tests/fixtures/frameworks/accelerate_nlp_padded.py):
#: the first batch's longest 112 tokens, the data's 121, as in issue 28.
ACCELERATE = (Path(__file__).resolve().parents[1] / "fixtures" / "frameworks"
              / "accelerate_nlp_padded.py")

#: A plain loop as users write it: a list of token lists, a collate that pads each batch to its
#: longest, in order (no shuffle), the first batch (16 tokens at most) not the longest (64, the
#: 38th sample). ``--constant`` makes every sample the first batch's longest.
SCRIPT = '''
import argparse
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=4)
parser.add_argument("--constant", action="store_true")
args = parser.parse_args()

VOCAB, PAD = 1000, 0
g = torch.Generator().manual_seed(0)
lengths = [12, 16, 9, 14] + [int(torch.randint(8, 20, (1,), generator=g)) for _ in range(60)]
lengths[37] = 64
if args.constant:
    lengths = [16] * len(lengths)
texts = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in lengths]


def collate(rows):
    longest = max(len(r) for r in rows)
    ids = torch.tensor([r + [PAD] * (longest - len(r)) for r in rows])
    return ids[:, :-1], ids[:, 1:]


class LM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 64)
        self.head = torch.nn.Linear(64, VOCAB)

    def forward(self, x):
        return self.head(torch.tanh(self.embed(x)))


model = LM()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
loader = DataLoader(texts, batch_size=args.batch_size, collate_fn=collate)
for epoch in range(1):
    for x, y in loader:
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, VOCAB), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''

_VARY = "the loader's batches vary in shape"




@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The script planned twice, at the same time: varying lengths and constant ones."""
    root = tmp_path_factory.mktemp("data_bound")
    pool = ThreadPoolExecutor(2)
    futures: dict[str, Future] = {}
    for name, extra in (("varying", []), ("constant", ["--", "--constant"])):
        folder = root / name
        folder.mkdir()
        script = folder / "main.py"
        script.write_text(SCRIPT)
        futures[name] = pool.submit(_launch, ["plan", str(script), "--json", "--precision",
                                              "fp32", *extra], folder)
    if importlib.util.find_spec("accelerate") and importlib.util.find_spec("transformers"):
        folder = root / "accelerate"
        folder.mkdir()
        futures["accelerate"] = pool.submit(
            _launch, ["plan", str(ACCELERATE), "--json", "--precision", "fp32",
                      "--micro-batch-size", "16", "--global-batch-size", "16"], folder)
        futures["accelerate_real"] = pool.submit(
            measure_step, ACCELERATE, detect(ACCELERATE), argv=["--longest-in-every-batch"],
            timeout_s=300)
    results: dict[str, Any] = {"dir": root}
    for name, future in futures.items():
        if name.endswith("_real"):
            results[name] = future.result()
            continue
        status, out, err = future.result()
        assert status == 0, err
        results[name] = json.loads(out)
    pool.shutdown()
    yield results


def _captured(root: Path, name: str) -> dict[str, Any]:
    path = next((root / name / "state" / "framework_recipes").glob("*/capture.json"))
    return json.loads(path.read_text())


@pytest.mark.slow
def test_a_dynamically_padded_loader_is_traced_at_its_longest_batch(plans: dict[str, Any]
                                                                    ) -> None:
    varying, constant = plans["varying"], plans["constant"]
    said = [n for n in varying["notes"] if _VARY in n]
    assert said == [f"{_VARY}: traced at the largest the data makes, sequence length 63 (the "
                    "first batch's 15): all 64 samples scanned"], varying["notes"]
    shapes = _captured(plans["dir"], "varying")["batch_shapes"]["dict"]["args"]["list"]
    assert shapes[0]["shape"] == [4, 63]
    # the same first batch, [4, 15], in both: the longest batch's activations are traced
    assert _captured(plans["dir"], "constant")["batch_shapes"]["dict"]["args"]["list"][0][
        "shape"] == [4, 15]
    peak, first = (p["chosen"]["memory"]["peak_allocated"] for p in (varying, constant))
    assert peak > first * 1.2, (peak, first)


@pytest.mark.slow
def test_a_loader_of_constant_shapes_adds_no_note(plans: dict[str, Any]) -> None:
    """Scanned all the same (the capture says what it scanned, in ``data_scan``), with no note
    and the first batch traced."""
    assert not [n for n in plans["constant"]["notes"] if "vary in shape" in n]
    assert not [n for n in plans["constant"]["notes"] if "scanned" in n]
    scan = _captured(plans["dir"], "constant")["data_scan"]
    assert scan["how"] == "all 64 samples scanned" and scan["grown"] == []
    assert scan["seconds"] < 1.0
    assert _captured(plans["dir"], "varying")["data_scan"]["grown"] == [
        {"dim": 1, "first": 15, "largest": 63}]


@pytest.mark.slow
def test_accelerates_nlp_example_is_traced_at_its_longest_batch_and_matches_its_step(
        plans: dict[str, Any]) -> None:
    """Traced at 121 tokens where the first batch has 112, and matching the framework's own
    real step at a batch of 121 (every batch's first sample made the longest): -11% before."""
    if "accelerate" not in plans:
        pytest.skip("accelerate or transformers is not installed")
    result = plans["accelerate"]
    assert [n for n in result["notes"] if _VARY in n] == [
        f"{_VARY}: traced at the largest the data makes, sequence length 121 (the first batch's "
        "112): all 256 samples scanned"]
    traced = result["chosen"]["memory"]["peak_allocated"]
    real = plans["accelerate_real"]["peak_allocated"]
    assert abs(traced - real) <= 0.02 * real, (traced, real)


def test_a_loader_without_indexing_is_scanned_through_its_own_batches() -> None:
    """An ``IterableDataset`` cannot be read by position: the loader's own batches are, up to
    ``SCAN_BATCHES`` within ``SCAN_SECONDS``, and the largest taken."""
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    from launcher.capture.child import data_bound
    from launcher.capture.child.answer import ANSWER

    class Stream(IterableDataset):
        def __iter__(self) -> Iterator[torch.Tensor]:
            for n in (5, 7, 6, 11, 4, 6):
                yield torch.ones(n, dtype=torch.long)

    def pad(rows: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)}

    loader = DataLoader(Stream(), batch_size=2, collate_fn=pad)
    first = next(iter(loader))
    ANSWER["notes"] = []
    largest = data_bound.bounded(loader, first)
    assert largest["input_ids"].shape == (2, 11) and largest["input_ids"].dtype == torch.long
    assert ANSWER["notes"] == [f"{_VARY}: traced at the largest the data makes, sequence length "
                               "11 (the first batch's 7): all 3 batches scanned"]
    # a constant one: the first batch, no note
    ANSWER["notes"] = []
    same = DataLoader([torch.ones(3)] * 6, batch_size=2)
    batch = next(iter(same))
    assert data_bound.bounded(same, batch) is batch and ANSWER["notes"] == []
