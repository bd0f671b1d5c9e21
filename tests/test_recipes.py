"""Recipes as data (amflow.recipes): the shipped recipes parse, run the DAGs' steps with
the DAGs' settings, slice with --from/--to, and a bad recipe is refused naming its entry."""
from __future__ import annotations

import pytest

from amflow.recipes.definition import RecipeError, available, load_recipe, parse_recipe
from tests.conftest import ROOT


def test_the_shipped_recipes():
    assert {"supervised", "ssl", "ssl-from-teacher"} <= set(available())
    ssl = load_recipe("ssl")
    assert ssl.runs == ("teacher", "ssl") and ssl.compare == ("teacher", "ssl")
    assert ssl.for_cli().ids()[:2] == ["teacher.corpus", "teacher.select"]
    assert ssl.for_cli().ids()[-1] == "ssl.decode-ctc"
    assert load_recipe("ssl-from-teacher").requires == ("targets.teacher",)


def _sets(recipe, sid):
    step = recipe.steps[recipe.find(sid, "--from")]
    out = {}
    for kv in step.sets:
        key, value = kv.split("=", 1)
        out[key] = value
    return out


# What `amflow run ssl` runs: the recipe without Airflow's own steps (frame accuracy, the
# CTC baseline) and the sequence training, whose params are off for the CLI.
SSL_CLI = ["teacher.corpus", "teacher.select", "teacher.align", "teacher.features",
           "teacher.repartition", "teacher.train-teacher", "teacher.train-baseline",
           "teacher.lm", "teacher.decode-teacher", "teacher.decode-baseline",
           "ssl.select", "ssl.align", "ssl.features", "ssl.lm", "ssl.targets",
           "ssl.pseudolabel", "ssl.repartition", "ssl.train", "ssl.train-ctc", "ssl.decode",
           "ssl.decode-ctc"]


def test_the_ssl_recipe_gives_each_step_its_models_settings():
    """The teacher's, the baseline's and the CTC student's sets (the DAGs' tasks take the
    same: tests/test_dags.py checks them against the recipe)."""
    ssl = load_recipe("ssl")
    assert ssl.for_cli().ids() == SSL_CLI
    teacher = {"select.splits": "labeled,dev", "train.model": "teacher",
               "train.regime": "labeled", "train.tag": "teacher", "decode.tag": "teacher"}
    assert _sets(ssl, "train-teacher") == teacher
    assert _sets(ssl, "decode-baseline") == {**teacher, "train.model": "student",
                                             "train.tag": "baseline", "decode.tag": "baseline"}
    assert _sets(ssl, "evaluate-teacher") == {**teacher, "evaluate.tag": "teacher"}
    ctc = _sets(ssl, "train-ctc")
    assert {k: ctc[k] for k in ("train.model", "train.regime", "train.tag", "decode.tag")} == {
        "train.model": "ctc", "train.regime": "labeled", "train.tag": "ctc",
        "decode.tag": "ctc"}
    assert ctc["train.pseudolabels"] == "{run_id:ssl}"
    seq = _sets(ssl, "teacher.sequence-baseline")  # from the baseline's CE model
    assert (seq["train.tag"], seq["decode.tag"], seq["evaluate.tag"]) == (
        "baseline", "sequence-baseline", "sequence-baseline")


def test_params_gate_steps_in_both_executors():
    """`when:` params: amflow run takes their `default`, the DAG's form `airflow`; `only:`
    keeps a step to one executor; `after:` gives the DAG's upstream tasks."""
    ssl = load_recipe("ssl")
    on = {(p.run, p.name): (p.default, p.airflow) for p in ssl.params}
    assert on[("ssl", "ctc")] == (True, False) and on[("ssl", "sequence")] == (False, True)
    assert on[("teacher", "baseline")] == (True, True)
    assert [s.id for s in ssl.cli_off()] == [
        "teacher.sequence-baseline", "teacher.sequence-teacher",
        "teacher.decode-sequence-baseline", "teacher.decode-sequence-teacher",
        "ssl.sequence", "ssl.decode-sequence"]
    data = {"runs": {"a": {
        "params": {"x": {"default": True, "airflow": False}, "y": {"default": False}},
        "steps": [{"step": "corpus", "only": "cli"}, "select",
                  {"step": "lm", "when": "x"}, {"step": "align", "when": ["x", "y"]},
                  {"step": "evaluate", "only": "airflow", "after": "select"},
                  {"step": "decode", "after": ["lm", "a.evaluate"], "task": "score"}]}}}
    recipe = parse_recipe("mine", data)
    assert recipe.for_cli().ids() == ["a.corpus", "a.select", "a.lm", "a.decode"]
    dag = {t.task_id: (t.upstream, t.enabled_by) for t in recipe.dag_tasks("a")}
    assert dag == {"select": ((), ()), "lm": (("select",), ("x",)),
                   "align": (("lm",), ("x", "y")), "evaluate": (("select",), ()),
                   "score": (("lm", "evaluate"), ())}
    assert [p.airflow for p in recipe.run_params("a")] == [False, False]


