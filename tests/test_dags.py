"""The DAG files: they load, every task retries, the graphs and trigger forms are as
designed; `airflow dags test` runs them end to end (fake steps always; the real steps
on a tiny corpus once the pipeline steps exist)."""
from __future__ import annotations

import importlib.util
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from core.config import load_config
from tests.airflow_env import ROOT, airflow_env, calls, fake_config
from tests.conftest import start_ray_head

DAGS = ROOT / "dags"
STUDENT_EDGES = [("select", "align"), ("align", "features"), ("features", "targets"), ("targets", "repartition"),
                 ("repartition", "train"), ("train", "evaluate"), ("evaluate", "decode"),
                 ("select", "lm"), ("lm", "decode"),
                 ("train", "sequence"), ("sequence", "evaluate_sequence"),
                 ("evaluate_sequence", "decode_sequence"), ("lm", "decode_sequence"),
                 ("lm", "pseudolabel"), ("lm", "sequence"),  # sequence decodes dev
                 # the end-to-end CTC students (params ctc, pseudolabels)
                 ("repartition", "train_ctc_baseline"), ("train_ctc_baseline", "decode_ctc_baseline"),
                 ("repartition", "train_ctc"), ("pseudolabel", "train_ctc"),
                 ("train_ctc", "decode_ctc"), ("lm", "decode_ctc_baseline"), ("lm", "decode_ctc")]
TEACHER_EDGES = [("select", "align"), ("align", "features"), ("features", "repartition"), ("repartition", "train"),
                 ("train", "evaluate"), ("repartition", "train_baseline"),
                 ("train_baseline", "evaluate_baseline"), ("evaluate", "decode"),
                 ("evaluate_baseline", "decode_baseline"), ("select", "lm"), ("lm", "decode"),
                 ("lm", "decode_baseline"),
                 ("train_baseline", "sequence_baseline"),
                 ("sequence_baseline", "evaluate_sequence_baseline"),
                 ("evaluate_sequence_baseline", "decode_sequence_baseline"),
                 ("lm", "decode_sequence_baseline"),
                 ("train", "sequence_teacher"), ("sequence_teacher", "evaluate_sequence_teacher"),
                 ("evaluate_sequence_teacher", "decode_sequence_teacher"),
                 ("lm", "decode_sequence_teacher"),
                 # sequence chooses the epoch it ships by dev WER (the LM's graph)
                 ("lm", "sequence_baseline"), ("lm", "sequence_teacher")]


@pytest.fixture(scope="module")
def dagbag(tmp_path_factory):
    import os

    home = tmp_path_factory.mktemp("airflow_home")
    os.environ.setdefault("AIRFLOW_HOME", str(home))
    if str(DAGS) not in sys.path:
        sys.path.insert(0, str(DAGS))
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


# Branch gates (one pool slot, no job): each skips its switch's steps when a param is off.
STUDENT_GATE_EDGES = [("if_sequence", "sequence"), ("if_pseudolabels", "pseudolabel"),
                      ("if_ctc", "train_ctc_baseline"), ("if_ctc_and_pseudolabels", "train_ctc")]
TEACHER_GATE_EDGES = [("if_baseline", "train_baseline"),
                      ("if_baseline_and_sequence", "sequence_baseline"),
                      ("if_sequence_teacher", "sequence_teacher")]


def _edges(dag) -> set[tuple[str, str]]:
    return {(t.task_id, d) for t in dag.tasks for d in t.downstream_task_ids}


def _steps(dag) -> list:
    from amflow_common import AmflowStepOperator

    return [t for t in dag.tasks if isinstance(t, AmflowStepOperator)]


def test_dagbag_loads_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert {"ssl_student", "teacher", "corpus"} <= set(dagbag.dags)


def test_every_task_retries(dagbag):
    for dag in dagbag.dags.values():
        for t in dag.tasks:
            assert t.retries >= 1, f"{dag.dag_id}.{t.task_id} has no retries"


def test_every_dag_stops_its_orphaned_jobs_when_a_run_ends(dagbag):
    for dag in dagbag.dags.values():
        for callback in (dag.on_success_callback, dag.on_failure_callback):
            names = [c.__name__ for c in (callback if isinstance(callback, list) else [callback])]
            assert names == ["stop_orphaned_jobs"], dag.dag_id


