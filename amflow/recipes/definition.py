"""A recipe as data: its runs, each run's steps in order, and the settings of each.

    description: what the recipe makes
    requires: [targets.teacher]        # config keys the user must set (optional)
    runs:
      teacher:                         # the run <run-id>-teacher; the Airflow DAG `teacher`
        sets: [select.splits=labeled,dev]          # every step of the run
        models:                                    # named sets for the steps of one model
          teacher: [train.model=teacher, train.tag=teacher, decode.tag=teacher]
        params:                                    # switches of the run's optional steps
          baseline: {default: true, title: ..., description: ...}
          sequence: {default: false, airflow: true, title: ..., description: ...}
        steps:
          - {step: corpus, only: cli}              # amflow run's alone (Airflow: its own DAG)
          - select                                 # a step with the run's sets alone
          - {step: train, model: teacher, task: train}    # + the model's sets
          - {step: evaluate, model: teacher, only: airflow, after: [train-teacher]}
          - {step: sequence, id: sequence-baseline, model: sequence-baseline,
             when: [baseline, sequence]}
          - {step: decode, model: teacher, args: [--split, test], after: [evaluate-teacher, lm]}
    compare: [teacher, ssl]            # `amflow compare` of these runs at the end

A step's id is `<run>.<step>[-<model>]` (`teacher.train-baseline`; `id:` names it), what
`--from` and `--to` name (or, when one run has it, the part after the dot: `train-baseline`).
In a set, `{run_id:ssl}` stands for the id of the recipe's run `ssl`, `{run:teacher}` for its
folder (URI). `beside: <id of the step just before>` runs a step at the same time as that one.

Two executors read the same definitions: `amflow run` (amflow.recipes.executor: `for_cli()`)
and the Airflow DAGs (dags/: `dag_tasks(run)`, one DAG per run).
- `when: <param>` (or a list: all on) runs a step only when the run's param is on. `amflow
  run` takes each param's `default`; the DAG's trigger form offers it as a box whose
  default is `airflow` (else `default`), so `amflow run ssl` trains the CTC students that
  the DAG trains when its form says so.
- `only: cli` / `only: airflow`: a step one executor leaves out (the corpus has a DAG of its
  own; the DAGs also score frame accuracy, which `amflow run` leaves out for time).
- A step's upstream steps are its `after:` steps, else those of the step it runs `beside`,
  else the run's step before it; a run's first step without `after:` follows every step
  of the runs before it. `after:` names earlier steps: of its own run, or of an earlier run
  (`after: teacher.train-teacher`: the SSL run starts once the teacher is trained).
  Airflow takes the edges within a run (a DAG is one run; the runs are joined by assets);
  `amflow run` takes them all, and starts each step once its upstream steps are done
  (`upstream_for_cli`; several at once, `--jobs`).
- `task:` the step's Airflow task id (default: the part after the dot, `-` as `_`).
- In Airflow a set that names a run (`{run:X}`, `{run_id:X}`) is left out: a DAG run's amflow
  run id is known only when it runs, and the DAGs pass those values themselves (the teacher
  from the asset amflow_teacher_model or the form's `teacher`; train.pseudolabels from the
  pseudolabel task's result). What else is Airflow's alone (assets, priority weights, docs,
  which task's model a step reads) is in the DAG files, keyed by task id.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml


RECIPES_DIR = Path(__file__).resolve().parents[2] / "configs" / "recipes"
EXECUTORS = ("cli", "airflow")


class RecipeError(ValueError):
    """A recipe that cannot be run as written; the message names the file and the entry.
    (Not a core.runs.StepError: the DAG files read recipes when Airflow parses them, which
    must not import pyarrow; `amflow run` reports it as one.)"""


_REF = re.compile(r"\{(run_id|run):([A-Za-z0-9_-]+)\}")


@dataclass(frozen=True)
class RecipeStep:
    id: str
    run: str            # the recipe's run key (teacher, ssl)
    step: str           # the amflow step
    model: str = ""     # the run's model whose sets it adds
    sets: tuple[str, ...] = ()    # run sets + model sets + the step's own, in that order
    args: tuple[str, ...] = ()    # extra command-line arguments (--split test)
    beside: str = ""    # the id of the step it runs at the same time as (its own process)
    when: tuple[str, ...] = ()    # the run's params that must all be on
    only: str = ""      # "cli" / "airflow": the one executor that runs it ("": both)
    after: tuple[str, ...] = ()   # ids of its upstream steps in Airflow
    task: str = ""      # its Airflow task id


@dataclass(frozen=True)
class RecipeParam:
    """A switch of a run's optional steps (a step's `when:`)."""
    run: str
    name: str
    default: bool       # amflow run's
    airflow: bool       # the DAG trigger form's default
    title: str = ""
    description: str = ""


@dataclass(frozen=True)
class DagTask:
    """One task of a run's DAG, as the recipe defines it."""
    task_id: str
    step: RecipeStep
    sets: tuple[str, ...]        # the step's sets, each key once, without run references
    upstream: tuple[str, ...]    # task ids
    enabled_by: tuple[str, ...]  # the step's `when`


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    runs: tuple[str, ...]
    steps: tuple[RecipeStep, ...]
    compare: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    source: str = ""
    params: tuple[RecipeParam, ...] = ()

    def ids(self) -> list[str]:
        return [s.id for s in self.steps]

    def find(self, name: str, what: str) -> int:
        """The index of the step `name` names: its id, or the one id ending in it."""
        ids = self.ids()
        if name in ids:
            return ids.index(name)
        hits = [i for i, sid in enumerate(ids) if sid.split(".", 1)[1] == name]
        if len(hits) == 1:
            return hits[0]
        why = "names no step" if not hits else "names several steps"
        raise RecipeError(f"{what} {name!r} {why} of recipe {self.name!r} "
                          f"(its steps: {', '.join(ids)})")

    def between(self, start: str | None, stop: str | None) -> list[RecipeStep]:
        """The steps from `start` to `stop` (both included; None: the first / the last)."""
        lo = self.find(start, "--from") if start else 0
        hi = self.find(stop, "--to") if stop else len(self.steps) - 1
        if lo > hi:
            raise RecipeError(f"--from {start!r} comes after --to {stop!r} in recipe "
                              f"{self.name!r}")
        return list(self.steps[lo:hi + 1])

    def params_on(self, executor: str) -> set[tuple[str, str]]:
        """(run, param) of each param on by default for `executor`."""
        return {(p.run, p.name) for p in self.params
                if (p.airflow if executor == "airflow" else p.default)}

    def for_cli(self) -> Recipe:
        """The recipe as `amflow run` runs it: without Airflow's steps and the steps
        whose params are off by default."""
        on = self.params_on("cli")
        return replace(self, steps=tuple(
            s for s in self.steps
            if s.only != "airflow" and all((s.run, p) in on for p in s.when)))

    def cli_off(self) -> list[RecipeStep]:
        """The steps `amflow run` leaves out because a param of theirs is off."""
        on = self.params_on("cli")
        return [s for s in self.steps
                if s.only != "airflow" and not all((s.run, p) in on for p in s.when)]

    def run_params(self, run: str) -> list[RecipeParam]:
        return [p for p in self.params if p.run == run]

    def dag_tasks(self, run: str) -> list[DagTask]:
        """The Airflow DAG of run `run`: every step but `amflow run`'s alone, in order,
        each with its upstream tasks (see the module's doc)."""
        if run not in self.runs:
            raise RecipeError(f"recipe {self.name}: no run {run!r} (its runs: "
                              f"{', '.join(self.runs)})")
        steps = [s for s in self.steps if s.run == run and s.only != "cli"]
        task_of = {s.id: s.task for s in steps}
        upstream: dict[str, tuple[str, ...]] = {}
        out = []
        for i, s in enumerate(steps):
            own_run = tuple(a for a in s.after if a.split(".", 1)[0] == run)
            if own_run:
                ups = own_run
            elif s.beside:
                ups = upstream.get(s.beside, ())
            else:
                ups = (steps[i - 1].id,) if i else ()
            missing = [u for u in ups if u not in task_of]
            if missing:
                raise RecipeError(f"recipe {self.name}: step {s.id} follows {missing}, "
                                  "which Airflow does not run (only: cli)")
            upstream[s.id] = ups
            out.append(DagTask(s.task, s, airflow_sets(s.sets),
                               tuple(task_of[u] for u in ups), s.when))
        return out


    def upstream(self) -> dict[str, tuple[str, ...]]:
        """Each step's upstream step ids, every step of the recipe (the module's doc)."""
        out: dict[str, tuple[str, ...]] = {}
        last: dict[str, str] = {}
        for i, s in enumerate(self.steps):
            if s.after:
                out[s.id] = s.after
            elif s.beside:
                out[s.id] = out[s.beside]
            elif s.run in last:
                out[s.id] = (last[s.run],)
            else:
                out[s.id] = tuple(x.id for x in self.steps[:i])
            last[s.run] = s.id
        return out

    def upstream_for_cli(self, steps: list[RecipeStep]) -> dict[str, frozenset[str]]:
        """What each of `steps` (a slice of `for_cli()`'s) waits for in `amflow run`: its
        upstream steps among them. A step `amflow run` leaves out (Airflow's own, a param
        off) stands for its own upstream steps; one before the slice (--from) is done."""
        raw, wanted = self.upstream(), {s.id for s in steps}
        cli = set(self.for_cli().ids())

        def resolve(sid: str) -> set[str]:
            out: set[str] = set()
            for u in raw[sid]:
                if u in wanted:
                    out.add(u)
                elif u not in cli:
                    out |= resolve(u)
            return out

        return {s.id: frozenset(resolve(s.id)) for s in steps}