def test_dry_run_says_which_steps_a_param_leaves_out(tmp_path, capsys):
    from amflow.cli import main

    assert main(["run", "ssl", "--config", str(ROOT / "configs" / "tiny.yaml"),
                 "--dry-run", "--set", f"storage.root={tmp_path}",
                 "--logs", str(tmp_path / "logs")]) == 0
    out = capsys.readouterr().out
    assert "off by the recipe's params: teacher.sequence-baseline (baseline and sequence)" in out
    assert "evaluate" not in out  # Airflow's own steps are not mentioned


def test_from_and_to_slice_the_recipe():
    ssl = load_recipe("ssl").for_cli()
    part = ssl.between("ssl.train", "decode-ctc")
    assert [s.id for s in part] == ["ssl.train", "ssl.train-ctc", "ssl.decode", "ssl.decode-ctc"]
    with pytest.raises(RecipeError, match="names several steps"):
        ssl.between("select", None)  # both runs have one
    with pytest.raises(RecipeError, match="names no step"):
        ssl.between("nope", None)
    with pytest.raises(RecipeError, match="comes after"):
        ssl.between("ssl.decode", "ssl.train")


@pytest.mark.parametrize("data, match", [
    ({"runs": {"a": {"steps": [{"step": "train", "model": "x"}]}}}, "names model 'x'"),
    ({"runs": {"a": {"steps": ["select", {"step": "lm", "beside": "a.train"}]}}},
     "must be the step just before"),
    ({"runs": {"a": {"steps": ["select"]}}, "compare": ["b"]}, "compare names run 'b'"),
    ({"runs": {"a": {"sets": ["select.hours"], "steps": ["select"]}}}, "key=value"),
    ({"runs": {"a": {"steps": ["select", "select"]}}}, "appear twice"),
    ({"runs": {"a": {"sets": ["x={run:b}"], "steps": ["select"]}}}, "refers to run 'b'"),
    ({"runs": {"a": {"steps": [{"step": "lm", "when": "x"}]}}}, "not a param of run 'a'"),
    ({"runs": {"a": {"params": {"x": {"default": "yes"}}, "steps": ["lm"]}}},
     "default: true|false"),
    ({"runs": {"a": {"steps": [{"step": "lm", "only": "ray"}]}}}, "only: ray"),
    ({"runs": {"a": {"steps": [{"step": "lm", "after": "select"}, "select"]}}},
     "must be an earlier step"),
    ({"runs": {"a": {"steps": [{"step": "lm", "whne": "x"}]}}}, "unknown keys"),
    ({"runs": {"a": {"steps": ["select", {"step": "lm", "task": "select"}]}}},
     "task ids .* appear twice"),
])
def test_a_bad_recipe_is_refused_naming_its_entry(data, match):
    with pytest.raises(RecipeError, match=match):
        parse_recipe("bad", data)


def test_a_missing_recipe_names_the_shipped_ones():
    with pytest.raises(RecipeError, match="ssl-from-teacher"):
        load_recipe("no-such-recipe")


def test_dry_run_prints_every_command_once_with_the_runs_ids(tmp_path, capsys):
    from amflow.cli import main

    store = tmp_path / "store"
    assert main(["run", "ssl", "--config", str(ROOT / "configs" / "tiny.yaml"),
                 "--run-id", "qs", "--dry-run", "--set", f"storage.root={store}",
                 "--logs", str(tmp_path / "logs")]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("$ amflow ")]
    assert len(lines) == len(load_recipe("ssl").for_cli().steps)
    assert "--run-id qs-teacher" in lines[1] and "--run-id qs-ssl" in lines[-1]
    assert f"targets.teacher={store}/runs/qs-teacher/train-teacher/model.pt" in lines[-2]
    assert "train.pseudolabels=qs-ssl" in lines[-1]
    for line in lines:  # each key once: the step's value wins over the run's
        keys = [w.split("=")[0] for w in line.split("--set ")[1:]]
        assert len(keys) == len(set(keys)), line
    assert not store.exists()  # a dry run writes nothing


def test_a_recipe_that_needs_a_key_says_so(tmp_path, capsys):
    from amflow.cli import main

    rc = main(["run", "ssl-from-teacher", "--config", str(ROOT / "configs" / "tiny.yaml"),
               "--dry-run", "--set", f"storage.root={tmp_path}"])
    assert rc != 0
    assert "targets.teacher" in capsys.readouterr().err


