"""infra/: the EC2 cluster template against Ray's schema and our placement rule, the
image, the IAM policies, and the cost estimator's arithmetic."""
from __future__ import annotations

import copy
import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from core.config import load_config

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "infra" / "ray" / "cluster-aws.yaml"
INTENDED = {"select": "x1", "repartition": "x1", "features": "c4", "targets": "p3",
            "train": "p3", "sequence": "p3", "evaluate": "p3", "lm": "x1", "decode": "c4",
            "align": "c4", "pseudolabel": "c4"}


@pytest.fixture(scope="module")
def cluster():
    return yaml.safe_load(CLUSTER.read_text())


@pytest.fixture(scope="module")
def aws():
    return load_config(ROOT / "configs" / "aws.yaml")


def test_cluster_passes_rays_schema_and_validate_config(cluster):
    import jsonschema
    import ray.autoscaler
    from ray.autoscaler._private.util import fillout_defaults, prepare_config, validate_config

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(cluster, schema)
    validate_config(fillout_defaults(copy.deepcopy(cluster)))
    prepared = prepare_config(copy.deepcopy(cluster))
    validate_config(prepared)
    assert set(prepared["available_node_types"]) == {"head", "p3", "x1", "c4"}


def test_pools_are_the_intended_instances_with_bounds(cluster):
    nodes = cluster["available_node_types"]
    assert nodes["p3"]["node_config"]["InstanceType"] == "p3.16xlarge"
    assert nodes["p3"]["resources"]["GPU"] == 8
    assert nodes["x1"]["node_config"]["InstanceType"] == "x1.32xlarge"
    assert nodes["x1"]["resources"]["memory"] > 10 * nodes["p3"]["resources"]["memory"] // 3
    assert nodes["c4"]["node_config"]["InstanceType"] == "c4.4xlarge"
    assert "GPU" not in nodes["c4"]["resources"] and "GPU" not in nodes["x1"]["resources"]
    total = 0
    for name in ("p3", "x1", "c4"):
        nt = nodes[name]
        assert 0 <= nt["min_workers"] <= nt["max_workers"]
        total += nt["max_workers"]
    assert total <= cluster["max_workers"]
    assert cluster["head_node_type"] == "head"
    assert nodes["head"]["resources"] == {"CPU": 0}
    assert cluster["docker"]["image"].endswith("/amflow:0.1.0")
    assert "-e RAY_AUTH_MODE=token" in cluster["docker"]["run_options"]


def test_nodes_start_with_the_serve_ingress_that_serve_defaults_to(cluster, aws):
    """serve.ingress=haproxy takes effect only where Ray starts with Serve's ingress
    variables (amflow serve sets them for a local Ray only): every node has them."""
    from serving.app import INGRESS_ENV

    assert aws.serve.ingress == "haproxy"
    for name, value in INGRESS_ENV.items():
        assert f"-e {name}={value}" in cluster["docker"]["run_options"]


def _satisfies(resources: dict, request: dict) -> bool:
    return all(resources.get(k, 0) >= v for k, v in request.items())


def test_each_step_lands_on_exactly_its_pool(cluster, aws):
    nodes = cluster["available_node_types"]
    assert set(aws.ray.step_resources) == set(INTENDED)
    for step, request in aws.ray.step_resources.items():
        fits = [n for n, nt in nodes.items() if _satisfies(nt["resources"], request)]
        assert fits == [INTENDED[step]], (step, request, fits)
        # ... also with the CPU/GPU a step's Ray tasks ask for on top of the pool sliver.
        extra = {"GPU": 1} if INTENDED[step] == "p3" else {"CPU": 1}
        fits = [n for n, nt in nodes.items()
                if _satisfies(nt["resources"], {**request, **extra})]
        assert fits == [INTENDED[step]]
    # Nothing else advertises a pool resource.
    for name, nt in nodes.items():
        pools = [k for k in nt["resources"] if k.startswith("pool_")]
        assert pools == ([] if name == "head" else [f"pool_{name}"])


def test_dockerfile_is_cuda_pinned_and_carries_the_project():
    text = (ROOT / "infra" / "docker" / "Dockerfile").read_text()
    assert re.search(r"^FROM nvidia/cuda:[\d.]+-cudnn-runtime-ubuntu", text, re.M)
    assert "python3.11" in text and "WORKDIR /app" in text
    assert "pyproject.toml" in text and "pip install -r /tmp/requirements.txt" in text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    deps = project["project"]["dependencies"]
    assert all("==" in d for d in deps), deps  # the image installs exactly these pins
    for pkg in project["tool"]["setuptools"]["packages"]["find"]["include"]:
        name = pkg.rstrip("*")
        assert f"COPY {name} ./{name}" in text, name
    assert "COPY configs ./configs" in text and "espeak-ng" in text