def test_pool_slots_give_the_teacher_both_cores_and_light_steps_room_beside(dagbag):
    """default_pool counts cores in quarters (amflow.orchestration.pools): the teacher's 2-thread
    training holds a 2-core machine alone but for light steps, so the baseline (one
    core) cannot start beside it; every task is in default_pool (a missing pool would
    hang its task silently)."""
    from core.config import load_config
    from amflow.orchestration.pools import POOL_LIGHT_SLOTS, POOL_SLOTS_PER_CORE, pool_size

    teacher = dagbag.dags["teacher"]
    slots = {t.task_id: t.pool_slots for t in teacher.tasks}
    local = ROOT / "configs" / "local.yaml"
    sets = {t: teacher.task_dict[t].sets for t in ("train", "train_baseline")}
    assert {"train.model=teacher", "train.model=student"} <= {*sets["train"],
                                                               *sets["train_baseline"]}
    assert slots["train"] == POOL_SLOTS_PER_CORE * load_config(
        local, sets["train"]).train.threads
    assert slots["train_baseline"] == POOL_SLOTS_PER_CORE * load_config(
        local, sets["train_baseline"]).train.threads
    assert slots["train"] + POOL_LIGHT_SLOTS <= pool_size(2) < slots["train"] + slots[
        "train_baseline"]
    for task in ("select", "lm", "repartition", "evaluate", "decode"):
        assert slots[task] == 1
    by_weight = sorted(teacher.tasks, key=lambda t: t.priority_weight)
    assert by_weight[-1].task_id == "train"
    # the baseline before any student step: the scheduler queues smaller tasks past one
    # that does not fit, so a lower priority starved it through the student's run (issue 60)
    def weight(t):  # Airflow's default "downstream" rule: its own and all downstream
        assert str(t.weight_rule).lower().endswith("downstream")
        return t.priority_weight + sum(d.priority_weight
                                       for d in t.get_flat_relatives(upstream=False))
    total = {t.task_id: weight(t) for t in teacher.tasks}
    student = max(weight(t) for t in dagbag.dags["ssl_student"].tasks)
    assert total["train"] > total["train_baseline"] > student
    # the CTC SSL student (the student run's longest step) first of the student's trainings
    ssl = {t.task_id: weight(t) for t in dagbag.dags["ssl_student"].tasks}
    assert ssl["train_ctc"] > max(ssl["train"], ssl["train_ctc_baseline"], total["sequence_baseline"])
    for dag in dagbag.dags.values():
        assert {t.pool for t in dag.tasks} == {"default_pool"}, dag.dag_id


def test_graphs(dagbag):
    student, teacher = dagbag.dags["ssl_student"], dagbag.dags["teacher"]
    assert _edges(student) == set(STUDENT_EDGES + STUDENT_GATE_EDGES)
    assert _edges(teacher) == set(TEACHER_EDGES + TEACHER_GATE_EDGES)
    assert {t.task_id: t.step for t in _steps(student)} == {
        "select": "select", "align": "align", "features": "features", "targets": "targets",
        "repartition": "repartition", "train": "train", "evaluate": "evaluate",
        "lm": "lm", "decode": "decode", "sequence": "sequence",
        "evaluate_sequence": "evaluate", "decode_sequence": "decode",
        "pseudolabel": "pseudolabel", "train_ctc_baseline": "train",
        "decode_ctc_baseline": "decode", "train_ctc": "train", "decode_ctc": "decode"}
    # align labels the frames only with features.labels=align, else it skips and features
    # runs anyway; the student's align labels with its teacher's tree (targets.teacher)
    for dag in (student, teacher):
        align, features = dag.task_dict["align"], dag.task_dict["features"]
        assert features.trigger_rule == "none_failed"
        assert align.skip_reason(load_config(None, ["features.labels=align"])) == ""
        assert "features.labels=ctm" in align.skip_reason(load_config(None, []))
    assert student.task_dict["align"].teacher_asset is not None
    # Student trains with the SSL recipe; the teacher on labels, in its own output dir.
    assert {"train.model=student", "train.regime=ssl"} <= set(student.task_dict["train"].sets)
    tsets = set(teacher.task_dict["train"].sets)
    assert {"train.model=teacher", "train.regime=labeled", "train.tag=teacher"} <= tsets
    bsets = set(teacher.task_dict["train_baseline"].sets)
    assert {"train.model=student", "train.regime=labeled", "train.tag=baseline"} <= bsets
    assert teacher.task_dict["evaluate_baseline"].model_from == "train_baseline"
    assert teacher.task_dict["decode_baseline"].model_from == "train_baseline"
    assert "decode.tag=baseline" in teacher.task_dict["decode_baseline"].sets
    assert "decode.tag=teacher" in tsets
    assert "select.splits=labeled,dev" in tsets
    # Sequence training starts from each model's CE run (train.tag) and is scored under
    # its own tag; the teacher's only when asked (param).
    ssets = set(teacher.task_dict["sequence_baseline"].sets)
    assert {"train.tag=baseline", "decode.tag=sequence-baseline",
            "evaluate.tag=sequence-baseline"} <= ssets
    assert teacher.task_dict["decode_sequence_baseline"].model_from == "sequence_baseline"
    assert teacher.task_dict["sequence_teacher"].enabled_by == ("sequence_teacher",)
    assert teacher.task_dict["sequence_baseline"].enabled_by == ("baseline", "sequence")
    assert "decode.tag=sequence" in student.task_dict["decode_sequence"].sets
    assert student.task_dict["decode_sequence"].model_from == "sequence"


