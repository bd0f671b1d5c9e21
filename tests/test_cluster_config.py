"""What the cluster config asks for exists: every custom resource and GPU count a step
requests in configs/aws.yaml is provided by a node type of infra/ray/cluster-aws.yaml
(and configs/rehearsal.yaml's by the rehearsal's local nodes), so a misnamed pool fails
here, not after an hour of waiting on the cluster."""
from __future__ import annotations

from pathlib import Path

import pytest

from amflow import placement
from core.config import load_config

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "infra" / "ray" / "cluster-aws.yaml"


@pytest.fixture(scope="module")
def node_types():
    return placement.load_node_types(CLUSTER)


def test_every_request_of_the_aws_config_fits_a_node_type(node_types):
    cfg = load_config(ROOT / "configs" / "aws.yaml")
    assert placement.unplaceable(cfg, node_types) == []
    # Every DAG step names its pool: nothing is left to float onto any free CPU.
    assert set(placement.dag_steps()) <= set(cfg.ray.step_resources)
    reqs = placement.requests(cfg, gpus_in_cluster=True)
    # On the cluster the GPU steps do ask for GPUs (teacher actors, Ray Train workers).
    gpu_reqs = {r.what for r in reqs if r.resources.get("GPU")}
    assert gpu_reqs == {"teacher actor", "Ray Train worker"}
    # ... and each lands only on its own pool's node type.
    for r in reqs:
        pools = [k for k in r.resources if k.startswith("pool_")]
        if r.what == "driver" or pools:
            fits = placement.fitting_nodes(node_types, r.resources)
            assert fits == [p.removeprefix("pool_") for p in pools] or (not pools and fits), r


def test_every_request_with_augmentation_fits(node_types):
    cfg = load_config(ROOT / "configs" / "aws.yaml", ["train.augment.enabled=true"])
    assert placement.unplaceable(cfg, node_types) == []


@pytest.mark.parametrize("override, needle", [
    ("ray.step_resources.features={pool_c5: 0.01}", "pool_c5"),       # misnamed pool
    ("ray.step_resources.train={pool_p4: 0.01}", "pool_p4"),
    ("train.augment.resources={pool_cpu: 0.01}", "pool_cpu"),
    ("targets.num_gpus_per_actor=16", "GPU"),                          # more than a node has
    ("ray.step_resources.targets={pool_c4: 0.01}", "no single node type"),  # GPU on the C4 pool
])
def test_a_misnamed_pool_or_impossible_gpu_count_fails_the_check(node_types, override, needle):
    sets = [override] + (["train.augment.enabled=true"] if "augment" in override else [])
    cfg = load_config(ROOT / "configs" / "aws.yaml", sets)
    bad = placement.unplaceable(cfg, node_types)
    assert bad and any(needle in line for line in bad), bad


def test_the_rehearsal_config_fits_the_rehearsal_nodes():
    """configs/rehearsal.yaml against the local nodes scripts/rehearsal.py starts."""
    from scripts.rehearsal import NODES, rehearsal_config_data, ALLOWED_OVERRIDES

    import yaml

    from core.config import Config
    from core.config.coercion import build

    data = rehearsal_config_data()
    cfg = load_config(None, [])  # defaults, then the merged data
    cfg = build(Config, data, "")
    node_types = {n["name"]: {"resources": {"CPU": n["cpus"], **n["resources"]}}
                  for n in NODES}
    assert placement.unplaceable(cfg, node_types) == []
    # The rehearsal overrides sizes, endpoints and addresses only: the placement (pools),
    # the runner mode and the algorithm are aws.yaml's.
    aws = yaml.safe_load((ROOT / "configs" / "aws.yaml").read_text())
    over = yaml.safe_load((ROOT / "configs" / "rehearsal.yaml").read_text())

    def keys(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict) and v and not k.endswith("step_resources"):
                yield from keys(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"

    for key in keys(over):
        assert any(key == a or key.startswith(a + ".") for a in ALLOWED_OVERRIDES), key
    assert data["ray"]["step_resources"] == aws["ray"]["step_resources"]
    assert data["runner"]["mode"] == "ray_job"


def test_train_workers_ask_for_the_train_pool():
    """Ray Train's workers carry the train step's pool sliver (they used to ask for CPU
    and GPU only, and could start on any node with a free CPU: a C4 or X1 node)."""
    from training.distributed import worker_resources

    aws = load_config(ROOT / "configs" / "aws.yaml")
    assert worker_resources(aws, 1.0, True) == {"CPU": 1.0, "GPU": 1, "pool_p3": 0.01}
    local = load_config(ROOT / "configs" / "local.yaml")
    assert worker_resources(local, 0.5, False) == {"CPU": 0.5}
