"""The fit: a trace's timelines at a few micro-batch sizes -> lines in the micro-batch size.

Every point of the step's memory timeline is fitted linearly over the sizes that ran the same
ops, and the upper envelope of those lines kept, phase by phase (``fit``); sizes that ran other
ops stay exact, directly traced points. Pure numpy (imported where it is used), no torch: the
parent process fits what the trace child recorded.
"""

from __future__ import annotations

from typing import Any

from launcher.estimate.trace_result import MICRO_PHASES, OPTIMIZER_PHASES


def fit(
    segments: dict[str, tuple[list, list]],
    boundary: dict[str, tuple[int, ...]],
    categories: list[str],
    sizes: list[int],
    verify: list[int],
    b0: int,
) -> dict[str, Any]:
    """Turn the traced segments into lines ``bytes = intercept + slope * micro_batch``.

    Micro-batch part: sizes whose op sequences are identical form a group; in the largest group
    every op's point is fitted over the group's sizes (``alignment="op"``). Sizes outside it
    (usually 1) are kept as exact, directly traced points. Optimizer part: the points of ``b0``'s
    optimizer phase, each moved by the fitted boundary (bytes alive when the phase starts).
    Build and step 1 enter as constant lines (traced once; they do not grow with the batch).
    """
    import numpy as np  # here, not at import: the CLI imports this module

    ncat = len(categories)
    main = segments[f"b{b0}"][0]
    opt_points = np.array([v for p, v in main if p in OPTIMIZER_PHASES],
                          dtype=np.float64).reshape(-1, ncat)
    fb = {b: [(p, v) for p, v in segments[f"b{b}"][0] if p in MICRO_PHASES]
          for b in sizes + verify}
    fb_ops = {
        b: [op for (p, _), op in zip(segments[f"b{b}"][0], segments[f"b{b}"][1], strict=True)
            if p in MICRO_PHASES]
        for b in sizes + verify
    }
    bound_at = {b: np.array(boundary[f"b{b}"], dtype=np.float64) for b in sizes + verify}
    const_lines = []
    for label in ("build", "step1"):
        timeline = segments[label][0]
        if timeline:
            i = int(np.argmax([sum(v) for _, v in timeline]))
            const_lines.append((np.array(timeline[i][1], dtype=np.float64), timeline[i][0], label))

    # --- exact values at every traced size (no fit) --------------------------------------
    def direct(b: int) -> tuple[tuple[np.ndarray, int, str], dict[int, list[float]]]:
        """The peak at a traced size, and the peak of each phase (for depth scaling): the first
        point of largest total, over the size's own points, the optimizer phase's moved by its
        boundary, and the build's and step 1's (one array: a 7B trace has thousands of
        points, and summing each on its own was most of this function's time)."""
        shift = bound_at[b] - bound_at[b0]
        shift[-1] = 0.0  # scratch is per op, never carried
        values = np.concatenate([
            np.array([v for _, v in fb[b]], dtype=np.float64).reshape(-1, ncat),
            opt_points + shift,
            np.array([c[0] for c in const_lines], dtype=np.float64).reshape(-1, ncat)])
        phase_of = [p for p, _ in fb[b]] + [3] * len(opt_points) + [c[1] for c in const_lines]
        segment_of = ["step"] * (len(values) - len(const_lines)) + [c[2] for c in const_lines]
        totals = values.sum(axis=1)
        i = int(np.argmax(totals))
        by_phase: dict[int, list[float]] = {}
        phase_arr = np.array(phase_of)
        for ph in dict.fromkeys(phase_of):  # in the order each phase first appears
            where = np.flatnonzero(phase_arr == ph)
            by_phase[ph] = [float(x) for x in values[where[int(np.argmax(totals[where]))]]]
        return (values[i], phase_of[i], segment_of[i]), by_phase

    per_size = {}
    for b in sizes + verify:
        (v, phase, seg), phases = direct(b)
        per_size[str(b)] = {"peak": float(v.sum()), "at_peak": [float(x) for x in v],
                            "phase": phase, "segment": seg, "ops": len(fb[b]),
                            "fit": False, "phases": phases}

    # --- the fit -------------------------------------------------------------------------
    groups: list[list[int]] = []
    for b in sizes:
        for g in groups:
            if fb_ops[g[0]] == fb_ops[b]:
                g.append(b)
                break
        else:
            groups.append([b])
    group = max(groups, key=lambda g: (len(g), max(g)))
    if len(group) >= 2:
        alignment = "op"
        xs = np.array(group, dtype=np.float64)
        values = np.array([[v for _, v in fb[b]] for b in group], dtype=np.float64)
        phases = [p for p, _ in fb[group[0]]]
    else:
        # No two sizes run exactly the same ops. Align them as sequences instead: runs of equal
        # ops pair point by point, each stretch that differs becomes one point (its maximum).
        alignment = "sequence"
        group = list(sizes)
        xs = np.array(group, dtype=np.float64)
        units, ranges = _align_sequences(fb_ops[group[-1]], [fb_ops[b] for b in group])
        values = np.array([
            [_range_max(fb[b], lo, hi) for lo, hi in ranges[k]] for k, b in enumerate(group)
        ], dtype=np.float64)
        ref = group[-1]
        phases = [fb[ref][min(lo, len(fb[ref]) - 1)][0] for lo, _ in ranges[-1]]
        del units
    for b in group:
        per_size[str(b)]["fit"] = True
    bounds = np.array([bound_at[b] for b in group])
    if len(xs) >= 2:
        slope, intercept = _linear_fit(xs, values)
        b_slope, b_intercept = _linear_fit(xs, bounds[:, None, :])
        b_slope, b_intercept = b_slope[0], b_intercept[0]
    else:
        slope, intercept = np.zeros_like(values[0]), values[0]
        b_slope, b_intercept = np.zeros(ncat), bounds[0]
    b_slope[-1] = 0.0
    fitted = intercept[None] + slope[None] * xs[:, None, None]
    resid = np.abs(fitted.sum(axis=2) - values.sum(axis=2))
    b_resid = np.abs((b_intercept[None] + b_slope[None] * xs[:, None]).sum(1) - bounds.sum(1))
    peak = max(info["peak"] for info in per_size.values())
    max_resid = float(max(resid.max() if resid.size else 0.0, b_resid.max()))

    all_c = [intercept[t] for t in range(intercept.shape[0])]
    all_s = [slope[t] for t in range(slope.shape[0])]
    all_phase = list(phases)
    all_seg = ["step"] * len(all_c)
    # optimizer-phase points: their value at b0, moved with the boundary's slope
    for v in opt_points:
        all_c.append(v - b_slope * b0)
        all_s.append(b_slope.copy())
        all_phase.append(3)
        all_seg.append("step")
    for v, phase, label in const_lines:
        all_c.append(v)
        all_s.append(np.zeros(ncat))
        all_phase.append(phase)
        all_seg.append(label)
    c_arr = np.array(all_c)
    s_arr = np.array(all_s)
    # Each phase's own upper envelope (their union holds the overall one): scaling a trace to
    # the model's real depth extrapolates every phase's peak, and the phase that is the peak at
    # two blocks need not be the one at thirty-two.
    phase_of = np.array(all_phase)
    keep = sorted(
        int(np.flatnonzero(phase_of == ph)[i])
        for ph in sorted(set(all_phase))
        for i in _upper_envelope(c_arr[phase_of == ph].sum(axis=1),
                                 s_arr[phase_of == ph].sum(axis=1), start=1.0)
    )
    lines = [{
        "intercept": [float(x) for x in c_arr[t]],
        "slope": [float(x) for x in s_arr[t]],
        "phase": int(all_phase[t]),
        "segment": all_seg[t],
    } for t in keep]
    verification = []
    for vb in verify:
        predicted = max(sum(ln["intercept"]) + vb * sum(ln["slope"]) for ln in lines)
        verification.append({"micro_batch": vb, "traced": per_size[str(vb)]["peak"],
                             "predicted": predicted})
    return {
        "categories": categories,
        "lines": lines,
        "alignment": alignment,
        "fit_sizes": group,
        "size_groups": groups,
        "fit_points": int(values.shape[1]),
        "max_residual_bytes": max_resid,
        "max_residual_fraction": max_resid / peak if peak else 0.0,
        "per_size": per_size,
        "verification": verification,
    }