def test_the_dags_are_the_ssl_recipes_runs(dagbag):
    """The DAGs `teacher` and `ssl_student` are the runs `teacher` and `ssl` of the recipe
    `ssl` (configs/recipes/ssl.yaml): each task is a step of the run (task id -> step, its
    sets, its upstream tasks, its param gates), none more, none fewer; the switches'
    boxes on the trigger form are the run's params with their Airflow defaults. So the
    order of the steps and their --set are written once."""
    from amflow.recipes.definition import load_recipe
    from amflow_common import gate_name

    recipe = load_recipe("ssl")
    for dag_id, run in (("teacher", "teacher"), ("ssl_student", "ssl")):
        dag = dagbag.dags[dag_id]
        defined = {t.task_id: t for t in recipe.dag_tasks(run)}
        assert {t.task_id for t in _steps(dag)} == set(defined), dag_id
        for task in _steps(dag):
            t = defined[task.task_id]
            assert (task.step, task.sets, task.enabled_by) == (
                t.step.step, list(t.sets), t.enabled_by), (dag_id, task.task_id)
            gates = {gate_name(t.enabled_by)} if t.enabled_by else set()
            assert task.upstream_task_ids == set(t.upstream) | (
                gates & task.upstream_task_ids), (dag_id, task.task_id)
            assert set(t.upstream) <= task.upstream_task_ids
        for p in recipe.run_params(run):
            assert dag.params[p.name] is p.airflow, (dag_id, p.name)
            assert dag.params.get_param(p.name).description == p.description
    # the CLI's own steps stay out of the DAGs (the corpus has a DAG of its own)
    assert "corpus" not in dagbag.dags["teacher"].task_dict
    # a set naming another run is the CLI's wiring: the DAG reads the teacher from its
    # asset / the form, and train.pseudolabels from the pseudolabel task
    for task in _steps(dagbag.dags["ssl_student"]):
        assert not [s for s in task.sets if "{" in s or s.startswith("targets.teacher=")]
    assert dagbag.dags["ssl_student"].task_dict["train_ctc"].pseudolabels_from == "pseudolabel"


def test_a_dag_decorates_only_the_recipes_tasks_and_never_their_sets(dagbag):
    """A DAG file's decorations name tasks of the recipe's run, and leave the step, its
    sets and its gates to the recipe (written once)."""
    from amflow.recipes.definition import RecipeError, load_recipe
    from amflow_common import recipe_tasks

    recipe = load_recipe("ssl")
    with pytest.raises(RecipeError, match="train_teacher"):
        recipe_tasks(recipe, "teacher", {"train_teacher": {}})
    with pytest.raises(RecipeError, match="'sets'"):
        recipe_tasks(recipe, "teacher", {"train": {"sets": ["train.epochs=1"]}})
    with pytest.raises(RecipeError, match="no run 'student'"):
        recipe_tasks(recipe, "student", {})


