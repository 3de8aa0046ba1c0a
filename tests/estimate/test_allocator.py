"""The caching allocator replay (launcher/estimate/allocator.py), the traced reserve ratio, and
the CUDA context / NCCL table (launcher/estimate/overheads.py).

Every expected number below is worked by hand from CUDACachingAllocator.cpp's rules (the module
docstring lists them); the comment next to each assertion is the working.
"""

from __future__ import annotations

import importlib.util
import math
import random
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _recipes import GPT  # noqa: E402

from launcher.estimate.allocator import (
    AllocatorConfig,
    Replay,
    allocation_size,
    compact,
    replay,
    round_size,
)

MiB = 2**20
KiB = 2**10


def run(events: list[tuple], **config: object) -> Replay:
    return replay(compact(events), AllocatorConfig(**config))  # type: ignore[arg-type]


def test_small_allocations_pack_into_one_2mib_segment() -> None:
    # 4 x 100 KiB (a multiple of 512: no rounding) <= 1 MiB: small pool. The first finds no
    # cached block and gets a 2 MiB segment, split (2 MiB - 100 KiB >= 512 B left); the other
    # three are carved from the remainder. One cudaMalloc of 2 MiB for 400 KiB.
    r = run([("alloc", i, 100 * KiB) for i in range(4)])
    assert (r.peak_requested, r.peak_reserved, r.segments) == (400 * KiB, 2 * MiB, 1)


def test_a_3mib_request_gets_a_20mib_segment_that_the_next_one_shares() -> None:
    # 3 MiB: large pool, under kMinLargeAlloc (10 MiB): a kLargeBuffer segment (20 MiB), split
    # because 17 MiB > 1 MiB remain; the second 3 MiB is the best fit in that remainder.
    r = run([("alloc", 0, 3 * MiB), ("alloc", 1, 3 * MiB)])
    assert (r.peak_allocated, r.peak_reserved, r.segments) == (6 * MiB, 20 * MiB, 1)


def test_large_requests_round_to_2mib_and_an_uncut_block_counts_whole() -> None:
    # 12 MiB >= 10 MiB: a segment of exactly 12 MiB (a multiple of kRoundLarge).
    r = run([("alloc", 0, 12 * MiB)])
    assert (r.peak_allocated, r.peak_reserved) == (12 * MiB, 12 * MiB)
    # 11 MiB + 1 byte rounds to 11 MiB + 512; its segment is 12 MiB; the 1 MiB - 512 left is
    # not > 1 MiB, so the block is not split and max_memory_allocated counts all 12 MiB.
    r = run([("alloc", 0, 11 * MiB + 1)])
    assert (r.peak_requested, r.peak_allocated, r.peak_reserved) == (
        11 * MiB + 512, 12 * MiB, 12 * MiB)
    assert allocation_size(5 * MiB) == 20 * MiB and allocation_size(MiB) == 2 * MiB
    assert round_size(1) == 512 and round_size(513) == 1024


def test_a_freed_block_is_split_for_a_smaller_request_and_the_rest_waits_for_a_fit() -> None:
    # 12 MiB segment, freed and cached; 4 MiB takes it (best fit) and splits it (8 MiB > 1 MiB
    # left); 9 MiB does not fit the 8 MiB remainder: a new 20 MiB segment (9 < 10 MiB).
    # Reserved 12 + 20 = 32 MiB for a peak of 13 MiB requested.
    r = run([("alloc", 0, 12 * MiB), ("free", 0), ("alloc", 1, 4 * MiB), ("alloc", 2, 9 * MiB)])
    assert (r.peak_requested, r.peak_reserved, r.segments) == (13 * MiB, 32 * MiB, 2)


def test_freed_neighbours_merge_back_into_one_block() -> None:
    # Two 3 MiB blocks from one 20 MiB segment, both freed: with the 14 MiB remainder they merge
    # into one 20 MiB free block, which an 18 MiB request fits: no second segment.
    r = run([("alloc", 0, 3 * MiB), ("alloc", 1, 3 * MiB), ("free", 0), ("free", 1),
             ("alloc", 2, 18 * MiB)])
    assert (r.peak_reserved, r.segments) == (20 * MiB, 1)