def _range_max(timeline: list, lo: int, hi: int) -> list[int]:
    """The point of largest total in ``timeline[lo:hi]`` (the one before ``lo`` if empty)."""
    if hi <= lo:
        return list(timeline[max(lo - 1, 0)][1])
    return list(max((v for _, v in timeline[lo:hi]), key=sum))


def _align_sequences(ref: list, seqs: list[list]) -> tuple[int, list[list[tuple[int, int]]]]:
    """Split ``ref`` into units that every sequence in ``seqs`` matches, and give each sequence's
    index range for every unit.

    A unit is one op where all sequences agree (difflib "equal" runs), or one merged stretch
    where any of them differs from ``ref`` (a batch of 1 makes a view where a larger batch makes
    a copy). Returns (number of units, per sequence a list of (start, end) ranges).
    """
    n = len(ref)
    bad: list[tuple[int, int]] = []
    opcodes = []
    for seq in seqs:
        codes = _opcodes(ref, seq)
        opcodes.append(codes)
        for tag, i1, i2, _, _ in codes:
            if tag != "equal":
                bad.append((i1, i2) if i2 > i1 else (max(i1 - 1, 0), min(i1 + 1, n)))
    bad.sort()
    merged: list[list[int]] = []
    for a, b in bad:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    cuts: list[tuple[int, int]] = []
    i = 0
    for a, b in merged:
        cuts.extend((k, k + 1) for k in range(i, a))
        cuts.append((a, b))
        i = b
    cuts.extend((k, k + 1) for k in range(i, n))
    ranges = []
    for codes in opcodes:
        to_seq: dict[int, int] = {}
        for tag, i1, i2, j1, j2 in codes:
            if tag == "equal":
                for k in range(i1, i2 + 1):
                    to_seq[k] = j1 + (k - i1)
            else:
                to_seq.setdefault(i1, j1)
                to_seq[i2] = j2
        ranges.append([(to_seq[a], to_seq[b]) for a, b in cuts])
    return len(cuts), ranges