def _run_gate(dag, task_id: str, **params) -> list[str]:
    """Execute a branch gate as the task runner would; the task ids it skips."""
    from unittest import mock

    from airflow.sdk.exceptions import DownstreamTasksSkipped

    gate = dag.task_dict[task_id]
    context = {"params": {**dict(dag.params), **params}, "ti": mock.Mock(map_index=-1),
               "task": gate, "dag_run": mock.Mock(), "outlet_events": {}}
    kwargs = dict(gate.op_kwargs)  # execute() stores its call's kwargs there (a real try
    # runs on its own copy of the task)
    try:
        gate.execute(context)
    except DownstreamTasksSkipped as exc:
        return sorted(exc.tasks)
    finally:
        gate.op_kwargs = kwargs
    return []


def test_ctc_students_train_from_the_run_with_the_configs_recipe(dagbag):
    """train_ctc_baseline / train_ctc: train.model ctc, sized by the config (model.ctc and
    train.ctc_preset), not by the DAG; train_ctc reads this DAG run's pseudolabel step dir
    (the pseudolabel task's summary) as train.pseudolabels; each decodes under its tag."""
    from unittest import mock

    from amflow.orchestration.pools import POOL_SLOTS_PER_CORE

    student = dagbag.dags["ssl_student"]
    base, ssl = student.task_dict["train_ctc_baseline"], student.task_dict["train_ctc"]
    for task, tag in ((base, "ctc-baseline"), (ssl, "ctc")):
        assert {"train.model=ctc", f"train.tag={tag}", f"decode.tag={tag}"} <= set(task.sets)
        assert not [s for s in task.sets if s.startswith(("model.", "train.epochs"))]
        cfg = load_config(ROOT / "configs" / "local.yaml", task.sets)
        assert cfg.train.ctc_preset and cfg.train.threads == cfg.train.ctc_preset["threads"]
        assert task.pool_slots == POOL_SLOTS_PER_CORE * cfg.train.threads
    decode = student.task_dict["decode_ctc"]
    assert decode.model_from == "train_ctc" and "decode.tag=ctc" in decode.sets
    assert student.task_dict["decode_ctc_baseline"].model_from == "train_ctc_baseline"
    uri = "/data/runs/r1/pseudolabel"
    ti = mock.Mock()
    ti.xcom_pull.side_effect = lambda task_ids: {"uri": uri} if task_ids == "pseudolabel" else None
    context = {"params": dict(student.params), "ti": ti}
    assert f"train.pseudolabels={uri}" in ssl.resolved_overrides(context)
    assert not [o for o in base.resolved_overrides(context) if "pseudolabels" in o]
    ti.xcom_pull.side_effect = lambda task_ids: None
    with pytest.raises(Exception, match="pseudolabel"):
        ssl.resolved_overrides(context)