def test_best_fit_takes_the_smallest_block_that_fits() -> None:
    # Cached: a 12 MiB and a 14 MiB segment. 11 MiB takes the 12 (smallest fit; its 1 MiB rest
    # is not split off), then 13 MiB takes the 14: 26 MiB reserved. Taking the 14 MiB block
    # first would leave 13 MiB nowhere to go and cudaMalloc 14 MiB more.
    r = run([("alloc", 0, 12 * MiB), ("alloc", 1, 14 * MiB), ("free", 0), ("free", 1),
             ("alloc", 2, 11 * MiB), ("alloc", 3, 13 * MiB)])
    assert (r.peak_reserved, r.segments) == (26 * MiB, 2)


def test_the_small_and_large_pools_never_share() -> None:
    # 1 MiB is small (<= kSmallSize): a 2 MiB segment; 1 MiB + 512 is large: the small
    # segment's free 1 MiB cannot serve it, a 20 MiB segment does. 22 MiB in all.
    r = run([("alloc", 0, MiB), ("alloc", 1, MiB + 512)])
    assert (r.peak_reserved, r.segments) == (22 * MiB, 2)


def test_fragmentation_reserves_more_than_the_peak_and_expandable_segments_reuse_it() -> None:
    # Growing sizes, each freed before the next: 12, 14, 16 MiB. Each cached block is too small
    # for the next request: three segments, 42 MiB reserved for a 16 MiB peak.
    growing = [("alloc", 0, 12 * MiB), ("free", 0), ("alloc", 1, 14 * MiB), ("free", 1),
               ("alloc", 2, 16 * MiB)]
    normal = run(growing)
    assert (normal.peak_allocated, normal.peak_reserved) == (16 * MiB, 42 * MiB)
    assert normal.reserve_ratio == pytest.approx(42 / 16)
    # expandable_segments: one segment mapped in 20 MiB pages (large pool). 12 MiB maps one
    # page; freed, it merges with the 8 MiB left into one 20 MiB free block at the segment's
    # end, which 14 and then 16 MiB fit: 20 MiB reserved.
    expandable = run(growing, expandable_segments=True)
    assert (expandable.peak_reserved, expandable.segments) == (20 * MiB, 1)


def test_expandable_segments_grow_by_pages_from_the_free_end() -> None:
    # 12 MiB: one 20 MiB page, 8 MiB left free at the end. 12 MiB more: the 8 MiB end plus one
    # new page (4 MiB short, rounded to 20): 40 MiB reserved. Normal: 12 + 12 = 24 MiB.
    events = [("alloc", 0, 12 * MiB), ("alloc", 1, 12 * MiB)]
    assert run(events, expandable_segments=True).peak_reserved == 40 * MiB
    assert run(events).peak_reserved == 24 * MiB
    # The small pool maps 2 MiB pages: 4 x 100 KiB in one page.
    small = run([("alloc", i, 100 * KiB) for i in range(4)], expandable_segments=True)
    assert small.peak_reserved == 2 * MiB


def test_max_split_size_keeps_oversize_blocks_from_small_requests() -> None:
    # max_split_size_mb=10: the cached 12 MiB block is oversize, so a 4 MiB request may not take
    # it (``get_free_block``): a new 20 MiB segment, 32 MiB reserved (12 MiB unlimited).
    events = [("alloc", 0, 12 * MiB), ("free", 0), ("alloc", 1, 4 * MiB)]
    assert run(events, max_split_size=10 * MiB).peak_reserved == 32 * MiB
    assert run(events).peak_reserved == 12 * MiB


def test_roundup_power2_divisions() -> None:
    # 1.2 MiB (1,258,291 B) with 4 divisions: between 1 and 2 MiB the steps are 256 KiB, so it
    # rounds up to 1 MiB + 256 KiB = 1,310,720. A power of two stays; small sizes keep 512 B.
    assert round_size(1_258_291, 4) == 1_310_720
    assert round_size(2 * MiB, 4) == 2 * MiB
    assert round_size(1000, 4) == 1024


def test_compact_numbers_allocations_in_order_and_ids_can_be_reused() -> None:
    assert compact([("alloc", "a", 10), ("free", "a"), ("alloc", "a", 20), ("free", "a")]) == [
        10, ~0, 20, ~1]
    with pytest.raises(ValueError):
        compact([("resize", 1)])