def last_wins(sets: list[str] | tuple[str, ...]) -> list[str]:
    """key=value sets with each key once, at its first place, with its last value."""
    out: dict[str, str] = {}
    for kv in sets:
        out[kv.split("=", 1)[0].strip()] = kv
    return list(out.values())


def airflow_sets(sets: tuple[str, ...]) -> tuple[str, ...]:
    """A step's sets as its DAG task passes them: each key once, without the sets that
    name a run (the DAGs wire those themselves; the module's doc)."""
    return tuple(kv for kv in last_wins(sets) if not _REF.search(kv))


def available() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml") if _is_recipe(p))


def _is_recipe(path: Path) -> bool:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return False
    return isinstance(data, dict) and "runs" in data


def load_recipe(name_or_path: str) -> Recipe:
    """A shipped recipe by name (configs/recipes/<name>.yaml) or a recipe file's path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = RECIPES_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        raise RecipeError(f"recipe {name_or_path!r} not found (shipped recipes: "
                          f"{', '.join(available())}; or give a recipe file's path)")
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("runs"), dict) or not data["runs"]:
        raise RecipeError(f"recipe {path}: needs a mapping `runs` of run names to their steps")
    return parse_recipe(path.stem, data, str(path))


def parse_recipe(name: str, data: dict[str, Any], source: str = "") -> Recipe:
    steps: list[RecipeStep] = []
    params: list[RecipeParam] = []
    for run, body in data["runs"].items():
        run_params = _run_params(name, str(run), (body or {}).get("params"))
        steps += _run_steps(name, str(run), body or {}, {p.name for p in run_params})
        params += run_params
    runs = tuple(str(r) for r in data["runs"])
    compare = tuple(data.get("compare") or ())
    for r in compare:
        if r not in runs:
            raise RecipeError(f"recipe {name}: compare names run {r!r}, not one of {runs}")
    _check_ids(name, steps)
    _check_beside(name, [s for s in steps if s.only != "airflow"])
    _check_after(name, steps)
    for s in steps:
        for kind, ref in _REF.findall(" ".join(s.sets)):
            if ref not in runs:
                raise RecipeError(f"recipe {name}: step {s.id} refers to run {ref!r} "
                                  f"({{{kind}:{ref}}}), not one of {runs}")
    return Recipe(name, str(data.get("description", "")).strip(), runs, tuple(steps), compare,
                  tuple(data.get("requires") or ()), source, tuple(params))


def _run_params(recipe: str, run: str, value: Any) -> list[RecipeParam]:
    where = f"recipe {recipe}: runs.{run}.params"
    if value is None:
        return []
    if not isinstance(value, dict):
        raise RecipeError(f"{where}: a mapping of param names to {{default: true|false, "
                          f"airflow: true|false, title, description}}, got {value!r}")
    out = []
    for pname, spec in value.items():
        spec = spec if isinstance(spec, dict) else {}
        default = spec.get("default")
        form = spec.get("airflow", default)
        if not isinstance(default, bool) or not isinstance(form, bool):
            raise RecipeError(f"{where}.{pname}: needs `default: true|false` (and optionally "
                              f"`airflow: true|false`), got {value[pname]!r}")
        unknown = set(spec) - {"default", "airflow", "title", "description"}
        if unknown:
            raise RecipeError(f"{where}.{pname}: unknown keys {sorted(unknown)}")
        out.append(RecipeParam(run, str(pname), default, form, str(spec.get("title", "")),
                               " ".join(str(spec.get("description", "")).split())))
    return out


STEP_KEYS = {"step", "id", "model", "sets", "args", "beside", "when", "only", "after", "task"}


def _run_steps(recipe: str, run: str, body: dict[str, Any], params: set[str]
               ) -> list[RecipeStep]:
    run_sets = _str_list(body.get("sets"), f"recipe {recipe}: runs.{run}.sets")
    models = {str(k): _str_list(v, f"recipe {recipe}: runs.{run}.models.{k}")
              for k, v in (body.get("models") or {}).items()}
    return [_one_step(recipe, run, entry, run_sets, models, params)
            for entry in body.get("steps") or []]


def _one_step(recipe: str, run: str, entry: Any, run_sets: tuple[str, ...],
              models: dict[str, tuple[str, ...]], params: set[str]) -> RecipeStep:
    item = {"step": entry} if isinstance(entry, str) else dict(entry)
    if "step" not in item:
        raise RecipeError(f"recipe {recipe}: a step of run {run!r} has no `step`: {entry}")
    unknown = set(item) - STEP_KEYS
    if unknown:
        raise RecipeError(f"recipe {recipe}: step {entry} of run {run!r} has unknown keys "
                          f"{sorted(unknown)} (known: {', '.join(sorted(STEP_KEYS))})")
    model = str(item.get("model", ""))
    if model and model not in models:
        raise RecipeError(f"recipe {recipe}: step {item['step']} of run {run!r} names "
                          f"model {model!r}; the run's models: {', '.join(models)}")
    step = str(item["step"])
    sid = _full_id(run, str(item.get("id") or step + (f"-{model}" if model else "")))
    own = _str_list(item.get("sets"), f"recipe {recipe}: step {sid} sets")
    when = _names(item.get("when"), f"recipe {recipe}: step {sid} when")
    off = [p for p in when if p not in params]
    if off:
        raise RecipeError(f"recipe {recipe}: step {sid} is `when: {off[0]}`, not a param of "
                          f"run {run!r} (its params: {', '.join(sorted(params)) or 'none'})")
    only = str(item.get("only") or "")
    if only and only not in EXECUTORS:
        raise RecipeError(f"recipe {recipe}: step {sid} has `only: {only}`; one of "
                          f"{', '.join(EXECUTORS)}")
    after = tuple(_full_id(run, a) for a in _names(item.get("after"),
                                                   f"recipe {recipe}: step {sid} after"))
    task = str(item.get("task") or sid.split(".", 1)[1].replace("-", "_"))
    beside = _full_id(run, str(item["beside"])) if item.get("beside") else ""
    return RecipeStep(sid, run, step, model, (*run_sets, *models.get(model, ()), *own),
                      tuple(str(a) for a in item.get("args") or ()), beside, when, only,
                      after, task)


def _full_id(run: str, sid: str) -> str:
    """A step id as written: with its run (`teacher.train`), or the run's own (`train`)."""
    return sid if "." in sid else f"{run}.{sid}"


