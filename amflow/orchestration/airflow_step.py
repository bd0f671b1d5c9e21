"""One Airflow task try's job: its ids, its command, its rerun semantics, its budget."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.config import load_config
from amflow.jobs import (STOPPED, SUCCEEDED, TERMINAL, Emit, Outcome, RunnerError, StepRunner,
                         amflow_run_id, default_state_dir, job_id, make_backend, step_command)
from amflow.jobs.base import PROJECT_ROOT, resolve_config
from amflow.orchestration.handback import unchanged_summary
from amflow.orchestration.rerun import REDO, Attempt, Decision, decide, reused_summary
from core.runs import SUCCESS, TAG_KEYS, step_dir_name
from core.storage import Storage, join


def step_dir_for(step: str, overrides: list[str]) -> str:
    tag = ""
    for item in overrides:
        key, _, value = item.partition("=")
        if key.strip() == TAG_KEYS.get(step, f"{step}.tag"):
            tag = value.strip()
    return step_dir_name(step, tag)




def _token_lifetime_s() -> float | None:
    """The execution-API JWT lifetime ([execution_api] jwt_expiration_time), if known."""
    try:
        from airflow.sdk.configuration import conf  # task SDK (worker side)
    except ImportError:  # pragma: no cover - older layouts
        try:
            from airflow.configuration import conf
        except ImportError:
            return None
    try:
        return float(conf.getint("execution_api", "jwt_expiration_time"))
    except Exception:  # noqa: BLE001 - an unreadable setting just means "no cap"
        return None


def try_budget_s(max_wait_per_try_s: float, poll_s: float) -> float:
    """How long one Airflow try follows its job: at most half the token lifetime."""
    budget = max_wait_per_try_s
    lifetime = _token_lifetime_s()
    if lifetime:
        budget = min(budget, lifetime / 2.0)
    return max(budget, poll_s)




@dataclass
class AirflowStep:
    """What one Airflow task needs to run its step (built by the operator in dags/)."""

    step: str
    dag_id: str
    airflow_run_id: str
    task_id: str
    try_number: int
    config: str
    overrides: list[str]
    extra_args: list[str] = field(default_factory=list)
    rerun: str = REDO  # redo | resume: what a new DAG run does with a finished step
    run_id: str = ""
    emit: Emit | None = None
    redone: bool = False  # this try re-ran a step that had finished (--force)
    attempt: Attempt | None = None  # cleared / retry / backfill (None: try_number only)
    decision: Decision | None = None  # set when this try submits its job
    keyed: bool = False  # the step is keyed by its inputs: a backfill does not force it
    handed_back: bool = False  # this try handed the finished step back with no job

    def __post_init__(self) -> None:
        if self.attempt is None:
            self.attempt = Attempt(try_number=self.try_number)
        self.run_id = self.run_id or amflow_run_id(self.dag_id, self.airflow_run_id)
        self.cfg = load_config(resolve_config(self.config), self.overrides)
        r = self.cfg.runner
        self.state_dir = Path(r.state_dir or default_state_dir())
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.backend = make_backend(self.cfg, self.state_dir, self.config)
        self.runner = StepRunner(self.backend, self.state_dir, poll_s=r.poll_s, emit=self.emit)
        self.job_id = job_id(self.dag_id, self.airflow_run_id, self.task_id, self.try_number)

    def _config_for_step(self) -> str:
        """The --config a step gets: as given (relative to the project, where steps run by
        default, or to a Ray job's working dir), absolute where the step runs in the
        config's own folder (a user's YAML outside the checkout: step_workdir)."""
        if self._steps_run_here() and self.backend.cwd != str(PROJECT_ROOT):
            return str(resolve_config(self.config))
        return self.config

    def _steps_run_here(self) -> bool:
        return self.backend.mode in ("local", "container")  # steps see this machine's disk

    def _where_steps_run(self, path: str) -> str:
        if "://" not in path and not os.path.isabs(path) and self._steps_run_here():
            return os.path.join(self.backend.cwd, path)  # relative paths resolve where steps run
        return path

    def success_uri(self) -> str:
        """The step's `_SUCCESS.json`: under its run, or the corpus's own (`amflow corpus`
        writes data.corpus, or --out, with no run)."""
        if self.step == "corpus":
            args = list(self.extra_args)
            out = args[args.index("--out") + 1] if "--out" in args[:-1] else self.cfg.data.corpus
            return join(self._where_steps_run(out), SUCCESS)
        return join(self._where_steps_run(self.cfg.storage.root), "runs", self.run_id,
                    step_dir_for(self.step, self.overrides), SUCCESS)

    def _already_finished(self) -> bool:
        """Whether the step published `_SUCCESS.json` before."""
        uri = self.success_uri()
        try:
            return Storage(self.cfg.storage).exists(uri)
        except Exception:  # noqa: BLE001 - unreadable storage: let the step decide
            return False

    def _finished_by_earlier_try(self) -> bool:
        """Whether the job of an earlier try since the task was last cleared succeeded."""
        for n in self.attempt.earlier_tries():
            jid = job_id(self.dag_id, self.airflow_run_id, self.task_id, n)
            try:
                if self.backend.exists(jid) and self.backend.status(jid) == SUCCEEDED:
                    return True
            except RunnerError:
                continue
        return False

    def decide(self) -> Decision:
        """Redo or keep the step (amflow.orchestration.rerun.decide)."""
        finished = self._already_finished()
        return decide(self.rerun, self.attempt, finished,
                      finished and self.attempt.retry and self._finished_by_earlier_try(),
                      keyed=self.keyed)

    def reused(self, summary: dict[str, Any]) -> bool:
        """Whether the job returned the summary of an earlier execution of the step."""
        if self.handed_back:
            return True
        try:
            submitted = self.backend.submitted_at(self.job_id)
        except RunnerError:
            submitted = None
        return reused_summary(summary, submitted)

    def _adopt_running_previous_try(self) -> str | None:
        """A job of an earlier try of this task that still runs (its task died without
        stopping it): follow that one rather than start a duplicate."""
        for n in range(self.try_number - 1, 0, -1):
            jid = job_id(self.dag_id, self.airflow_run_id, self.task_id, n)
            try:
                if self.backend.exists(jid) and self.backend.status(jid) not in TERMINAL:
                    return jid
            except RunnerError:
                continue
        return None

    def hand_back(self) -> Outcome | None:
        """A keyed step that this try would not force and whose inputs are unchanged: its
        finished summary, with no job started (amflow.orchestration.handback). None: start
        or follow its job (as well when a job of this task already exists, or the storage
        root is relative to where the steps run)."""
        root = self.cfg.storage.root
        if not self.keyed or self._where_steps_run(root) != root or \
                self.backend.exists(self.job_id) or self._adopt_running_previous_try():
            return None
        decision = self.decide()
        if decision.force:
            return None
        summary = unchanged_summary(self.cfg, self.run_id, self.step)
        if summary is None:
            return None
        self.decision, self.handed_back = decision, True
        self.runner.emit(f"[amflow-runner] step {self.step} of run {self.run_id}, try "
                         f"{self.try_number}: {decision.reason}; its inputs are unchanged: "
                         f"handed back, no job started")
        return Outcome(self.job_id, SUCCEEDED, submitted=False, summary=summary, pokes=0)

    def start(self) -> bool:
        """Submit this try's job once, or attach to it (or to a still running job of an
        earlier try). Returns whether this call started it."""
        r = self.cfg.runner
        jid = self.job_id
        exists = self.backend.exists(jid)  # one round trip to the job API per question
        if not exists:
            previous = self._adopt_running_previous_try()
            if previous:
                self.runner.emit(f"[amflow-runner] try {self.try_number}: job {previous} of an "
                                 f"earlier try is still running; following it")
                self.job_id = jid = previous
                exists = True
        if exists:
            self.runner.emit(f"[amflow-runner] following job {jid} "
                             f"(status {self.backend.status(jid)})")
            return False
        self.decision = self.decide()
        self.redone = self.decision.force
        self.runner.emit(f"[amflow-runner] step {self.step} of run {self.run_id}, try "
                         f"{self.try_number}: {self.decision.reason}")
        argv = step_command(r.command, self.step, config=self._config_for_step(),
                            run_id=self.run_id if self.step != "corpus" else None,
                            overrides=self.overrides, extra_args=self.extra_args,
                            force=self.redone)
        resources = dict(self.cfg.ray.step_resources.get(self.step, {}))
        return self.runner.submit(jid, argv, resources)

    def poke(self) -> Outcome:
        """Submit (once) and follow for one try's budget."""
        r = self.cfg.runner
        budget = try_budget_s(r.max_wait_per_try_s, r.poll_s)
        started = self.start()
        jid = self.job_id
        outcome = self.runner.follow(jid, budget, prefix="")
        outcome.submitted = started
        if not outcome.done and r.step_timeout_s > 0:
            t0 = self.backend.submitted_at(jid)
            if t0 is not None and time.time() - t0 > r.step_timeout_s:
                self.runner.emit(f"[amflow-runner] step {self.step} exceeded runner.step_timeout_s="
                                 f"{r.step_timeout_s:g}; stopping job {jid}")
                self.runner.stop(jid)
                outcome.status = STOPPED
        return outcome

    def done(self) -> bool:
        return self.backend.status(self.job_id) in TERMINAL

    def drain(self) -> Outcome:
        """The ended job's output not yet in the task log, and its outcome."""
        return self.runner.follow(self.job_id, 0.0, prefix="")

    def trigger_kwargs(self) -> dict[str, Any]:
        """What the triggerer needs to wait for this job (see amflow.orchestration.trigger)."""
        r = self.cfg.runner
        return {"job_id": self.job_id, "config": str(resolve_config(self.config)),
                "overrides": list(self.overrides), "state_dir": str(self.state_dir),
                "poll_s": float(r.poll_s), "step_timeout_s": float(r.step_timeout_s)}

    def kill(self) -> None:
        for n in range(self.try_number, 0, -1):
            jid = job_id(self.dag_id, self.airflow_run_id, self.task_id, n)
            try:
                if self.backend.exists(jid) and self.backend.status(jid) not in TERMINAL:
                    self.runner.stop(jid)
            except RunnerError:
                continue
