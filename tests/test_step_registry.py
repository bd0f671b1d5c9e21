"""The registry of steps (amflow/steps/registry.py) is the one list of steps.

A toy step registered here (monkeypatched into the registry, nothing else edited) shows up
in the CLI's parser and help, the job runner's command, the placement requests, the pool
slots, the report's step order, the cost model, the daily hand-back and the DAG operator.
And `align`, which the DAGs run, now has its placement checked.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from amflow.steps import registry as R

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "infra" / "ray" / "cluster-aws.yaml"

# The report's order before the registry (tasks/report.py's STEP_ORDER): kept as it was.
LEGACY_REPORT_ORDER = (
    "corpus", "select", "features", "targets", "repartition", "lm",
    *(f"{s}-{t}" if t else s for s in ("train", "evaluate", "decode", "sequence",
                                       "evaluate-sequence", "decode-sequence")
      for t in ("teacher", "baseline", "")),
    "simulate")


def toy_run(ctx, args):
    """The toy step's run(ctx, args): says what it was given."""
    return {"step": ctx.step, "run_id": ctx.run_id, "force": ctx.force,
            "context": type(ctx).__name__, "size": args.size}


def toy_unchanged(ctx):
    return {"step": ctx.step, "run_id": ctx.run_id, "unchanged": True}


def _toy_args(p) -> None:
    p.add_argument("--size", type=int, default=3, help="how big a toy to make")


def toy(**fields) -> R.Step:
    base = dict(entry="tests.test_step_registry:toy_run", help="make a toy of the run",
                reads="nothing but config", writes="runs/<id>/toy/_SUCCESS.json",
                add_args=_toy_args)
    return R.Step(**{**base, **fields})


@pytest.fixture()
def register(monkeypatch):
    """register(**fields): the toy step, in the registry for this test only."""
    def add(**fields) -> R.Step:
        spec = toy(**fields)
        monkeypatch.setitem(R.STEPS, "toy", spec)
        return spec
    return add


def test_a_registered_step_is_a_command_with_its_help_and_flags(register):
    from amflow.cli import build_parser

    register()
    parser = build_parser()
    assert "toy          make a toy of the run" in parser.epilog
    assert "reads:  nothing but config" in parser.epilog
    args = parser.parse_args(["toy", "--run-id", "r1", "--size", "5"])
    assert (args.step, args.run_id, args.size) == ("toy", "r1", 5)
    sub = next(a for a in parser._actions if a.dest == "step")
    assert "make a toy of the run" in sub.choices["toy"].format_help()
    with pytest.raises(SystemExit):  # needs_run: --run-id is required
        parser.parse_args(["toy"])


def test_every_step_runs_as_run_ctx_args(register, tmp_path, capsys):
    """One run shape: a run's StepContext with a run id, a NoRunContext without one."""
    from amflow.cli import main
    from amflow.jobs.naming import parse_summary

    register(needs_run=False)
    store = [f"storage.root={tmp_path}", "--config", str(ROOT / "configs" / "local.yaml")]
    assert main(["toy", "--set", *store, "--size", "2", "--force"]) == 0
    assert parse_summary(capsys.readouterr().out) == {
        "step": "toy", "run_id": None, "force": True, "context": "NoRunContext", "size": 2}
    assert main(["toy", "--run-id", "r7", "--set", *store]) == 0
    assert parse_summary(capsys.readouterr().out) == {
        "step": "toy", "run_id": "r7", "force": False, "context": "StepContext", "size": 3}


def test_step_context_follows_the_registry(local_cfg):
    cfg = local_cfg()
    assert type(R.step_context("select", cfg, "r1")).__name__ == "StepContext"
    assert type(R.step_context("corpus", cfg, None)).__name__ == "NoRunContext"
    assert R.step_context("bench", cfg, None).run_id == "bench"  # its default run
    shown = R.step_context("config", cfg, "r1")  # reads --run-id itself: never a run's
    assert type(shown).__name__ == "NoRunContext" and shown.cfg is cfg


