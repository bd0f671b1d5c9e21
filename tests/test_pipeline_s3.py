"""select -> features -> repartition with the corpus and storage.root on S3 (moto server)."""
from __future__ import annotations

import json

import pytest

from core import records
from tests.conftest import CTM_LABELS
from tests.test_features import _steps
from tests.test_select import make_corpus

pytestmark = pytest.mark.integration


def _upload(client, bucket: str, local_root, prefix: str) -> None:
    for p in local_root.rglob("*"):
        if p.is_file():
            client.upload_file(str(p), bucket, f"{prefix}/{p.relative_to(local_root)}")


def test_pipeline_on_s3(tmp_path, s3_bucket, s3_server, local_cfg, ray_local):
    import boto3

    bucket, overrides = s3_bucket
    root = tmp_path / "corpus"
    info = make_corpus(root, speakers=4, utts=2, labeled=2, bad=True, seconds=(0.6, 1.2))
    client = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    _upload(client, bucket, root, "corpus")
    cfg = local_cfg(CTM_LABELS, *overrides, f"data.corpus=s3://{bucket}/corpus",
                    f"storage.root=s3://{bucket}/store", "select.shard_hours=0.0004",
                    "train.workers=2", "features.resample=false", "features.downmix=false")
    sel, feat, rep = _steps(cfg, "s3run", "select", "features", "repartition")
    for s in (sel, feat, rep):
        assert s["counts"]["in"] == s["counts"]["out"] + s["counts"]["rejected"]
        assert s["uri"].startswith(f"s3://{bucket}/store/runs/s3run/")
    assert feat["counts"]["out"] == len(info["good"])
    assert feat["metrics"]["reject_reasons"]["missing_audio"] == 1
    assert feat["metrics"]["reject_reasons"]["truncated_audio"] == 1
    assert rep["counts"]["out"] == feat["counts"]["out"]

    def get(key):
        return client.get_object(Bucket=bucket, Key=key)["Body"].read()

    base = "store/runs/s3run"
    cmvn = json.loads(get(f"{base}/features/cmvn.json"))
    assert len(cmvn["sum"]) == 192 and cmvn["count"] > 0
    index = json.loads(get(f"{base}/repartition/unlabeled/_index.json"))
    assert len(index["partitions"]) % 2 == 0
    import io

    import pyarrow.parquet as pq

    part = index["partitions"][0]["path"]
    rows = pq.read_table(io.BytesIO(get(f"{base}/repartition/unlabeled/{part}"))).to_pylist()
    for r in rows:
        assert records.decode_feats(r).shape == (r["num_frames"], 192)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=base)["Contents"]]
    assert not [k for k in keys if ".tmp-" in k]
    # re-run: a no-op on S3 too
    (again,) = _steps(cfg, "s3run", "features")
    assert again["finished_at"] == feat["finished_at"]
