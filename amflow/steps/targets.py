"""`amflow targets`: the teacher labels the run's features on a pool of Ray actors (or,
below `ray.inline_hours` of audio, in this process).

Resolves the teacher (targets.teacher or this run's train/model.pt) and the feature shards
through the run layout; scoring and top-k live in `tasks.targets.TargetActor`.
"""
from __future__ import annotations

import time
from typing import Any, Iterable

from core.config import TargetsConfig
from core.raycluster import runs_inline
from core.runs import StepContext, StepError
from tasks.target_plan import feature_shards, scoring_plan, teacher_uri

# torch, Ray and the actor code are imported once there is scoring to do: a re-run with
# nothing changed is handed back without them (tasks/target_plan.py).


def run(ctx: StepContext, args: Any = None) -> dict[str, Any]:
    feats_summary = ctx.require("features")
    if _empty_interval(feats_summary):
        return _finish_empty(ctx, feats_summary)
    model_uri = teacher_uri(ctx.cfg.targets, ctx.other("train"))
    if not ctx.storage.exists(model_uri):
        raise StepError(f"teacher checkpoint not found at {model_uri}: set targets.teacher "
                        "to a model.pt URI (e.g. from the teacher DAG)")
    plan = scoring_plan(ctx.cfg.targets, feats_summary, ctx.storage.digest(model_uri))
    earlier = ctx.unplanned_summary() or _finished(ctx, plan)
    if earlier is not None:  # the classes were checked when it was scored
        return earlier
    check_classes(ctx, model_uri)
    earlier = ctx.resume_plan(plan)
    if earlier is not None:
        return earlier
    from tasks.targets import print_fidelity, summarise_fidelity

    shards = feature_shards(ctx.storage, ctx.other("features"))
    done = {s: d for s in shards if (d := ctx.shard_done(s)) is not None}
    todo = [s for s in shards if s not in done]
    tc = ctx.cfg.targets
    stats = list(done.values())
    inline = runs_inline(ctx.cfg, feats_summary.get("metrics", {}).get("audio_hours"))
    score = _score_inline if inline else _score
    scored, actor_info, startup, wall = score(ctx, model_uri, todo) if todo else ([], [], 0.0, 0.0)
    stats += scored
    fid = summarise_fidelity(p for s in stats for p in s.get("fidelity", []))
    total_frames = sum(s["frames"] for s in stats)
    fresh_frames = sum(s["frames"] for s in stats if s["shard"] in todo)
    audio_hours = total_frames * 0.03 / 3600.0
    nbytes = sum(s["bytes"] for s in stats)
    print_fidelity(fid, tc.k)
    metrics = {
        "frames": total_frames, "k": tc.k, "mass": tc.mass, "codec": tc.codec,
        "actors": actor_info, "executor": "inline" if inline else "ray",
        # entries stored per frame: k, or fewer with targets.mass < 1
        "entries_per_frame": round(sum(s.get("entries", s["frames"] * tc.k) for s in stats)
                                   / total_frames, 3) if total_frames else None,
        # steady-state throughput; Ray and actor start-up (a fixed cost) is reported apart
        "frames_per_s": round(fresh_frames / wall, 1) if todo and wall > 0 else None,
        "scoring_s": round(wall, 2), "startup_s": round(startup, 2),
        "shards": len(shards), "shards_skipped": len(done),
        "bytes_per_audio_hour": round(nbytes / audio_hours) if audio_hours else None,
        "bytes_per_frame": round(nbytes / total_frames, 2) if total_frames else None,
        "fidelity": fid,
    }
    counts = {"in": sum(s["in"] for s in stats), "out": sum(s["out"] for s in stats),
              "rejected": sum(s["rejected"] for s in stats)}
    return ctx.finish(inputs={"features": feats_summary["uri"], "teacher": model_uri,
                              "teacher_digest": plan["teacher_digest"]},
                      counts=counts, metrics=metrics, bytes_written=nbytes)


def unchanged(ctx: StepContext) -> dict[str, Any] | None:
    """The finished targets when their plan (the features, the teacher's digest,
    targets.*) is unchanged: what `run` would hand back, found without writing anything
    (nor importing torch or Ray); None otherwise (an empty interval's too: `run` decides)."""
    try:
        feats_summary = ctx.require("features")
    except StepError:
        return None
    model_uri = teacher_uri(ctx.cfg.targets, ctx.other("train"))
    if _empty_interval(feats_summary) or not ctx.storage.exists(model_uri):
        return None
    plan = scoring_plan(ctx.cfg.targets, feats_summary, ctx.storage.digest(model_uri))
    return ctx.planned_summary(plan)


def _finished(ctx: StepContext, plan: dict[str, Any]) -> dict[str, Any] | None:
    """The summary of a scoring finished under this plan (`resume_plan` would hand it back
    too; asked first so that nothing else is done or imported)."""
    st, uri = ctx.storage, ctx.path("_plan.json")
    if ctx.force or not st.exists(uri):
        return None
    if st.read_json(uri) == plan and st.exists(ctx.path("_SUCCESS.json")):
        return ctx.resume_plan(plan)
    return None


