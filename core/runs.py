"""The run layout and the step contract.

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

import pyarrow as pa

from core.config import Config
from core.storage import Storage, join

log = logging.getLogger(__name__)

SUCCESS = "_SUCCESS.json"
REJECT_SCHEMA = pa.schema([("utt_id", pa.string()), ("shard", pa.string()),
                           ("reason", pa.string()), ("detail", pa.string())])


class StepError(RuntimeError):
    """A step cannot proceed (missing input, broken invariant); the message says why."""


class ConservationError(StepError):
    pass


@dataclass
class Reject:
    utt_id: str
    reason: str
    detail: str = ""
    shard: str = ""


def rejects_table(rejects: Iterable[Reject]) -> pa.Table:
    rows = list(rejects)
    return pa.table({
        "utt_id": [r.utt_id for r in rows],
        "shard": [r.shard for r in rows],
        "reason": [r.reason for r in rows],
        "detail": [r.detail[:2000] for r in rows],
    }, schema=REJECT_SCHEMA)


def step_dir_name(step: str, tag: str = "") -> str:
    """The folder of a tagged step under its run: `train`, or `train-<tag>` when tagged.
    The one place this name is built (runner, DAGs, steps and report all ask here)."""
    return f"{step}-{tag}" if tag else step


def shard_marker_uri(step_uri: str, shard_id: str) -> str:
    """A shard's done-marker in a step's output folder (written last, after its outputs)."""
    return join(step_uri, "_shards", f"{shard_id}.json")


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


def run_uri(cfg: Config, run_id: str) -> str:
    return join(cfg.storage.root, "runs", run_id)


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
    def run_uri(self) -> str:
        return run_uri(self.cfg, self.run_id)

    @property
    def step_uri(self) -> str:
        return join(self.run_uri, self.step)

    def path(self, *parts: str) -> str:
        return join(self.step_uri, *parts)

    def other(self, step: str, *parts: str) -> str:
        return join(self.run_uri, step, *parts)

    def require(self, step: str) -> dict[str, Any]:
        """The `_SUCCESS.json` of an earlier step of this run, or a clear error."""
        uri = self.other(step, SUCCESS)
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
        uri = self.other(step, SUCCESS)
        return self.storage.read_json(uri).get("finished_at") if self.storage.exists(uri) \
            else None

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