def test_amflow_run_waits_for_each_steps_upstream_steps_only():
    """The edges `amflow run` follows: `after:` (across runs too), else the step it runs
    beside's, else the one before it; a step it leaves out stands for its own upstream."""
    ssl = load_recipe("ssl")
    steps = list(ssl.for_cli().steps)
    up = ssl.upstream_for_cli(steps)
    assert up["teacher.corpus"] == frozenset()
    assert up["teacher.lm"] == {"teacher.select"}  # beside the alignment and the training
    assert up["teacher.train-baseline"] == up["teacher.train-teacher"] == {"teacher.repartition"}
    # evaluate-teacher is Airflow's alone: the decode waits for what it waits for
    assert up["teacher.decode-teacher"] == {"teacher.train-teacher", "teacher.lm"}
    assert up["teacher.decode-baseline"] == {"teacher.train-baseline", "teacher.lm"}
    # the SSL run's selection and LM beside the teacher's training; what reads the
    # teacher after it, not after the teacher's decodes
    assert up["ssl.select"] == {"teacher.corpus"}
    assert up["ssl.align"] == {"ssl.select", "teacher.train-teacher"}  # the teacher's tree
    assert up["ssl.pseudolabel"] == {"ssl.lm", "teacher.train-teacher"}
    assert up["ssl.train-ctc"] == {"ssl.pseudolabel", "ssl.repartition"}
    # --from: what comes before the slice is done
    part = ssl.for_cli().between("ssl.train", None)
    assert ssl.upstream_for_cli(part)["ssl.train"] == frozenset()
    # a run's first step without `after:` follows the runs before it; Airflow keeps the
    # edges within a run only
    two = parse_recipe("two", {"runs": {"a": {"steps": ["select", "align"]},
                                        "b": {"steps": ["select", {"step": "lm",
                                                                   "after": ["a.select"]}]}}})
    up2 = two.upstream_for_cli(list(two.for_cli().steps))
    assert up2["b.select"] == {"a.select", "a.align"} and up2["b.lm"] == {"a.select"}
    assert [t.upstream for t in two.dag_tasks("b")] == [(), ("select",)]


class _Step:
    def __init__(self, sid):
        self.id = sid


def test_the_scheduler_runs_ready_steps_at_once_up_to_jobs_and_in_order_otherwise():
    """Steps start when their upstream steps end, at most `jobs` at a time, one on the
    calling thread; with jobs 1, in the recipe's order."""
    import threading
    import time

    from amflow.recipes.scheduler import Scheduler

    ids = ["a", "b", "c", "d", "e"]
    upstream = {"a": frozenset(), "b": frozenset("a"), "c": frozenset("a"),
                "d": frozenset("b"), "e": frozenset({"c", "d"})}
    length = {"a": 0.05, "b": 0.3, "c": 0.05, "d": 0.05, "e": 0.05}

    def run(jobs):
        log, lock = [], threading.Lock()
        live = {"now": 0, "most": 0}

        def work(step, where):
            with lock:
                assert upstream[step.id] <= {sid for sid, kind, _ in log if kind == "end"}
                live["now"] += 1
                live["most"] = max(live["most"], live["now"])
                log.append((step.id, "start", where))
            time.sleep(length[step.id])
            with lock:
                live["now"] -= 1
                log.append((step.id, "end", where))
            return step.id

        def start_process(step, on_done):
            threading.Thread(target=lambda: on_done(step, work(step, "process"), None)).start()

        done = Scheduler([_Step(i) for i in ids], upstream, jobs,
                         lambda s: work(s, "here"), start_process).run()
        assert sorted(done) == ids
        return log, live["most"]

    log, most = run(jobs=2)
    assert most == 2
    # c is ready with b (both after a): it runs in its own process while b runs here,
    # and does not wait for b's end
    assert ("b", "start", "here") in log and ("c", "start", "process") in log
    assert log.index(("c", "end", "process")) < log.index(("b", "end", "here"))
    log, most = run(jobs=1)
    assert most == 1 and [sid for sid, kind, _ in log if kind == "start"] == ids
    assert {where for _, _, where in log} == {"here"}


def test_a_failed_step_stops_new_starts_and_is_raised_after_the_running_ones_end():
    import threading
    import time

    from amflow.recipes.scheduler import Scheduler

    upstream = {"a": frozenset(), "b": frozenset(), "c": frozenset("a")}
    ended = []

    def here(step):
        time.sleep(0.05)
        raise RuntimeError(f"{step.id} failed")

    def start_process(step, on_done):
        def go():
            time.sleep(0.2)
            ended.append(step.id)
            on_done(step, step.id, None)
        threading.Thread(target=go).start()

    with pytest.raises(RuntimeError, match="a failed"):
        Scheduler([_Step(i) for i in "abc"], upstream, 2, here, start_process).run()
    assert ended == ["b"]  # b finished; c (after a) never started


def test_the_step_more_steps_wait_on_goes_first():
    """The teacher's training before the baseline's, the SSL run's select before the
    teacher's decode: among ready steps, the one with the most steps after it."""
    from amflow.recipes.scheduler import Scheduler

    order = []
    upstream = {"decode": frozenset(), "select": frozenset(), "train": frozenset({"select"})}
    Scheduler([_Step(i) for i in upstream], upstream, 1, lambda s: order.append(s.id),
              lambda s, done: None).run()
    assert order == ["select", "decode", "train"]
