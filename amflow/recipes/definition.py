"""A recipe as data: its runs, each run's steps in order, and the settings of each.

    description: what the recipe makes
    requires: [targets.teacher]        # config keys the user must set (optional)
    runs:
      teacher:                         # the run <run-id>-teacher
        sets: [select.splits=labeled,dev]          # every step of the run
        models:                                    # named sets for the steps of one model
          teacher: [train.model=teacher, train.tag=teacher, decode.tag=teacher]
        steps:
          - corpus                                 # a step with the run's sets alone
          - {step: train, model: teacher}          # + the model's sets
          - {step: decode, model: teacher, args: [--split, test]}
    compare: [teacher, ssl]            # `amflow compare` of these runs at the end

A step's id is `<run>.<step>[-<model>]` (`teacher.train-baseline`), what `--from` and
`--to` name (or, when one run has it, the part after the dot: `train-baseline`). In a set, `{run_id:ssl}`
stands for the id of the recipe's run `ssl`, `{run:teacher}` for its folder (URI).
`beside: <id of the step just before>` runs a step at the same time as that one.
The executor (amflow.recipes.executor) and the Airflow DAGs read the same definitions.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from core.runs import StepError


RECIPES_DIR = Path(__file__).resolve().parents[2] / "configs" / "recipes"


class RecipeError(StepError):
    """A recipe that cannot be run as written; the message names the file and the entry."""


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


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    runs: tuple[str, ...]
    steps: tuple[RecipeStep, ...]
    compare: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    source: str = ""

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
    for run, body in data["runs"].items():
        steps += _run_steps(name, str(run), body or {})
    runs = tuple(str(r) for r in data["runs"])
    compare = tuple(data.get("compare") or ())
    for r in compare:
        if r not in runs:
            raise RecipeError(f"recipe {name}: compare names run {r!r}, not one of {runs}")
    _check_beside(name, steps)
    ids = [s.id for s in steps]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise RecipeError(f"recipe {name}: step ids {dup} appear twice (give each an `id:`)")
    for s in steps:
        for kind, ref in _REF.findall(" ".join(s.sets)):
            if ref not in runs:
                raise RecipeError(f"recipe {name}: step {s.id} refers to run {ref!r} "
                                  f"({{{kind}:{ref}}}), not one of {runs}")
    return Recipe(name, str(data.get("description", "")).strip(), runs, tuple(steps), compare,
                  tuple(data.get("requires") or ()), source)


def _run_steps(recipe: str, run: str, body: dict[str, Any]) -> list[RecipeStep]:
    run_sets = _str_list(body.get("sets"), f"recipe {recipe}: runs.{run}.sets")
    models = {str(k): _str_list(v, f"recipe {recipe}: runs.{run}.models.{k}")
              for k, v in (body.get("models") or {}).items()}
    out = []
    for entry in body.get("steps") or []:
        item = {"step": entry} if isinstance(entry, str) else dict(entry)
        if "step" not in item:
            raise RecipeError(f"recipe {recipe}: a step of run {run!r} has no `step`: {entry}")
        model = str(item.get("model", ""))
        if model and model not in models:
            raise RecipeError(f"recipe {recipe}: step {item['step']} of run {run!r} names "
                              f"model {model!r}; the run's models: {', '.join(models)}")
        step = str(item["step"])
        sid = item.get("id") or f"{run}.{step}" + (f"-{model}" if model else "")
        own = _str_list(item.get("sets"), f"recipe {recipe}: step {sid} sets")
        out.append(RecipeStep(str(sid), run, step, model,
                              (*run_sets, *models.get(model, ()), *own),
                              tuple(str(a) for a in item.get("args") or ()),
                              str(item.get("beside", ""))))
    return out


def _check_beside(name: str, steps: list[RecipeStep]) -> None:
    """`beside` names the step just before (the pair starts together)."""
    for prev, s in zip(steps, steps[1:]):
        if s.beside and s.beside != prev.id:
            raise RecipeError(f"recipe {name}: step {s.id} runs beside {s.beside!r}, which "
                              f"must be the step just before it ({prev.id})")
    if steps and steps[0].beside:
        raise RecipeError(f"recipe {name}: the first step {steps[0].id} has nothing beside")


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