def _opcodes(ref: list, seq: list) -> list[tuple[str, int, int, int, int]]:
    """The opcodes that take ``ref`` to ``seq`` (difflib's form): the two sequences' common head
    and tail as equal runs, and ``difflib.SequenceMatcher`` (autojunk off) on the stretch
    between them. The matcher's search is quadratic in what it is given, and the op sequences
    of two micro-batch sizes differ in a stretch of a few hundred ops of thousands (0.2 s a
    pair for a 7B trace, given whole). Given whole, it can also pair ops across the head or
    the tail where they repeat; both are alignments, and this one keeps the step's start with
    its start and its end with its end (the same opcodes on every recorded pair of the 7B).
    Identical sequences, the usual case at a size other than 1, are one equal run."""
    from difflib import SequenceMatcher

    n, m = len(ref), len(seq)
    head = 0
    while head < min(n, m) and ref[head] == seq[head]:
        head += 1
    tail = 0
    while tail < min(n, m) - head and ref[n - 1 - tail] == seq[m - 1 - tail]:
        tail += 1
    codes: list[tuple[str, int, int, int, int]] = []

    if head:
        codes.append(("equal", 0, head, 0, head))
    if head < n - tail or head < m - tail:
        middle = SequenceMatcher(None, ref[head:n - tail], seq[head:m - tail], autojunk=False)
        for tag, i1, i2, j1, j2 in middle.get_opcodes():
            if tag == "equal" and codes and codes[-1][0] == "equal":
                _, a1, _, b1, _ = codes.pop()
                codes.append(("equal", a1, i2 + head, b1, j2 + head))
            else:
                codes.append((tag, i1 + head, i2 + head, j1 + head, j2 + head))
    if tail:
        if codes and codes[-1][0] == "equal":
            _, a1, _, b1, _ = codes.pop()
            codes.append(("equal", a1, n, b1, m))
        else:
            codes.append(("equal", n - tail, n, m - tail, m))
    return codes


def _linear_fit(xs: Any, values: Any) -> tuple[Any, Any]:
    """Least-squares slope and intercept along axis 0 of ``values`` (sizes x points x cats)."""
    xm = xs.mean()
    dx = xs - xm
    slope = (dx[:, None, None] * (values - values.mean(axis=0))).sum(axis=0) / (dx**2).sum()
    return slope, values.mean(axis=0) - slope * xm


def _upper_envelope(c: Any, s: Any, start: float) -> list[int]:
    """Indices of the lines ``c + s*x`` that are the maximum for some ``x >= start``."""
    import numpy as np

    order = np.lexsort((c, s))  # by slope, then intercept
    hull: list[int] = []
    for i in order:
        i = int(i)
        while hull and s[hull[-1]] == s[i]:
            hull.pop()  # same slope, lower (or equal) intercept: never above
        while len(hull) >= 2:
            a, m = hull[-2], hull[-1]
            # m is never the maximum if i overtakes a no later than m does
            if (c[a] - c[i]) * (s[m] - s[a]) <= (c[a] - c[m]) * (s[i] - s[a]):
                hull.pop()
            else:
                break
        hull.append(i)
    keep = []
    for k, i in enumerate(hull):
        if k + 1 < len(hull):
            j = hull[k + 1]
            if (c[i] - c[j]) / (s[j] - s[i]) < start:
                continue  # overtaken before ``start``
        keep.append(i)
    return keep
