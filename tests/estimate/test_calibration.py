"""The calibration store: records from runs, medians, never tightening an estimate."""

from launcher.estimate.calibration import Record, from_attempt, lookup, record


def _rec(gpu="A100-80GB", model="m", predicted=100, allocated=110, reserved=121):
    return Record(gpu=gpu, model=model, predicted_allocated=predicted,
                  measured_allocated=allocated, measured_reserved=reserved, at=0.0)


def test_median_reserve_ratio_per_gpu_and_scale_per_model(tmp_path):
    for allocated, reserved in ((100, 110), (100, 120), (100, 300)):  # one odd run
        record(tmp_path, _rec(allocated=allocated, reserved=reserved, predicted=90))
    record(tmp_path, _rec(gpu="L4", allocated=100, reserved=105))
    cal = lookup(tmp_path, "A100-80GB", "m")
    assert cal.records == 3
    assert cal.reserve_ratio == 1.2  # the median, not swung by 3.0
    assert abs(cal.allocated_scale - 100 / 90) < 1e-9
    assert lookup(tmp_path, "L4").reserve_ratio == 1.05
    assert lookup(tmp_path, "H100").reserve_ratio is None


def test_a_run_below_prediction_never_tightens(tmp_path):
    record(tmp_path, _rec(predicted=200, allocated=100, reserved=90))
    cal = lookup(tmp_path, "A100-80GB", "m")
    assert cal.allocated_scale == 1.0 and cal.reserve_ratio == 1.0


def test_torn_lines_are_skipped(tmp_path):
    record(tmp_path, _rec())
    with open(tmp_path / "calibration.jsonl", "a") as handle:
        handle.write('{"gpu": "A100-80GB", "mod')
    assert lookup(tmp_path, "A100-80GB").records == 1


def test_cpu_runs_are_not_recorded(tmp_path):
    plan = {"memory": {"peak_allocated": 100}}
    assert from_attempt(tmp_path, None, "m", plan, {"peak_rss_bytes": 5}) is None
    assert from_attempt(tmp_path, "L4", "m", plan, {"peak_allocated_bytes": None}) is None
    assert from_attempt(tmp_path, "L4", "m", plan, {"peak_allocated_bytes": 120,
                                                     "peak_reserved_bytes": 130}) is not None
    assert lookup(tmp_path, "L4", "m").allocated_scale == 1.2