def test_100k_events_replay_fast() -> None:
    rng = random.Random(0)
    events, live, n = [], [], 0
    while len(events) < 100_000:
        if live and rng.random() < 0.48:
            events.append(~live.pop(rng.randrange(len(live))))
        else:
            events.append(rng.choice([rng.randint(1, MiB), rng.randint(MiB, 64 * MiB)]))
            live.append(n)
            n += 1
    start = time.perf_counter()
    r = replay(events)
    elapsed = time.perf_counter() - start
    assert r.peak_reserved >= r.peak_allocated >= r.peak_requested > 0
    assert elapsed < 1.0, elapsed  # 0.2 s measured on this machine's two cores


# -- the trace replays what the job would ask the allocator for -------------------------------

#: A GPT with a vocabulary large enough for logits and embeddings of tens of MiB next to
#: sub-MiB layer-norm statistics: sizes in every pool and segment class.
MIXED_GPT = GPT.replace("V, D, H, L, S = 256, 64, 4, 2, 32", "V, D, H, L, S = 8000, 384, 6, 4, 128")
assert MIXED_GPT != GPT


def test_a_traced_cuda_estimate_replays_the_allocator(tmp_path: Path) -> None:
    from launcher.estimate.overheads import ALLOCATOR_RESERVE_RATIO
    from launcher.estimate.traced import trace_recipe

    recipe = tmp_path / "gpt.py"
    recipe.write_text(MIXED_GPT)
    trace = trace_recipe(recipe, device="cuda", micro_batch_sizes=(2, 4), precision="bf16_mixed",
                         optimizer="adamw", timeout_s=300)
    replayed = trace.allocator
    b0 = replayed["micro_batch"]
    default = replayed["default"]
    # The replay saw the storages the timeline counts from the end of the build on: its peak of
    # live (512-rounded) requests is the traced peak of step 1 and the steady step at the traced
    # size (the timeline samples after each op, so it can only miss a transient).
    steady = max(sum(v.values()) for phase, v in trace.per_size[b0].phases.items()
                 if phase != "build")
    assert steady <= default["peak_requested"] <= steady * 1.01
    assert default["peak_reserved"] >= default["peak_allocated"] >= default["peak_requested"]
    assert replayed["expandable_segments"]["peak_reserved"] >= default["peak_requested"]
    for b in (2, 4, 8):
        memory = trace.memory_at(b)
        assert memory.peak_allocated is not None and memory.peak_reserved is not None
        ratio = memory.peak_reserved / memory.peak_allocated
        assert ratio >= 1.0
        assert abs(ratio - ALLOCATOR_RESERVE_RATIO) > 0.005  # the model's own, not the default
        assert ratio == pytest.approx(trace.reserve_ratio(), rel=1e-6)  # carried to every size


def test_the_planner_takes_a_replayed_ratio_unless_calibration_measured_one() -> None:
    from launcher.estimate.footprint import Footprint
    from launcher.estimate.overheads import CUBLAS_WORKSPACE_BYTES
    from launcher.plan.memory import Target, per_gpu_memory
    from launcher.plan.plan import Memory

    gib = 2**30
    single = Memory(parameters=gib, gradients=gib, optimizer=2 * gib, activations=gib,
                    temporary=0, peak_allocated=5 * gib, peak_reserved=round(5 * gib * 1.25))
    fp = Footprint(kind="traced", precision="fp32", optimizer="adamw",
                   activation_checkpointing=False, parameters=gib // 4,
                   memory_at=lambda b, a=1: single)
    gpu = Target(name="g", gpus=1, memory_bytes=80 * gib, generation="hopper")
    memory = per_gpu_memory(fp, gpu, "single", 1, 1, micro=1)
    assert memory.peak_reserved == math.ceil((5 * gib + CUBLAS_WORKSPACE_BYTES) * 1.25)
    calibrated = Target(name="g", gpus=1, memory_bytes=80 * gib, generation="hopper",
                        reserve_ratio=1.1)
    memory = per_gpu_memory(fp, calibrated, "single", 1, 1, micro=1)
    assert memory.peak_reserved == math.ceil((5 * gib + CUBLAS_WORKSPACE_BYTES) * 1.1)


# -- the CUDA context and NCCL -----------------------------------------------------------------


def test_context_rows_each_have_a_source_and_cover_every_generation_both_ways() -> None:
    from launcher.estimate.overheads import CUDA_CONTEXT

    generations = {g for row in CUDA_CONTEXT for g in row.generations}
    for lazy in (True, False):
        covered = [g for row in CUDA_CONTEXT if row.lazy == lazy for g in row.generations]
        assert sorted(covered) == sorted(generations)  # each once per loading mode
    assert all(len(row.source) > 30 for row in CUDA_CONTEXT)
    for g in generations:  # eager loads every kernel image: never smaller
        eager = next(r.bytes for r in CUDA_CONTEXT if not r.lazy and g in r.generations)
        lazy_ = next(r.bytes for r in CUDA_CONTEXT if r.lazy and g in r.generations)
        assert eager > lazy_