def test_disabled_branches_skip_before_taking_pool_slots(dagbag):
    """issue 31: sequence_teacher (off) waited for its 8 pool slots only to skip. A gate per
    switch (one slot, no job, no upstream: it runs as the run starts) skips the switch's
    steps while they still wait for their upstream, so they never ask the pool for slots."""
    from airflow.providers.standard.operators.python import ShortCircuitOperator

    from amflow_common import gate_name

    for dag in (dagbag.dags["teacher"], dagbag.dags["ssl_student"]):
        gates = {t.task_id: t for t in dag.tasks if isinstance(t, ShortCircuitOperator)}
        switched = [t for t in _steps(dag) if t.enabled_by]
        assert switched and {gate_name(t.enabled_by) for t in switched} == set(gates)
        for step in switched:
            upstream = {u.task_id for u in step.get_flat_relatives(upstream=True)}
            assert gate_name(step.enabled_by) in upstream, step.task_id
        for gate in gates.values():
            assert gate.pool == "default_pool" and gate.pool_slots == 1, gate.task_id
            assert not gate.upstream_task_ids and not gate.do_xcom_push
            names = set(gate.op_kwargs["names"])
            for task in gate.get_flat_relatives(upstream=False):  # what it may skip
                assert names <= set(task.enabled_by), (gate.task_id, task.task_id)
    teacher = dagbag.dags["teacher"]
    assert teacher.params["sequence_teacher"] is False
    assert teacher.task_dict["sequence_teacher"].pool_slots > 1  # what the gate spares
    seq_teacher = ["decode_sequence_teacher", "evaluate_sequence_teacher", "sequence_teacher"]
    assert _run_gate(teacher, "if_sequence_teacher") == seq_teacher
    assert _run_gate(teacher, "if_sequence_teacher", sequence_teacher=True) == []
    assert _run_gate(teacher, "if_baseline") == []
    seq_baseline = ["decode_sequence_baseline", "evaluate_sequence_baseline",
                    "sequence_baseline"]
    assert _run_gate(teacher, "if_baseline", baseline=False) == sorted(
        ["decode_baseline", "evaluate_baseline", "train_baseline", *seq_baseline])
    assert _run_gate(teacher, "if_baseline_and_sequence", sequence=False) == seq_baseline
    student = dagbag.dags["ssl_student"]
    assert _run_gate(student, "if_sequence", sequence=False) == [
        "decode_sequence", "evaluate_sequence", "sequence"]
    assert student.params["pseudolabels"] is False  # on with the end-to-end students
    assert _run_gate(student, "if_pseudolabels") == ["decode_ctc", "pseudolabel", "train_ctc"]
    assert _run_gate(student, "if_pseudolabels", pseudolabels=True) == []
    assert student.params["ctc"] is False  # the CTC students: on in make demo
    assert _run_gate(student, "if_ctc") == ["decode_ctc_baseline", "train_ctc_baseline"]
    assert _run_gate(student, "if_ctc_and_pseudolabels", ctc=True) == ["decode_ctc", "train_ctc"]
    assert _run_gate(student, "if_ctc_and_pseudolabels", ctc=True, pseudolabels=True) == []
    assert student.task_dict["pseudolabel"].teacher_asset is not None


def test_assets_wire_teacher_to_student(dagbag):
    student, teacher = dagbag.dags["ssl_student"], dagbag.dags["teacher"]
    teacher_model = teacher.task_dict["train"].outlets[0]
    assert teacher_model.uri == "x-amflow://teacher/model"
    # ssl_student is scheduled on a new teacher model and reads it in `targets`.
    assert teacher_model in student.timetable.asset_condition.objects
    assert teacher_model in student.task_dict["targets"].inlets
    outlets = {t.task_id: [a.uri for a in t.outlets] for t in student.tasks}
    assert outlets["features"] == ["x-amflow://ssl_student/features"]
    assert outlets["targets"] == ["x-amflow://ssl_student/targets"]
    assert outlets["train"] == ["x-amflow://ssl_student/model"]


def test_trigger_form_params_have_types_limits_and_local_defaults(dagbag):
    from core.config import load_config

    cfg = load_config(ROOT / "configs" / "local.yaml")
    params = dagbag.dags["ssl_student"].params
    schema = {k: params.get_param(k).schema for k in params}
    assert params["config"] == "configs/local.yaml" and schema["config"]["type"] == "string"
    # empty: the chosen config file's select.hours (a user's own config is not capped at
    # local.yaml's hours by a form sent with only its config field changed)
    assert params["hours"] is None and schema["hours"]["type"] == ["null", "number"]
    assert f"configs/local.yaml: {cfg.select.hours:g}" in params.get_param("hours").description
    # exclusive bounds: the form's number box would clamp to minimum/maximum (issue 23)
    assert schema["hours"]["exclusiveMinimum"] == 0
    assert schema["hours"]["exclusiveMaximum"] > 1_000_000
    assert "minimum" not in schema["hours"] and "maximum" not in schema["hours"]
    # empty training fields = the chosen config file's values (local.yaml's would
    # otherwise override aws.yaml's when that file is picked)
    assert params["algorithm"] is None and params["workers"] is None and params["epochs"] is None
    assert schema["algorithm"]["enum"] == [None, "sgd", "gtc", "bmuf", "htm", "ma"]
    assert "null" not in schema["algorithm"]["values_display"]["null"]  # shown as empty
    assert schema["workers"]["type"] == ["null", "integer"]
    # workers 1..1024, epochs 1..100: refused beyond, with the limit named (the form's box
    # would clamp 0 -> 1, 1000 -> 100 silently with minimum/maximum; issue 60)
    assert (schema["workers"]["exclusiveMinimum"], schema["workers"]["exclusiveMaximum"]) \
        == (0, 1025) and "1 to 1,024" in params.get_param("workers").description
    assert (schema["epochs"]["exclusiveMinimum"], schema["epochs"]["exclusiveMaximum"]) \
        == (0, 101) and "1 to 100" in params.get_param("epochs").description
    for dag in dagbag.dags.values():  # no number box of any DAG clamps
        for name in dag.params:
            s = dag.params.get_param(name).schema
            assert not {"minimum", "maximum"} & set(s), (dag.dag_id, name, s)
    assert cfg.train.algorithm in params.get_param("algorithm").description
    assert params["teacher"] == (cfg.targets.teacher or None)
    assert "string" in schema["teacher"]["type"]
    assert schema["rerun"]["enum"] == ["redo", "resume"]


