"""The Ray Train launcher: a real TorchTrainer with 2 gloo workers, a killed worker,
recovery from the last per-rank checkpoint."""
from __future__ import annotations

import pytest
import torch

from training.distributed import run_distributed, spawn_local, toy_spawn, toy_worker
from training.plan import LaunchSpec


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["bmuf"])
def test_killed_worker_recovers_and_finishes(ray_local, local_cfg, tmp_path, algorithm):
    cfg = local_cfg("train.workers=2", f"train.algorithm={algorithm}")
    train = {"algorithm": algorithm, "block_size": 3, "lr": 0.01}
    plan = {"train": train, "steps": 10, "checkpoint_every": 2, "crash_at": 5,
            "crash_rank": 1, "crash_marker": str(tmp_path / "crashed")}
    launch = LaunchSpec(storage_path=str(tmp_path / "ray"), name="toy", max_failures=2,
                        cpus_per_worker=0.5)
    out = run_distributed(toy_worker, plan, cfg, launch)
    assert (tmp_path / "crashed").exists()  # the worker really was killed once
    # restarted from a reported checkpoint (the latest the controller had registered
    # before the group died: step 4, or step 2 if the step-4 report was still in flight)
    assert out["resumed_from"] in (2, 4)
    assert out["backend"] == "gloo"
    # identical to an uninterrupted run (per-rank residual/local-model state restored)
    ref = spawn_local(toy_spawn, 2, {"train": train, "steps": 10, "checkpoint_every": 2})
    torch.testing.assert_close(torch.tensor(out["weights"]), torch.tensor(ref[0]["weights"]),
                               rtol=0, atol=0)
    assert out["stats"]["steps"] == 10
