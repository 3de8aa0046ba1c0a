"""The SMP v2 script run for real on the CPU, 2 gloo processes, with a stand-in for
``torch.sagemaker`` (only the SMP v2 image has it; ``init`` is all the script calls).

Everything else in the script is PyTorch FSDP and DCP, and that is what runs here: one FSDP unit
per block, accumulation under ``no_sync``, FSDP's own gradient clipping, sharded checkpoints and a
resume. FSDP computes what DDP computes, so the losses are DDP's. With
``LAUNCH_TEST_PYTHON`` set (see harness.py) the runs use another torch: the SMP image's is 2.5.1.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer_templates.harness import Run, start
from tests.trainer_templates.test_training import assert_same_losses

pytestmark = pytest.mark.slow

LOADER = {"recipe": "tiny_loader.py", "steps": 4, "micro_batch_size": 2, "grad_accum_steps": 2}
STAND_IN = '''\
"""torch.sagemaker stand-in: records init()'s configuration, prints it, does nothing else."""
import json, sys, types

module = types.ModuleType("torch.sagemaker")

def init(config):
    print(json.dumps({"smp_stand_in": sorted(config)}), flush=True)

module.init = init
sys.modules["torch.sagemaker"] = module
'''


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    base = tmp_path_factory.mktemp("smp_v2_cpu")
    (base / "stand_in").mkdir()
    (base / "stand_in" / "sitecustomize.py").write_text(STAND_IN)
    env = {"PYTHONPATH": str(base / "stand_in")}
    started = {
        "ddp": start(base / "ddp", nproc=2, strategy="ddp", **LOADER),
        "smp": start(base / "smp", nproc=2, strategy="smp_v2", env=env, checkpoint_every=2,
                     **LOADER),
    }
    done = {name: pending.wait() for name, pending in started.items()}
    done["resume"] = start(base / "resume", nproc=2, strategy="smp_v2", env=env,
                           checkpoint_dir=done["smp"].check().checkpoint_dir,
                           **{**LOADER, "steps": 6}).wait()
    return done


def test_smp_v2_trains_like_ddp_and_resumes_from_its_sharded_checkpoint(
    runs: dict[str, Run],
) -> None:
    smp, ddp, resume = runs["smp"].check(), runs["ddp"].check(), runs["resume"].check()
    assert '"smp_stand_in"' in smp.stdout  # torch.sagemaker.init was called
    for rank in (0, 1):
        assert_same_losses(smp.losses(rank), ddp.losses(rank), tol=1e-5)
    step_dirs = sorted(p.name for p in Path(smp.checkpoint_dir).iterdir())
    assert "step_00000004" in step_dirs
    assert [e["step"] for e in resume.of("resume", 0)] == [4]
    assert list(resume.losses(0)) == [5, 6]