def _empty_interval(features: dict[str, Any]) -> bool:
    """A daily_data interval with no audio (features has no rows)."""
    return features.get("counts", {}).get("in") == 0 and \
        not features.get("metrics", {}).get("shards")


def _finish_empty(ctx: StepContext, features: dict[str, Any]) -> dict[str, Any]:
    """Nothing to score: an empty partition, whatever the teacher (none is needed)."""
    earlier = ctx.resume_plan({"features_finished_at": features.get("finished_at"),
                               "empty": True})
    if earlier is not None:
        return earlier
    return ctx.finish(inputs={"features": features["uri"], "teacher": None,
                              "teacher_digest": None},
                      counts={"in": 0, "out": 0, "rejected": 0},
                      metrics={"frames": 0, "shards": 0, "shards_skipped": 0})


def _score(ctx: StepContext, model_uri: str, todo: list[str]
           ) -> tuple[list[dict], list[dict], float, float]:
    """Score the `todo` shards on a pool of teacher actors: (each shard's stats, each
    actor's info, the start-up seconds until the actors held the teacher, the seconds of
    scoring after that)."""
    import ray  # deferred: importing ray fixes its client settings (auth token) for the process
    from ray.util import ActorPool

    from amflow.placement import gpus_per_actor
    from core.raycluster import init_ray, step_resources
    from tasks.targets import TargetActor, TargetsJob
    from training.checkpoint import load_model

    tc = ctx.cfg.targets
    t_start = time.perf_counter()
    init_ray(ctx.cfg)
    opts: dict[str, Any] = {"num_cpus": tc.threads_per_actor, "max_restarts": 2,
                            "max_task_retries": 2}
    if gpus := gpus_per_actor(ctx.cfg, ray.cluster_resources().get("GPU", 0)):
        opts["num_gpus"] = gpus
    if res := step_resources(ctx.cfg, "targets"):
        opts["resources"] = res
    actor_cls = ray.remote(TargetActor).options(**opts)
    job = TargetsJob(ctx.cfg.storage, tc, ctx.other("features"), ctx.step_uri)
    actors = [actor_cls.remote(job, model_uri, load_model)
              for _ in range(max(1, min(tc.actors, len(todo))))]
    actor_info = ray.get([a.ready.remote() for a in actors])
    t0 = time.perf_counter()
    fid_frames = _fidelity_frames(tc, len(todo))
    stats = _with_progress(ActorPool(actors).map_unordered(
        lambda a, shard: a.score_shard.remote(shard, fid_frames), todo), len(todo))
    for a in actors:
        ray.kill(a)
    return stats, actor_info, t0 - t_start, time.perf_counter() - t0


def _fidelity_frames(tc: TargetsConfig, shards: int) -> int:
    """Each shard's share of the fidelity sample: a budget for the whole step, spread over
    the shards (the full softmax per k costs more than scoring itself)."""
    return -(-tc.fidelity_sample_frames // shards)


def _with_progress(scored: Iterable[dict[str, Any]], shards: int) -> list[dict[str, Any]]:
    """Each shard's stats as its scoring ends, with the bar and the frames per second."""
    from core.progress import Progress

    stats: list[dict[str, Any]] = []
    frames, t0 = 0, time.perf_counter()
    with Progress(shards, "targets", "shards") as bar:
        for s in scored:
            stats.append(s)
            frames += s["frames"]
            bar.update(1, frames_per_s=frames / (time.perf_counter() - t0))
    return stats


def _score_inline(ctx: StepContext, model_uri: str, todo: list[str]
                  ) -> tuple[list[dict], list[dict], float, float]:
    """`_score` for a small input: the actor's class, its teacher loaded once in this
    process (no Ray start, no actor process), scores the shards one after another."""
    from tasks.targets import TargetActor, TargetsJob
    from training.checkpoint import load_model

    tc = ctx.cfg.targets
    t_start = time.perf_counter()
    job = TargetsJob(ctx.cfg.storage, tc, ctx.other("features"), ctx.step_uri)
    teacher = TargetActor(job, model_uri, load_model)
    t0 = time.perf_counter()
    fid_frames = _fidelity_frames(tc, len(todo))
    stats = _with_progress((teacher.score_shard(shard, fid_frames) for shard in todo),
                           len(todo))
    return stats, [{**teacher.info(), "inline": True}], t0 - t_start, time.perf_counter() - t0


def check_classes(ctx: StepContext, model_uri: str) -> None:
    """The teacher's classes must be this run's labels' classes (features/phones.json): the
    student learns both from the targets and from the labeled split's labels."""
    phones_uri = ctx.other("features", "phones.json")
    if not ctx.storage.exists(phones_uri):
        return
    from training.checkpoint import load_model_card
    ours = list(ctx.storage.read_json(phones_uri))
    theirs = list(load_model_card(ctx.storage, model_uri)[1].phones)
    if theirs and ours != theirs:
        diff = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                    min(len(ours), len(theirs)))
        raise StepError(
            f"the teacher {model_uri} has {len(theirs)} classes, this run's features "
            f"{len(ours)} ({phones_uri}); they differ from class {diff}. With "
            "features.labels=align, align takes the teacher's tree (targets.teacher) when "
            "align runs with it set; with labels=ctm both need the same phones.txt")