def test_trigger_refuses_bad_hours_and_overrides(dagbag):
    """What the trigger (form or REST) validates before any task runs."""
    import copy

    from airflow.sdk.definitions.param import ParamValidationError

    params = dagbag.dags["ssl_student"].params

    def check(**conf):
        p = copy.deepcopy(params)
        for k, v in conf.items():
            p[k] = v
        p.validate()

    check(hours=0.5, overrides=["train.lr=0.002", "runner.env.X=1", " select.hours = 2"])
    check(overrides=None, algorithm=None)
    for bad in ({"hours": 0}, {"hours": -1}, {"hours": "abc"}, {"hours": 1e9},
                {"overrides": ["not-a-pair"]}, {"overrides": ["train.nope=1"]},
                {"overrides": ["=1"]}, {"algorithm": "adam"}):
        with pytest.raises(ParamValidationError):
            check(**bad)


def test_dag_files_import_nothing_heavy():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "import ssl_student, teacher, corpus, daily_data; "
            "print(sorted(m for m in ('torch', 'ray', 'pyarrow', 'boto3', 'numpy', 'pandas') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(DAGS)], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    # airflow itself may pull numpy-free deps; our wiring must not add the heavy ones.
    heavy = json.loads(out.stdout.strip().splitlines()[-1].replace("'", '"'))
    assert not {"torch", "ray", "pyarrow", "boto3"} & set(heavy)


# ----------------------------------------------------------------------------- dags test

