"""`amflow run <recipe> --config FILE [--run-id R] [--from ID] [--to ID] [--jobs N]`: a
recipe, top to bottom, in this one process.

Each step is `amflow <step>` as the CLI runs it (the same arguments, the same checks,
the run's remembered settings), called in this interpreter: torch is imported once and
one Ray (local, or `ray.address`) serves every step, instead of a new process and a new
Ray per step. A step starts once its upstream steps (the recipe's `after:`, else the step
before it) are done, up to `--jobs` at once (amflow.recipes.scheduler): while this
interpreter runs one, a step that is ready too runs as its own `amflow` process (the
baseline trains beside the teacher, the baseline's decode beside the teacher's training).
Finished steps are kept (each step's own resume check); `--from`/`--to` run a slice.
The recipe's steps `only: airflow` are the DAGs' alone, and a step whose param (`when:`) is
off by default is left out, named in one line at the start (amflow.recipes.definition).
Each step's log goes to `<logs>/<step id>.log`; the terminal gets what the step reports
for people, its time, and at the end a table of every step's time.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from amflow.recipes.definition import (Recipe, RecipeError, RecipeStep, last_wins, load_recipe,
                                       substitute)
from amflow.recipes.scheduler import Scheduler
from core.config import Config
from core.runs import StepError, run_uri

SUMMARY_PREFIX = "AMFLOW_SUMMARY "


@dataclass
class StepTime:
    id: str
    wall_s: float
    step_s: float | None      # the step's own wall (its _SUCCESS.json); None: not reported
    kept: bool                 # finished before this run of the recipe
    started: float = 0.0       # time.perf_counter() when it started

    @property
    def fixed_s(self) -> float | None:
        """Start-up to first work and hand-over: the call's wall less the step's own."""
        return None if self.step_s is None or self.kept else max(self.wall_s - self.step_s, 0.0)


def run(ctx: Any, args: Any) -> dict[str, Any]:
    try:
        return _run(ctx, args)
    except RecipeError as exc:  # reported as a step's error: `amflow run: error: ...`
        raise StepError(str(exc)) from None


def _run(ctx: Any, args: Any) -> dict[str, Any]:
    cfg: Config = ctx.cfg
    full = load_recipe(args.recipe)
    recipe = full.for_cli()  # without Airflow's own steps and those whose params are off
    _check_requires(recipe, cfg)
    run_id = args.run_id or f"{recipe.name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    plan = Plan(recipe, cfg, run_id, args)
    jobs = getattr(args, "jobs", None)
    jobs = 2 if jobs is None else jobs
    if jobs < 1:
        raise RecipeError(f"--jobs {jobs}: at least 1 (1: one step after another)")
    steps = recipe.between(args.from_step, args.to_step)
    print(f"amflow run {recipe.name}: run id {run_id} ({', '.join(plan.run_ids.values())}), "
          f"config {args.config_path or 'defaults'}; {len(steps)} of {len(recipe.steps)} "
          f"steps, up to {jobs} at once; logs in {plan.logs}", flush=True)
    _say_off(full)
    if args.dry_run:
        for s in steps:
            print("$ amflow " + " ".join(plan.argv(s)))
        return {"recipe": recipe.name, "run_id": run_id, "steps": len(steps), "dry_run": True}
    t0 = time.perf_counter()
    times = plan.run_all(steps, full.upstream_for_cli(steps), jobs)
    compared = plan.compare() if recipe.compare and steps[-1] == recipe.steps[-1] else None
    _shutdown_ray()
    print(_times_table(times, [s.id for s in steps], t0, time.perf_counter() - t0), flush=True)
    return {"recipe": recipe.name, "run_id": run_id, "runs": plan.run_ids,
            "steps": len(times), "kept": sum(t.kept for t in times),
            "wall_s": round(time.perf_counter() - t0, 1),
            "step_times": {t.id: round(t.wall_s, 2) for t in times},
            "fixed_s": {t.id: round(t.fixed_s, 2) for t in times if t.fixed_s is not None},
            **({"compare": compared} if compared else {})}


def _absolute(uri: str) -> str:
    import os

    return uri if "://" in uri else os.path.abspath(uri)


def _check_requires(recipe: Recipe, cfg: Config) -> None:
    missing = [k for k in recipe.requires if not cfg.get(k)]
    if missing:
        raise RecipeError(f"recipe {recipe.name} needs {', '.join(missing)} set (in the config "
                          f"or with --set {missing[0]}=...): {recipe.description}")


def _say_off(recipe: Recipe) -> None:
    """Name the steps a param of the recipe leaves out (`when:`), and the param."""
    off = recipe.cli_off()
    if off:
        print("off by the recipe's params: " + ", ".join(
            f"{s.id} ({' and '.join(s.when)})" for s in off), flush=True)


class Plan:
    """The argument lists of a recipe's steps for one run id, and running them."""

    def __init__(self, recipe: Recipe, cfg: Config, run_id: str, args: Any):
        self.recipe, self.args = recipe, args
        self.out = sys.stdout  # the terminal: a step run here has sys.stdout redirected
        self.say_lock = threading.Lock()
        self.run_ids = {r: f"{run_id}-{r}" for r in recipe.runs}
        self.run_uris = {r: _absolute(run_uri(cfg, rid)) for r, rid in self.run_ids.items()}
        self.corpus = cfg.data.corpus
        self.storage_cfg = cfg.storage
        self.logs = Path(args.logs or Path(cfg.storage.root if "://" not in cfg.storage.root
                                           else ".") / "logs" / run_id)
        self.logs.mkdir(parents=True, exist_ok=True)

    def argv(self, s: RecipeStep) -> list[str]:
        out = [s.step]
        if self.args.config_path:
            out += ["--config", self.args.config_path]
        if s.step != "corpus":
            out += ["--run-id", self.run_ids[s.run]]
        for kv in last_wins([*substitute(s.sets, self.run_ids, self.run_uris),
                              *self.args.overrides]):
            out += ["--set", kv]
        if self.args.force:
            out.append("--force")
        return out + list(s.args)

    def say(self, text: str) -> None:
        """A line for the terminal, whichever thread says it."""
        with self.say_lock:
            print(text, file=self.out, flush=True)

    def run_all(self, steps: list[RecipeStep], upstream: dict[str, frozenset[str]],
                jobs: int) -> list[StepTime]:
        return Scheduler(steps, upstream, jobs, self._in_process, self._start_process).run()

    def _corpus_there(self) -> str:
        """Why the `corpus` step is skipped: data.corpus holds a corpus already (imported,
        or synthesised before); "" when it does not."""
        from core.storage import Storage, join

        st = Storage(self.storage_cfg)
        for mark in ("_SUCCESS.json", "metadata"):
            if st.exists(join(self.corpus, mark)):
                return f"data.corpus {self.corpus} is there ({mark})"
        return ""

    def _in_process(self, s: RecipeStep) -> StepTime:
        from amflow.cli import main

        argv = self.argv(s)
        self.say(f"\n=== {s.id}\n$ amflow {' '.join(argv)}")
        why = self._corpus_there() if s.step == "corpus" else ""
        if why:
            self.say(f"  kept: {why}")
            return StepTime(s.id, 0.0, None, True, time.perf_counter())
        t0 = time.perf_counter()
        with _step_log(self.logs / f"{s.id}.log") as out:
            rc = main(argv)
        wall = time.perf_counter() - t0
        summary = self._report(s, out.getvalue(), rc, wall)
        return _step_time(s, summary, wall, t0)

    def _start_process(self, s: RecipeStep, on_done: Any) -> None:
        """The step as its own `amflow` process, waited on by a thread that reports it and
        calls on_done(step, StepTime | None, error) when it ends."""
        argv = self.argv(s)
        self.say(f"\n=== {s.id} (its own process, beside the running steps)\n"
                 f"$ amflow {' '.join(argv)}")
        log = open(self.logs / f"{s.id}.log", "w")  # noqa: SIM115 - closed when it ends
        cmd = [sys.executable, "-m", "amflow.cli", *argv]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)

        def wait() -> None:
            out, _ = proc.communicate()
            log.close()
            wall = time.perf_counter() - t0
            try:
                summary = self._report(s, out, proc.returncode, wall, own_process=True)
            except StepError as exc:
                on_done(s, None, exc)
                return
            on_done(s, _step_time(s, summary, wall, t0), None)

        threading.Thread(target=wait, daemon=True).start()

    def _report(self, s: RecipeStep, stdout: str, rc: int, wall: float,
                own_process: bool = False) -> dict[str, Any]:
        """What the step said for people, and its time; a failure stops the recipe."""
        log = self.logs / f"{s.id}.log"
        if rc:
            tail = "".join(log.read_text().splitlines(keepends=True)[-30:]) if log.exists() else ""
            print(tail, file=sys.stderr)
            raise StepError(f"step {s.id} (amflow {s.step}) failed with exit code {rc}; its log: "
                            f"{log}. After a fix, the same command with --run-id "
                            f"{self.run_ids[s.run].rsplit('-', 1)[0]} goes on from there: "
                            "the finished steps are kept, and those that were not started "
                            "(steps run side by side) run too")
        lines = [f"  {line}" for line in stdout.splitlines()
                 if line.strip() and not line.startswith(SUMMARY_PREFIX)]
        head = [f"\n=== {s.id} (its own process) ended"] if own_process else []
        self.say("\n".join([*head, *lines, f"  ({s.id} took {wall:.1f} s)"]))
        return _summary_of(stdout) or {}

    def compare(self) -> dict[str, Any]:
        from amflow.cli import main

        argv = ["compare", *[self.run_ids[r] for r in self.recipe.compare]]
        if self.args.config_path:
            argv += ["--config", self.args.config_path]
        for kv in self.args.overrides:
            argv += ["--set", kv]
        print(f"\n=== compare\n$ amflow {' '.join(argv)}", flush=True)
        with _step_log(self.logs / "compare.log", echo=True) as out:
            rc = main(argv)
        if rc:
            raise StepError(f"amflow compare failed (rc {rc}; its log: {self.logs}/compare.log)")
        return _summary_of(out.getvalue()) or {}


