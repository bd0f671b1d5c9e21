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
    assert ssl.ids()[:2] == ["teacher.corpus", "teacher.select"]
    assert ssl.ids()[-1] == "ssl.decode-ctc"
    assert load_recipe("ssl-from-teacher").requires == ("targets.teacher",)


def _sets(recipe, sid):
    step = recipe.steps[recipe.find(sid, "--from")]
    out = {}
    for kv in step.sets:
        key, value = kv.split("=", 1)
        out[key] = value
    return out


def test_the_ssl_recipe_gives_each_step_the_dags_settings():
    """The same settings the DAGs give their tasks (dags/teacher.py, dags/ssl_student.py)."""
    import importlib
    import sys

    sys.path.insert(0, str(ROOT / "dags"))
    try:
        common = importlib.import_module("amflow_common")  # noqa: F841 - DAG helpers load
        teacher = importlib.import_module("teacher")
        student = importlib.import_module("ssl_student")
    except ImportError as exc:  # pragma: no cover - Airflow is part of the test extras
        pytest.skip(f"the DAGs need Airflow: {exc}")
    finally:
        sys.path.remove(str(ROOT / "dags"))

    def as_dict(sets):
        return dict(kv.split("=", 1) for kv in sets if not kv.startswith("evaluate."))

    ssl = load_recipe("ssl")
    assert _sets(ssl, "train-teacher") == as_dict(teacher.TEACHER_SETS)
    assert _sets(ssl, "decode-baseline") == as_dict(teacher.BASELINE_SETS)
    ctc = _sets(ssl, "train-ctc")
    assert {k: v for k, v in ctc.items() if k in as_dict(student.CTC_SETS)} == \
        as_dict(student.CTC_SETS)
    assert ctc["train.pseudolabels"] == "{run_id:ssl}"


def test_from_and_to_slice_the_recipe():
    ssl = load_recipe("ssl")
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
    assert len(lines) == len(load_recipe("ssl").steps)
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