def _statements(name: str) -> list[dict]:
    doc = json.loads((ROOT / "infra" / "iam" / name).read_text())
    assert doc["Version"] == "2012-10-17"
    return doc["Statement"]


def test_s3_policies_are_least_privilege_for_the_configured_prefixes(aws):
    bucket, _, prefix = aws.storage.root.removeprefix("s3://").partition("/")
    cbucket, _, cprefix = aws.data.corpus.removeprefix("s3://").partition("/")
    assert bucket == cbucket == "amflow-data"
    for name in ("s3-pipeline.json", "s3-corpus-writer.json", "s3-airflow-readonly.json"):
        for st in _statements(name):
            actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
            assert st["Effect"] == "Allow"
            assert all(a.startswith("s3:") and "*" not in a for a in actions), (name, actions)
            resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
            for r in resources:
                assert r.startswith(f"arn:aws:s3:::{bucket}"), (name, r)
                if "s3:ListBucket" in actions:
                    assert r == f"arn:aws:s3:::{bucket}" and "s3:prefix" in json.dumps(
                        st["Condition"])
                else:
                    assert r.startswith(f"arn:aws:s3:::{bucket}/{prefix}/") or r.startswith(
                        f"arn:aws:s3:::{bucket}/{cprefix}/"), (name, r)
    pipeline = {a: st["Resource"] for st in _statements("s3-pipeline.json")
                for a in st["Action"]}
    assert pipeline["s3:PutObject"] == f"arn:aws:s3:::{bucket}/{prefix}/*"
    assert pipeline["s3:AbortMultipartUpload"] == f"arn:aws:s3:::{bucket}/{prefix}/*"
    # The pipeline reads the corpus but cannot write it.
    writes = [st for st in _statements("s3-pipeline.json") if "s3:PutObject" in st["Action"]]
    assert all(cprefix not in st["Resource"] for st in writes)
    head = _statements("ray-head-autoscaler.json")
    assert any(st["Action"] == "iam:PassRole" and st["Resource"].endswith("role/amflow-ray-worker")
               for st in head)


def test_cost_estimate_from_measured_step_summaries(tmp_path):
    from amflow import cost

    run = tmp_path / "store" / "runs" / "r"
    measured = {  # step: (audio hours, wall s)
        "select": (0.5, 5.0), "features": (0.5, 10.0), "targets": (0.5, 20.0),
        "repartition": (0.5, 4.0), "train": (0.5, 100.0), "evaluate": (0.1, 8.0)}
    mcfg = load_config(ROOT / "configs" / "local.yaml", [f"storage.root={tmp_path / 'store'}"])
    target = load_config(ROOT / "configs" / "aws.yaml")
    student_params = cost.lstm_params(mcfg, "student", 40)  # a 40-phone measured run
    for step, (hours, wall) in measured.items():
        (run / step).mkdir(parents=True)
        metrics = {"audio_hours": hours}
        if step == "train":
            metrics["parameters"] = student_params
        (run / step / "_SUCCESS.json").write_text(json.dumps(
            {"step": step, "wall_s": wall, "metrics": metrics}))
    pools = cost.pools_from_cluster()
    rows = {r.step: r for r in cost.estimate(str(run), mcfg, target, 1000.0, pools)}
    assert set(rows) == set(measured)
    cores = mcfg.ray.num_cpus
    # features on c4.4xlarge (16 vCPU): 1000 h / (0.5 h / (10 s * cores) * 16) / 3600 s/h
    feat_node_h = 1000 / (0.5 / (10 * cores) * 16) / 3600
    assert rows["features"].node_hours == pytest.approx(feat_node_h)
    assert rows["features"].usd == pytest.approx(feat_node_h * target.cost.c4_4xlarge)
    # train on p3.16xlarge, scaled by model size (5x768 over the local LSTM, 3183 senones over
    # 40 phones) and epochs (aws over local).
    size = cost.lstm_params(target, "student", 3183) / student_params
    assert size > 10
    train_node_h = 1000 / (0.5 / (100 * cores) * 64 * target.cost.gpu_speedup) / 3600 \
        * size * target.train.passes.epochs / mcfg.train.passes.epochs
    assert rows["train"].node_hours == pytest.approx(train_node_h)
    assert rows["train"].usd == pytest.approx(train_node_h * target.cost.p3_16xlarge)
    assert rows["select"].pool == "pool_x1" and rows["select"].scale == 1.0
    assert rows["targets"].scale == pytest.approx(
        cost.lstm_params(target, "teacher", 3183) / cost.lstm_params(mcfg, "teacher", 40))
    table = cost.table(list(rows.values()), 1000.0, pools)
    assert "x1.32xlarge" in table and "**total**" in table