@contextlib.contextmanager
def _step_log(path: Path, echo: bool = False) -> Iterator[io.StringIO]:
    """A step's stdout captured (and, with `echo`, shown) and its log records written to
    `path`; the terminal keeps warnings and errors."""
    root = logging.getLogger()
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    console = [h for h in root.handlers if isinstance(h, logging.StreamHandler)
               and not isinstance(h, logging.FileHandler)]
    levels = [h.level for h in console]
    for h in console:
        h.setLevel(max(h.level, logging.WARNING))
    root.addHandler(handler)
    out = _Tee(sys.stdout) if echo else io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            yield out
    finally:
        root.removeHandler(handler)
        handler.close()
        for h, level in zip(console, levels):
            h.setLevel(level)


class _Tee(io.StringIO):
    def __init__(self, real: Any):
        super().__init__()
        self.real = real

    def write(self, text: str) -> int:
        if not text.startswith(SUMMARY_PREFIX):
            self.real.write(text)
        return super().write(text)


def _summary_of(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(SUMMARY_PREFIX):
            return json.loads(line[len(SUMMARY_PREFIX):])
    return None


def _step_time(s: RecipeStep, summary: dict[str, Any], wall: float, t0: float) -> StepTime:
    step_s = summary.get("wall_s")
    started = summary.get("started_at")
    kept = bool(started) and _epoch(started) < time.time() - (time.perf_counter() - t0) - 1
    return StepTime(s.id, wall, float(step_s) if step_s is not None else None, kept, t0)


def _epoch(iso: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(iso).timestamp()


def _times_table(times: list[StepTime], order: list[str], t0: float, total: float) -> str:
    """Every step's start (seconds after the recipe's), wall, own wall and fixed cost, in
    the recipe's order (steps at the same time overlap in start .. start + wall)."""
    rows = ["", f"{'step':<26} {'start s':>8} {'wall s':>8} {'step s':>8} {'fixed s':>8}"]
    for t in sorted(times, key=lambda t: order.index(t.id)):
        step_s = "" if t.step_s is None else f"{t.step_s:8.1f}"
        fixed = "kept" if t.kept else ("" if t.fixed_s is None else f"{t.fixed_s:8.2f}")
        rows.append(f"{t.id:<26} {t.started - t0:8.1f} {t.wall_s:8.1f} {step_s:>8} {fixed:>8}")
    rows.append(f"{'all':<26} {'':>8} {total:8.1f}")
    return "\n".join(rows)


def _shutdown_ray() -> None:
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()