def _names(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    value = [value] if isinstance(value, str) else value
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise RecipeError(f"{where}: a name or a list of names, got {value!r}")
    return tuple(value)


def _check_ids(name: str, steps: list[RecipeStep]) -> None:
    ids = [s.id for s in steps]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise RecipeError(f"recipe {name}: step ids {dup} appear twice (give each an `id:`)")
    tasks = [(s.run, s.task) for s in steps if s.only != "cli"]
    dup = sorted({f"{r}: {t}" for r, t in tasks if tasks.count((r, t)) > 1})
    if dup:
        raise RecipeError(f"recipe {name}: Airflow task ids {dup} appear twice (give each "
                          "a `task:`)")


def _check_beside(name: str, steps: list[RecipeStep]) -> None:
    """`beside` names the step just before among those `amflow run` runs (the pair starts
    together)."""
    for prev, s in zip(steps, steps[1:]):
        if s.beside and s.beside != prev.id:
            raise RecipeError(f"recipe {name}: step {s.id} runs beside {s.beside!r}, which "
                              f"must be the step just before it ({prev.id})")
    if steps and steps[0].beside:
        raise RecipeError(f"recipe {name}: the first step {steps[0].id} has nothing beside")


def _check_after(name: str, steps: list[RecipeStep]) -> None:
    """`after` names earlier steps (of the same run or an earlier one): the recipe's order
    is one in which every step comes after its upstream steps."""
    seen: set[str] = set()
    for s in steps:
        late = [a for a in s.after if a not in seen]
        if late:
            raise RecipeError(f"recipe {name}: step {s.id} is after {late[0]!r}, which must "
                              f"be an earlier step (of run {s.run!r} or an earlier run)")
        seen.add(s.id)


def _str_list(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and "=" in v for v in value):
        raise RecipeError(f"{where}: a list of key=value strings, got {value!r}")
    return tuple(value)


def substitute(sets: tuple[str, ...], run_ids: dict[str, str], run_uris: dict[str, str]
               ) -> list[str]:
    """The sets with `{run_id:X}` and `{run:X}` replaced by run X's id and folder."""
    def one(m: re.Match) -> str:
        return (run_ids if m.group(1) == "run_id" else run_uris)[m.group(2)]
    return [_REF.sub(one, s) for s in sets]