def test_the_job_runner_runs_a_registered_step_and_refuses_others(register):
    from amflow.jobs import step_command
    from amflow.jobs.__main__ import main as jobs_main

    register()
    assert step_command(["amflow"], "toy", config="c.yaml", run_id="r1") == [
        "amflow", "toy", "--config", "c.yaml", "--run-id", "r1"]
    with pytest.raises(R.UnknownStepError, match="'tey' is not an amflow step"):
        step_command(["amflow"], "tey", config="c.yaml", run_id="r1")
    with pytest.raises(SystemExit):  # `python -m amflow.jobs run tey`: argparse refuses
        jobs_main(["run", "tey", "--run-id", "r1"])


def test_placement_requests_follow_the_registry(register, local_cfg):
    from amflow import placement

    cfg = local_cfg("ray.step_resources.toy={pool_c4: 0.5}")
    assert not any(r.step == "toy" for r in placement.requests(cfg))
    register(placed=True, shard_tasks=True)
    toys = {r.what: r.resources for r in placement.requests(cfg) if r.step == "toy"}
    assert toys == {"driver": {"pool_c4": 0.5}, "shard task": {"CPU": 1.0, "pool_c4": 0.5}}
    nodes = {"c4": {"resources": {"CPU": 16, "pool_c4": 1}}}
    assert placement.unplaceable(cfg, nodes) == []
    bad = placement.unplaceable(local_cfg("ray.step_resources.toy={pool_z9: 0.5}"), nodes)
    assert any(line.startswith("toy driver") and "pool_z9" in line for line in bad)


def test_align_has_a_placement_check():
    """The DAGs run align and configs/aws.yaml places it: a pool no node type provides is
    reported, as for every other placed step."""
    from amflow import placement
    from core.config import load_config

    nodes = placement.load_node_types(CLUSTER)
    aws = ROOT / "configs" / "aws.yaml"
    assert "align" in placement.dag_steps()
    assert placement.unplaceable(load_config(aws), nodes) == []
    cfg = load_config(aws, ["ray.step_resources.align={pool_nowhere: 0.01}"])
    bad = placement.unplaceable(cfg, nodes)
    assert len(bad) == 1 and bad[0].startswith("align driver ")  # the only step asking for it
    assert "no node type provides pool_nowhere" in bad[0]


@pytest.mark.parametrize("resources, slots", [(R.LIGHT, 1), (R.HEAVY, 4), (R.GPU, 12)])
def test_pool_slots_follow_the_resources_class(register, tmp_path, resources, slots):
    from amflow.orchestration import pools

    register(resources=resources)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train: {threads: 3, workers: 1}\n")
    assert pools.POOL_SLOTS_PER_CORE == 4
    assert pools.pool_slots("toy", cfg, []) == slots


def test_pool_slots_refuse_what_is_not_a_step(tmp_path):
    from amflow.orchestration import pools

    with pytest.raises(R.UnknownStepError, match="'graph' is not an amflow step"):
        pools.pool_slots("graph", tmp_path / "none.yaml", [])


def test_the_report_lists_a_registered_step_in_its_place(register, tmp_path):
    from amflow.steps.report import run_steps
    from core.config import StorageConfig
    from core.runs import Run
    from core.storage import Storage

    assert R.report_order() == LEGACY_REPORT_ORDER
    register(report=R.DATA)
    order = R.report_order()
    assert order[:7] == ("corpus", "select", "features", "targets", "repartition", "lm", "toy")
    run = tmp_path / "runs" / "r"
    for step in ("decode", "toy", "zzz", "corpus"):
        (run / step).mkdir(parents=True)
        (run / step / "_SUCCESS.json").write_text(json.dumps({"step": step}))
    found = run_steps(Storage(StorageConfig(root=str(tmp_path))), Run(str(tmp_path), "r"))
    assert [s["step"] for s in found] == ["corpus", "toy", "decode", "zzz"]


