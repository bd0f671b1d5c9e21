"""Checkpointer: a save never rewrites a published checkpoint (found by the rehearsal)."""
from __future__ import annotations

from core.config import StorageConfig
from core.storage import Storage
from training.checkpoint import Checkpointer


def test_two_saves_at_one_step_with_a_rank_dying_half_way_resume_consistently(tmp_path):
    storage = Storage(StorageConfig(root=str(tmp_path)))
    d = str(tmp_path / "checkpoints")
    r0, r1 = (Checkpointer(storage, d, rank=r, world=2) for r in (0, 1))
    # the periodic save at step 10 (pass 0, minibatch 10), by both ranks
    for c in (r1, r0):  # rank 0 publishes latest.json
        c.save(10, {"pass": 0, "batch": 10}, extra={"pass_index": 0, "batch": 10})
    first = r0.latest()
    # the end-of-pass save, also at step 10: rank 1 writes its file, rank 0 dies first
    r1.save(10, {"pass": 1, "batch": 0}, extra={"pass_index": 1, "batch": 0})
    # a restarted group resumes both ranks from the same published save
    assert r0.latest() == first
    assert r0.load() == r1.load() == {"pass": 0, "batch": 10}
    # later saves keep going, each under a new name
    for c in (r1, r0):
        c.save(10, {"pass": 1, "batch": 0})
    assert r0.latest()["name"] != first["name"] and r0.latest()["step"] == 10
    assert r0.load() == r1.load() == {"pass": 1, "batch": 0}
