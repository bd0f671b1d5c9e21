"""The run layout (`Run`) and the step contract (`StepContext`): the app's, never a library's.

    <storage.root>/runs/<run_id>/<step>/            outputs of one step
    <storage.root>/runs/<run_id>/<step>/_shards/    one JSON per finished shard (its counts)
    <storage.root>/runs/<run_id>/<step>/rejects/    one Parquet per shard: utt_id, reason, detail
    <storage.root>/runs/<run_id>/<step>/_SUCCESS.json

A shard is done when its `_shards/<id>.json` exists; it is written last, after the
shard's outputs were published, so a step killed half-way redoes exactly the shards
without a marker. Every step closes with `StepContext.finish`, which checks the
conservation law (items in = out + rejected) before writing `_SUCCESS.json`.
"""
from __future__ import annotations

import datetime as dt
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from core.config import Config
# What libraries report (errors, rejects, shard markers) lives in core.outcomes, which they
# import; the app takes them from here too, beside the layout.
from core.outcomes import (REJECT_SCHEMA, SUCCESS, ConservationError, Reject,  # noqa: F401
                           StepError, rejects_table, shard_marker_uri)
from core.storage import Storage, join

log = logging.getLogger(__name__)

RUNS = "runs"  # the folder of every run under storage.root


def step_dir_name(step: str, tag: str = "") -> str:
    """The folder of a tagged step under its run: `train`, or `train-<tag>` when tagged.
    The one place this name is built (runner, DAGs, steps and report all ask here)."""
    return f"{step}-{tag}" if tag else step


# Steps whose output folder takes another step's tag: sequence[-<train.tag>].
TAG_KEYS = {"sequence": "train.tag"}


def step_dir_of(step: str, cfg: Config) -> str:
    """The folder `amflow <step>` writes under its run with this config (its tag key's
    value: train.tag, decode.tag, ...; steps without a tag write `<step>`)."""
    key = TAG_KEYS.get(step, f"{step}.tag")
    try:
        tag = cfg.get(key)
    except AttributeError:
        tag = ""
    return step_dir_name(step, tag or "")


@dataclass(frozen=True)
class Run:
    """One run of the layout: `<root>/runs/<run_id>/`, a folder per step (tagged steps:
    `step_dir_name`), each closed by its `_SUCCESS.json` summary and holding its rejects.
    The app resolves a run's paths here and hands libraries plain URIs and values."""

    root: str
    run_id: str

    @property
    def uri(self) -> str:
        return join(runs_uri(self.root), self.run_id)

    def step(self, step: str, *parts: str) -> str:
        """The URI of step folder `step` (a step dir name: `train-baseline`), or of
        `parts` inside it."""
        return join(self.uri, step, *parts)

    def success(self, step: str) -> str:
        """The `_SUCCESS.json` of step folder `step`."""
        return self.step(step, SUCCESS)

    def rejects(self, step: str, name: str) -> str:
        """A rejects table (`name`: its file, e.g. `rejects.parquet`) of step folder `step`."""
        return self.step(step, "rejects", name)

    def summary(self, storage: Storage, step: str) -> dict[str, Any] | None:
        """The `_SUCCESS.json` of step folder `step`; None when it has not finished."""
        uri = self.success(step)
        return storage.read_json(uri) if storage.exists(uri) else None

    def finished_steps(self, storage: Storage) -> dict[str, dict[str, Any]]:
        """{step folder: its `_SUCCESS.json`} of every finished step folder of the run."""
        base, out = self.uri.rstrip("/"), {}
        if not storage.exists(base):
            return out
        for uri in storage.list(base, suffix=SUCCESS, recursive=True):
            rel = uri[len(base) + 1:]
            if rel.count("/") == 1:
                out[rel.split("/")[0]] = storage.read_json(uri)
        return out


def runs_uri(root: str) -> str:
    """The folder holding every run under `root` (storage.root)."""
    return join(root, RUNS)


def run_uri(cfg: Config, run_id: str) -> str:
    return Run(cfg.storage.root, run_id).uri