def _migrate(env) -> None:
    out = subprocess.run(["airflow", "db", "migrate"], env=env, capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


def _dags_test(env, dag_id: str, conf: dict, timeout: float = 600) -> str:
    out = subprocess.run(["airflow", "dags", "test", dag_id, "-c", json.dumps(conf)], env=env,
                         capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-5000:]
    assert "state=success" in text, text[-5000:]
    return text


def _db(home: Path, sql: str, *args) -> list[tuple]:
    with sqlite3.connect(home / "airflow.db") as c:
        return c.execute(sql, args).fetchall()


def _xcoms(home: Path, dag_id: str, key: str = "return_value") -> dict[str, object]:
    rows = _db(home, "select task_id, value from xcom where dag_id=? and key=? "
                     "order by timestamp", dag_id, key)
    out = {}
    for task_id, value in rows:
        v = json.loads(value) if isinstance(value, (str, bytes)) else value
        out[task_id] = json.loads(v) if isinstance(v, str) else v
    return out


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.waits
def test_dags_test_teacher_then_student_with_fake_steps(tmp_path):
    home = tmp_path / "airflow"
    env = airflow_env(home, AMFLOW_RETRY_DELAY_S="1")
    _migrate(env)
    work = tmp_path / "work"
    # features fails once (a retry resumes it); train takes several short tries
    # (runner.wait reschedule: the mode for an Airflow without a triggerer).
    cfg = fake_config(work, plan={"features": {"seconds": 0.3, "fail_times": 1},
                                  "train": {"seconds": 6, "lines": 6}},
                      poll_s=0.5, max_wait_per_try_s=2, reschedule_s=0.5, wait="reschedule")
    _dags_test(env, "teacher", {"config": str(cfg), "hours": 0.5, "workers": 2})
    (teacher_run,) = [p.name for p in (work / "store" / "runs").iterdir()
                      if p.name.startswith("teacher__")]
    tcalls = calls(work / "store", teacher_run)
    steps = [c["step"] for c in tcalls if c["step"] != "lm"]
    assert steps[:4] == ["select", "features", "features", "repartition"]
    assert sorted(steps[4:]) == ["decode", "decode", "decode", "evaluate", "evaluate", "evaluate",
                                 "sequence", "train", "train"]
    assert [c["step"] for c in tcalls].count("lm") == 1
    tags = {tuple(a for a in c["argv"] if a.startswith("train.tag=")) for c in tcalls
            if c["step"] == "train"}
    assert tags == {("train.tag=teacher",), ("train.tag=baseline",)}
    model = work / "store" / "runs" / teacher_run / "train-teacher" / "model.pt"
    assert model.exists()
    ev = [c for c in tcalls if c["step"] == "evaluate" and "evaluate.tag=teacher" in c["argv"]][0]
    assert ev["argv"][-2:] == ["--model", str(model)]
    # the baseline's sequence training starts from its CE model; the teacher's is off
    seq = [c for c in tcalls if c["step"] == "sequence"][0]
    assert "train.tag=baseline" in seq["argv"]
    ev_seq = [c for c in tcalls if c["step"] == "evaluate"
              and "evaluate.tag=sequence-baseline" in c["argv"]][0]
    assert ev_seq["argv"][-2:] == ["--model", str(work / "store" / "runs" / teacher_run /
                                                  "sequence-baseline" / "model.pt")]
    # sequence_teacher is off: its gate skipped it before it was ever queued, so it never
    # asked default_pool for its slots (issue 31)
    tis = {t: (state, queued) for t, state, queued in _db(
        home, "select task_id, state, queued_dttm from task_instance where dag_id='teacher'")}
    assert tis["if_sequence_teacher"][0] == "success"
    for task in ("sequence_teacher", "evaluate_sequence_teacher", "decode_sequence_teacher"):
        assert tis[task] == ("skipped", None), (task, tis[task])
    xc = _xcoms(home, "teacher")
    assert set(xc) == {"select", "features", "repartition", "train", "evaluate",
                       "train_baseline", "evaluate_baseline", "lm", "decode", "decode_baseline",
                       "sequence_baseline", "evaluate_sequence_baseline",
                       "decode_sequence_baseline"}
    assert xc["train"]["uri"].endswith("train-teacher") and xc["train"]["metrics"]["workers"] == 2
    runner_x = _xcoms(home, "teacher", key="runner")
    assert runner_x["train"]["pokes"] >= 2  # short tries, one job
    # The teacher's model is an asset event whose extra names its URI.
    events = _db(home, "select a.uri, e.extra from asset_event e join asset a "
                       "on a.id = e.asset_id")
    extras = {uri: json.loads(extra) for uri, extra in events}
    assert extras["x-amflow://teacher/model"]["uri"] == str(model)
    assert extras["x-amflow://teacher/features"]["counts"]["in"] == 10
    # evaluate publishes its per-condition results as flat keys (what the UI shows)
    teacher_eval = extras["x-amflow://teacher/eval"]
    assert teacher_eval["frame_accuracy_DP1"] == 0.75 and teacher_eval["per_DP5"] == 0.45
    assert teacher_eval["frame_accuracy"] == 0.65 and "per_condition" not in teacher_eval
    assert extras["x-amflow://teacher/eval-baseline"]["frame_accuracy_DP3"] == 0.65

    # The student with no teacher param picks the latest teacher model from the asset.
    (work / "plan.json").write_text(json.dumps({"train": {"seconds": 3, "lines": 3}}))
    _dags_test(env, "ssl_student", {"config": str(cfg), "hours": 0.5, "algorithm": "bmuf"})
    (student_run,) = [p.name for p in (work / "store" / "runs").iterdir()
                      if p.name.startswith("ssl_student__")]
    scalls = calls(work / "store", student_run)
    ssteps = [c["step"] for c in scalls if c["step"] != "lm"]
    assert ssteps[:5] == ["select", "features", "targets", "repartition", "train"]
    assert sorted(ssteps[5:]) == ["decode", "decode", "evaluate", "evaluate", "sequence"]
    sx = _xcoms(home, "ssl_student")
    assert sx["targets"]["metrics"]["teacher"] == str(model)
    assert sx["train"]["metrics"]["algorithm"] == "bmuf"
    targets_argv = [c for c in scalls if c["step"] == "targets"][0]["argv"]
    assert "train.regime=ssl" in targets_argv and "train.model=student" in targets_argv
    events = _db(home, "select a.uri, e.extra from asset_event e join asset a "
                       "on a.id = e.asset_id where a.uri like 'x-amflow://ssl_student/%'")
    assert {uri for uri, _ in events} == {"x-amflow://ssl_student/features",
                                          "x-amflow://ssl_student/targets",
                                          "x-amflow://ssl_student/model",
                                          "x-amflow://ssl_student/eval",
                                          "x-amflow://ssl_student/wer",
                                          "x-amflow://ssl_student/eval-sequence",
                                          "x-amflow://ssl_student/wer-sequence"}


PIPELINE_MODULES = ["tasks.corpus", "tasks.select", "tasks.features", "tasks.targets",
                    "tasks.repartition", "training.launch", "training.evaluate"]


def _pipeline_missing() -> list[str]:
    return [m for m in PIPELINE_MODULES if importlib.util.find_spec(m) is None]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.skipif(bool(_pipeline_missing()), reason=f"pipeline steps not there yet: "
                                                      f"{_pipeline_missing()}")
def test_dags_test_real_steps_on_a_tiny_corpus(tmp_path):
    """corpus -> teacher -> ssl_student with the real `amflow` steps, tiny sizes.

    The steps join one Ray head (`ray.address`, as on a cluster): a local Ray per step
    would cost ~8 s of start and stop each, ~20 times."""
    ray_dir = tmp_path / "ray"
    ray_dir.mkdir()
    with start_ray_head(ray_dir, num_cpus=2) as (address, _, auth):
        _tiny_corpus_teacher_student(tmp_path, address, auth)


def _tiny_corpus_teacher_student(tmp_path: Path, ray_address: str, auth: dict) -> None:
    home = tmp_path / "airflow"
    env = airflow_env(home, **auth)
    _migrate(env)
    store = tmp_path / "store"
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text((ROOT / "configs" / "local.yaml").read_text())
    shutil.copytree(ROOT / "configs" / "presets", tmp_path / "presets")  # the presets it names
    common = [f"storage.root={store}", f"data.corpus={store / 'corpus'}",
              f"ray.address={ray_address}",
              f"runner.state_dir={tmp_path / 'jobs'}", "runner.poll_s=1",
              "corpus.hours=0.04", "corpus.speakers=8", "corpus.test_speakers=2",
              "select.shard_hours=0.01", "repartition.partition_hours=0.01",
              "train.minibatch_frames=256", "train.sub_epochs=1", "train.finetune_epochs=0",
              "model.student.hidden=32", "model.teacher.hidden=32", "model.student.layers=1",
              "model.teacher.layers=1", "targets.actors=1", "lm.sentences=300",
              "decode.workers=1", "decode.acwt=0.5",
              # align's recipe at a few utterances' size (as test_senones.TINY_CHAIN)
              "align.mono_iters=4", "align.tri_iters=2", "align.num_senones=250",
              "align.tri_gauss=400", "align.mono_gauss=300", "align.min_leaf_count=20"]
    _dags_test(env, "corpus", {"config": str(cfg), "overrides": common, "hours": 0.04,
                               "speakers": 8})
    # (the baseline is the same steps under another tag: the fake-steps run checks its wiring)
    _dags_test(env, "teacher", {"config": str(cfg), "overrides": common, "hours": 0.03,
                                "epochs": 1, "baseline": False, "sequence": False}, timeout=900)
    _dags_test(env, "ssl_student", {"config": str(cfg), "overrides": common, "hours": 0.03,
                                    "epochs": 1}, timeout=900)
    xc = _xcoms(home, "ssl_student")
    assert set(xc) == {"select", "align", "features", "targets", "repartition", "train", "evaluate",
                       "lm", "decode", "sequence", "evaluate_sequence", "decode_sequence"}
    assert xc["sequence"]["metrics"]["criterion"] == "smbr"
    assert xc["sequence"]["uri"].endswith("/sequence")
    for task_id, summary in xc.items():
        assert summary["run_id"].startswith("ssl_student__"), task_id
        assert (Path(summary["uri"]) / "_SUCCESS.json").exists() or task_id == "evaluate"
    assert 0 <= xc["decode"]["metrics"]["wer"] and set(xc["decode"]["metrics"]["per_condition"])