def test_context_lookup_by_cuda_version_generation_and_loading() -> None:
    from launcher.estimate.overheads import DEFAULT_CUDA_CONTEXT_BYTES, cuda_context_bytes

    # Hugging Face's V100 under CUDA 11.2 (before lazy loading): the measured 1343 MiB.
    assert cuda_context_bytes("volta", (11, 2)) == 1343 * MiB
    assert cuda_context_bytes("volta", (11, 2), lazy=True) == 1343 * MiB  # 11.2 cannot
    assert cuda_context_bytes("volta", (12, 8)) == 500 * MiB
    assert cuda_context_bytes("volta") == 500 * MiB  # unknown CUDA: a lazy-loading one
    assert cuda_context_bytes("hopper", (12, 4), lazy=False) == 1687 * MiB  # EAGER forced
    assert cuda_context_bytes("hopper", (12, 4)) == 700 * MiB
    assert cuda_context_bytes(None) == DEFAULT_CUDA_CONTEXT_BYTES == 900 * MiB
    assert cuda_context_bytes("tpu-v9", (11, 0)) == 1687 * MiB  # unknown, eager: the largest


def test_the_default_images_run_a_cuda_with_lazy_loading() -> None:
    from launcher.estimate.overheads import LAZY_LOADING_SINCE, image_cuda
    from launcher.providers.images import IMAGES

    assert image_cuda("pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime") == (12, 8)
    assert image_cuda("x.dkr.ecr.us-east-1.amazonaws.com/smdistributed-modelparallel:"
                      "2.5.1-gpu-py311-cu124") == (12, 4)
    assert image_cuda("us-docker.pkg.dev/vertex-ai/training/pytorch-cu121.2-2.py310") == (12, 1)
    assert image_cuda("pytorch-training:1.8.1-gpu-py36") is None  # torch 1.8: not known
    assert image_cuda("registry/custom:latest") is None
    uris = [f"{image.repository}:{image.tag}" for image in IMAGES if image.tag is not None]
    named = [image for image in IMAGES if image.tag is None]  # SageMaker's: the SDK names them
    if named and importlib.util.find_spec("sagemaker") is not None:
        from launcher.providers.sagemaker import sdk

        uris += [sdk.training_image("us-east-1", image.strategies[0], "ml.p4d.24xlarge",
                                    image.torch).uri for image in named]
    for uri in uris:
        cuda = image_cuda(uri)
        assert cuda is not None and cuda >= LAZY_LOADING_SINCE, uri


def test_nccl_buffers_follow_channels_and_buffsize() -> None:
    from launcher.estimate.overheads import nccl_bytes

    per_connection = 4 * MiB + 4_915_200 + 524_288  # Simple + LL128 + LL
    assert nccl_bytes(1) == 0
    assert nccl_bytes(8) == 32 * 2 * per_connection  # 588 MiB on NVLink
    assert nccl_bytes(8, nvlink=False) == 4 * 2 * per_connection
    assert nccl_bytes(8, buffsize=MiB) == 32 * 2 * (MiB + 4_915_200 + 524_288)


def test_a_plan_for_an_old_cuda_image_carries_the_eager_context() -> None:
    from launcher.estimate.footprint import Footprint
    from launcher.plan.memory import Target, per_gpu_memory
    from launcher.plan.plan import Memory

    single = Memory(parameters=MiB, gradients=MiB, optimizer=MiB, activations=MiB, temporary=0,
                    peak_allocated=4 * MiB)
    fp = Footprint(kind="config", precision="fp32", optimizer="adamw",
                   activation_checkpointing=False, parameters=1, memory_at=lambda b, a=1: single)
    v100 = Target(name="v", gpus=1, memory_bytes=16 * 2**30, generation="volta", cuda=(11, 2))
    assert per_gpu_memory(fp, v100, "single", 1, 1, micro=1).framework_overhead == 1343 * MiB
    new = Target(name="v", gpus=1, memory_bytes=16 * 2**30, generation="volta")
    assert per_gpu_memory(fp, new, "single", 1, 1, micro=1).framework_overhead == 500 * MiB