@dataclass
class StepContext:
    cfg: Config
    run_id: str
    step: str
    force: bool = False
    storage: Storage = field(init=False)
    started: float = field(init=False, default_factory=time.time)

    def __post_init__(self) -> None:
        if not self.run_id or "/" in self.run_id:
            raise StepError(f"--run-id must be a non-empty name without '/', got {self.run_id!r}")
        self.storage = Storage(self.cfg.storage)

    @property
    def run(self) -> Run:
        return Run(self.cfg.storage.root, self.run_id)

    @property
    def run_uri(self) -> str:
        return self.run.uri

    @property
    def step_uri(self) -> str:
        return self.run.step(self.step)

    def path(self, *parts: str) -> str:
        return join(self.step_uri, *parts)

    def other(self, step: str, *parts: str) -> str:
        return self.run.step(step, *parts)

    def require(self, step: str) -> dict[str, Any]:
        """The `_SUCCESS.json` of an earlier step of this run, or a clear error."""
        uri = self.run.success(step)
        if not self.storage.exists(uri):
            raise StepError(f"step '{self.step}' needs step '{step}' of run '{self.run_id}' "
                            f"to have finished first ({uri} not found): run "
                            f"`amflow {step} --run-id {self.run_id}`")
        return self.storage.read_json(uri)

    # -- resuming a step whose outputs depend on a plan (inputs + settings)
    def resume_plan(self, plan: Any, name: str = "_plan.json") -> dict[str, Any] | None:
        """The earlier summary when this step finished with the same `plan` (and no
        --force): nothing to do. Otherwise an earlier attempt's outputs and shard markers
        are kept only for the same plan; with another plan (or --force) the step's folder
        is cleared first. The plan is then written for the next attempt to compare."""
        st, plan_uri = self.storage, self.path(name)
        done = self.planned_summary(plan, name)
        if done is not None:
            log.info("%s: %s exists, nothing to do (use --force to redo)", self.step,
                     self.path(SUCCESS))
            return done
        same = st.exists(plan_uri) and st.read_json(plan_uri) == plan
        if self.force or (st.exists(plan_uri) and not same):
            if not self.force:
                log.warning("%s: inputs or settings changed since the last attempt; "
                            "starting over", self.step)
            st.delete_dir(self.step_uri)
        st.write_json(plan_uri, plan)
        return None

    def planned_summary(self, plan: Any, name: str = "_plan.json") -> dict[str, Any] | None:
        """The summary of this step when it finished under the same `plan` (and no
        --force): what `resume_plan` hands back, asked without writing anything (an Airflow
        task asks it before it starts a job: amflow.orchestration.handback)."""
        st, plan_uri = self.storage, self.path(name)
        if self.force or not st.exists(self.path(SUCCESS)) or not st.exists(plan_uri):
            return None
        return st.read_json(self.path(SUCCESS)) if st.read_json(plan_uri) == plan else None

    def unplanned_summary(self, name: str = "_plan.json") -> dict[str, Any] | None:
        """The summary of a step that finished before amflow kept the step's plan (an older
        amflow), taken as it is with a warning, so that an upgrade does not redo a run's
        finished work; --force redoes it and keeps a plan from then on. None: not such a
        step (then `resume_plan`)."""
        st = self.storage
        if self.force or st.exists(self.path(name)) or not st.exists(self.path(SUCCESS)):
            return None
        log.warning("%s: finished before amflow kept its inputs and settings (%s has no %s): "
                    "taken as it is, unchecked; use --force to redo it", self.step,
                    self.step_uri, name)
        return st.read_json(self.path(SUCCESS))

    def finished_on(self, inputs: dict[str, Any], out_uri: str) -> dict[str, Any] | None:
        """The earlier summary when this step already finished on the same `inputs` (each
        of them equal in its _SUCCESS.json) and its result is still at `out_uri`, and --force
        was not given: re-running a DAG reuses it. Inputs that differ in any way redo it.
        (For steps whose one result is a file: decode, evaluate.)"""
        st = self.storage
        if self.force or not st.exists(self.path(SUCCESS)):
            return None
        done = st.read_json(self.path(SUCCESS))
        same = all(done.get("inputs", {}).get(k) == v for k, v in inputs.items())
        if same and done.get("out") == out_uri and st.exists(out_uri):
            log.info("%s already finished on these inputs (%s); use --force to redo it",
                     self.step_uri, self.path(SUCCESS))
            return done
        return None

    def finished_at(self, step: str) -> str | None:
        """When an earlier step of this run finished (None: it has not): a later step that
        read its outputs compares it to know they are the same ones."""
        done = self.run.summary(self.storage, step)
        return done.get("finished_at") if done is not None else None

    # -- per-shard idempotency
    def shard_marker(self, shard_id: str) -> str:
        return shard_marker_uri(self.step_uri, shard_id)

    def shard_done(self, shard_id: str) -> dict[str, Any] | None:
        if self.force:
            return None
        uri = self.shard_marker(shard_id)
        return self.storage.read_json(uri) if self.storage.exists(uri) else None

    def finish(self, *, inputs: dict[str, Any], counts: dict[str, int],
               metrics: dict[str, Any], bytes_written: int = 0,
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Check in = out + rejected, then publish `_SUCCESS.json`; returns the summary."""
        n_in, n_out, n_rej = counts.get("in"), counts.get("out"), counts.get("rejected", 0)
        if n_in is None or n_out is None:
            raise StepError("finish() needs counts 'in' and 'out'")
        if n_in != n_out + n_rej:
            raise ConservationError(
                f"step '{self.step}': items in ({n_in}) != out ({n_out}) + rejected ({n_rej})")
        wall = time.time() - self.started
        summary = {
            "step": self.step,
            "run_id": self.run_id,
            "uri": self.step_uri,
            "started_at": _iso(self.started),
            "finished_at": _iso(time.time()),
            "wall_s": round(wall, 3),
            "host": socket.gethostname(),
            "inputs": inputs,
            "counts": counts,
            "bytes": bytes_written,
            "metrics": metrics,
        }
        if extra:
            summary.update(extra)
        self.storage.write_json(self.path(SUCCESS), summary)
        return summary


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).isoformat(timespec="seconds")


def sum_counts(stats: Iterable[dict[str, Any]], keys: Iterable[str]) -> dict[str, float]:
    stats = list(stats)
    return {k: sum(s.get(k, 0) for s in stats) for k in keys}


def timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0
