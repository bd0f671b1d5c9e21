"""What a targets step's output depends on, without torch: the teacher's URI, the
scoring plan a finished step is compared with, the feature shards to score. The step
decides from these whether it has anything to do before it imports torch (4 s of a
no-op's 6 s here): a re-run with nothing changed is handed back in about a second.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from core.config import TargetsConfig
from core.storage import Storage


def teacher_uri(tc: TargetsConfig, own_train_uri: str) -> str:
    """targets.teacher, else the run's own trained model (`own_train_uri`/model.pt)."""
    return tc.teacher or f"{own_train_uri.rstrip('/')}/model.pt"


# targets.* keys that place or pace the scoring, or only sample its fidelity report: the
# stored targets are the same whatever they are.
OPERATIONAL_KEYS = {"actors", "threads_per_actor", "batch_frames", "device",
                    "num_gpus_per_actor", "fidelity_sample_frames", "zstd_level"}


def scoring_plan(tc: TargetsConfig, features: dict[str, Any], teacher_digest: str
                 ) -> dict[str, Any]:
    """What the stored targets depend on: the features (when they finished), the teacher
    (its bytes' digest, not its URI: a teacher trained again at the same URI scores
    differently, the same file named another way does not) and the targets keys that shape
    them (targets.teacher itself aside). A scored shard is kept only under the same plan
    (the step's resume_plan)."""
    keys = {k: v for k, v in asdict(tc).items()
            if k not in OPERATIONAL_KEYS and k != "teacher"}
    return json.loads(json.dumps({"features_finished_at": features.get("finished_at"),
                                  "teacher_digest": teacher_digest, "targets": keys}))


def feature_shards(st: Storage, features_uri: str) -> list[str]:
    """The shard ids of a features output (`features_uri`/shards/*.parquet)."""
    uris = st.list(f"{features_uri.rstrip('/')}/shards", suffix=".parquet")
    return [u.rsplit("/", 1)[1][: -len(".parquet")] for u in uris]