def test_the_cost_model_prices_a_registered_step(register, tmp_path):
    from amflow import cost
    from core.config import load_config

    assert cost.priced_steps() == ["select", "features", "targets", "repartition", "train",
                                   "evaluate"]
    register(cost=R.AUDIO)
    assert cost.priced_steps()[-1] == "toy"
    run = tmp_path / "store" / "runs" / "r"
    for step, hours, wall in (("select", 0.5, 5.0), ("toy", 0.5, 10.0)):
        (run / step).mkdir(parents=True)
        (run / step / "_SUCCESS.json").write_text(json.dumps(
            {"step": step, "wall_s": wall, "metrics": {"audio_hours": hours}}))
    measured = load_config(ROOT / "configs" / "local.yaml",
                           [f"storage.root={tmp_path / 'store'}"])
    target = load_config(ROOT / "configs" / "aws.yaml", ["ray.step_resources.toy={pool_c4: 0.01}"])
    rows = {r.step: r for r in cost.estimate(str(run), measured, target, 1000.0)}
    assert set(rows) == {"select", "toy"}
    node_h = 1000 / (0.5 / (10 * measured.ray.num_cpus) * 16) / 3600  # c4.4xlarge: 16 vCPU
    assert rows["toy"].node_hours == pytest.approx(node_h) and rows["toy"].scale == 1.0



def test_the_hand_back_asks_a_registered_steps_own_check(register, local_cfg):
    from amflow.orchestration.handback import unchanged_summary

    cfg = local_cfg()
    register(per_interval=True)
    assert unchanged_summary(cfg, "d-2024-01-01", "toy") is None  # no check declared
    register(per_interval=True, unchanged="tests.test_step_registry:toy_unchanged")
    assert unchanged_summary(cfg, "d-2024-01-01", "toy") == {
        "step": "toy", "run_id": "d-2024-01-01", "unchanged": True}
    register(unchanged="tests.test_step_registry:toy_unchanged", sets=("train.epochs=1",))
    assert unchanged_summary(cfg, "d-2024-01-01", "toy") is None  # runs under other config


def test_the_dag_operator_takes_a_registered_step_and_refuses_others(register, monkeypatch):
    pytest.importorskip("airflow")
    monkeypatch.syspath_prepend(str(ROOT / "dags"))
    import amflow_common as C

    monkeypatch.setattr(C, "DEFAULT_CONFIG", "configs/local.yaml")
    C.default_pool_slots.cache_clear()
    register(resources=R.LIGHT)
    assert C.AmflowStepOperator(task_id="toy", step="toy").pool_slots == 1
    C.default_pool_slots.cache_clear()
    register(resources=R.HEAVY)
    assert C.AmflowStepOperator(task_id="toy", step="toy").pool_slots == 4
    C.default_pool_slots.cache_clear()
    with pytest.raises(R.UnknownStepError, match="'tey' is not an amflow step"):
        C.AmflowStepOperator(task_id="tey", step="tey")


def test_a_step_declares_known_values_only():
    with pytest.raises(ValueError, match="resources='gpus'"):
        toy(resources="gpus")
    with pytest.raises(ValueError, match="report='first'"):
        toy(report="first")


def test_steps_outside_a_run_read_config_and_force_from_their_context(monkeypatch, local_cfg):
    """corpus (and import, serve) once told a Config from a StepContext by isinstance; now
    either context gives them the config and --force."""
    from types import SimpleNamespace

    from amflow.steps import corpus

    seen = []
    monkeypatch.setattr(corpus, "build_corpus", lambda cfg, out, force, use_ray:
                        seen.append((cfg.data.corpus, out, force)) or {})
    cfg = local_cfg()
    corpus.run(R.step_context("corpus", cfg, None, force=True), SimpleNamespace(out=None))
    corpus.run(R.step_context("corpus", cfg, "r1"), SimpleNamespace(out="o", force=False))
    assert seen == [(cfg.data.corpus, cfg.data.corpus, True), (cfg.data.corpus, "o", False)]


def test_asset_event_results_are_named_by_the_registry(register):
    from amflow.orchestration.operator import flat_results

    metrics = {"per_condition": {"DP1": 0.51234}}
    assert flat_results(metrics, "decode") == {"wer_DP1": 0.5123}
    assert flat_results(metrics, "toy") == {"per_condition_DP1": 0.5123}
    register(per_condition="toy_score")
    assert flat_results(metrics, "toy") == {"toy_score_DP1": 0.5123}
