"""`amflow pseudolabel`: the teacher's words for the run's unlabeled selection, each with a
confidence and its acoustic / LM scores, and the confident ones kept: the transcripts an
end-to-end student learns from (noisy-student pseudo-labelling).

    amflow pseudolabel --run-id R [--model TEACHER]

Reads   --model, else targets.teacher, else runs/<R>/train/model.pt (the teacher); the
        decoder `amflow decode` assembles (decoding/assets.py: lexicon, LM, graph cache
        runs/<R>/graph/, priors; decode.* search keys); runs/<R>/select shards of
        pseudolabel.split; the transcripts of pseudolabel.dev_split of data.corpus
Writes  runs/<R>/pseudolabel/labels/<shard>.parquet   utt_id, text, confidence, am_score,
            lm_score, kept, reason ("" when kept), duration, speaker_id, condition, audio_uri
        calibration/<shard>.parquet   errors against the transcript, where there is one
        dev.json   the acwt and the threshold chosen on dev, with the dev curve
        rejects/<shard>.parquet (every dropped utterance and why), _shards/, _SUCCESS.json

How: decode's actor pool (decoding.decode.Pool with decoding.pseudolabel's worker: the
same featurisation, model and search) decodes the dev split at each decode.acwt, keeps
the best scale, and chooses the confidence threshold there (decoding/pseudolabel.py: the
rule, the confidence); then labels the unlabeled shards, each written with its marker as it
finishes, so a killed step redoes only unfinished shards. A finished step is handed back for
the same inputs (teacher, LM, lexicon by digest; corpus, selection, decode and pseudolabel
keys): `StepContext.resume_plan`.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any

from amflow.services import decoder_setup
from core.progress import Progress
from core.raycluster import runs_inline
from core.runs import Reject, StepContext, StepError, rejects_table
from decoding import decode as D
from decoding import pseudolabel as PL
from tasks.select import Record
from tasks.targets import teacher_uri

log = logging.getLogger(__name__)


def teacher_model(ctx: StepContext, args: Any) -> str:
    uri = getattr(args, "model", None) or teacher_uri(ctx.cfg.targets, ctx.other("train"))
    if not ctx.storage.exists(uri):
        raise StepError(f"teacher model {uri} not found: set targets.teacher to the teacher's "
                        "model.pt (the teacher DAG's runs/<T>/train-teacher/model.pt) or pass "
                        "--model URI")
    return uri


def selected_shards(ctx: StepContext) -> list[dict]:
    """The select index entries of pseudolabel.split."""
    split = ctx.cfg.pseudolabel.split
    index = ctx.storage.read_json(ctx.other("select", "shards.json"))["shards"]
    out = [e for e in index if e["split"] == split]
    if not out:
        found = sorted({e["split"] for e in index})
        raise StepError(f"the run's selection has no '{split}' shards (pseudolabel.split; "
                        f"selected: {', '.join(found) or 'none'}): add it to select.splits")
    return out


def shard_records(ctx: StepContext, shard: str) -> list[Record]:
    """A select shard's records, each audio_uri made absolute: select wrote them joined to
    data.corpus already, and the decode actors join them to it again (features'
    resolve_uri), which keeps only absolute ones; a relative corpus (configs/local.yaml's
    ./data/corpus) otherwise made every path ./data/corpus/./data/corpus/...: missing."""
    t = ctx.storage.read_parquet(ctx.other("select", "shards", f"{shard}.parquet"))
    names = [f.name for f in dataclasses.fields(Record)]
    recs = [Record(**{k: row[k] for k in names}) for row in t.to_pylist()]
    for r in recs:
        if "://" not in r.audio_uri and not os.path.isabs(r.audio_uri):
            r.audio_uri = os.path.abspath(r.audio_uri)
    return recs


def plan_of(ctx: StepContext, model: str, corpus: str, select: dict,
            read: dict[str, bytes]) -> dict[str, Any]:
    """What the labels depend on: decode's inputs (teacher, LM, lexicon by digest, corpus,
    the search keys), the selection (when it finished) and every pseudolabel key."""
    inputs = decoder_setup.decode_inputs(ctx, model, corpus, ctx.cfg.pseudolabel.split, read)
    inputs["decode"].pop("tune_split", None)  # pseudolabel tunes on pseudolabel.dev_split
    inputs.update(select=ctx.other("select"), select_finished_at=select.get("finished_at"),
                  pseudolabel=dataclasses.asdict(ctx.cfg.pseudolabel))
    return json.loads(json.dumps(inputs))


# ----------------------------------------------------------------- dev: acwt, threshold
def search_labels(pool: D.Pool, scored: list[dict], acwt: float, desc: str) -> list[PL.Label]:
    prog = Progress(sum(len(s["utts"]) for s in scored), desc=desc, unit="utts", interval_s=10)
    labels: list[PL.Label] = []
    jobs = [s["utts"] for s in scored if s["utts"]]
    for res in pool.results("label_scored", jobs, lambda u: (u, acwt)):
        labels += res["labels"]
        prog.update(len(res["labels"]))
    prog.close()
    return labels


def dev_choice(ctx: StepContext, pool: D.Pool, corpus: str) -> dict[str, Any]:
    """The acwt (best dev WER of decode.acwt) and the confidence threshold (the rule of
    decoding/pseudolabel.py, or pseudolabel.threshold), kept in dev.json (a resumed step
    under the same plan takes it back)."""
    uri = ctx.path("dev.json")
    if ctx.storage.exists(uri):
        return ctx.storage.read_json(uri)
    pc, dc = ctx.cfg.pseudolabel, ctx.cfg.decode
    recs, _ = D.split_records(ctx.storage, corpus, pc.dev_split)
    scored = pool.score(D.shards_of(recs, 2 * dc.workers),
                        f"pseudolabel dev ({pc.dev_split}): features+model")
    tuning, by_acwt = [], {}
    for a in dc.acwt:
        by_acwt[a] = search_labels(pool, scored, a, f"pseudolabel dev: acwt {a}")
        tuning.append({"acwt": a, "wer": PL.rates(PL.tally(PL.apply_filter(by_acwt[a], 0.0)))
                       ["wer_all"]})
        log.info("pseudolabel dev (%s): acwt %s WER %.2f %%", pc.dev_split, a,
                 100 * (tuning[-1]["wer"] or 0))
    acwt = min(tuning, key=lambda r: r["wer"] if r["wer"] is not None else 1e9)["acwt"]
    choice = PL.choose_threshold(by_acwt[acwt], pc.max_wer_ratio, pc.min_kept)
    threshold = pc.threshold if pc.threshold >= 0 else choice.threshold
    at = PL.rates(PL.tally(PL.apply_filter(by_acwt[acwt], threshold)))
    out = {"split": pc.dev_split, "acwt": acwt, "tuning": tuning, "threshold": threshold,
           "threshold_from": "pseudolabel.threshold" if pc.threshold >= 0 else "dev rule",
           "rule": {"max_wer_ratio": pc.max_wer_ratio, "min_kept": pc.min_kept},
           "choice": choice.to_dict(), "at_threshold": at}
    ctx.storage.write_json(uri, out)
    return out


# ----------------------------------------------------------------- the unlabeled shards
def write_shard(ctx: StepContext, res: dict, threshold: float) -> dict[str, Any]:
    """One labelled shard's outputs, then its marker (its tally and timings)."""
    st, shard = ctx.storage, res["shard"]
    filtered = PL.apply_filter(res["labels"], threshold)
    nbytes = st.write_parquet(ctx.path("labels", f"{shard}.parquet"), PL.labels_table(filtered))
    nbytes += st.write_parquet(ctx.path("calibration", f"{shard}.parquet"),
                               PL.calibration_table(filtered))
    rejects = [Reject(lab.utt_id, r, PL.reject_detail(lab, r, threshold), shard)
               for lab, r in filtered if r]
    rejects_uri = ctx.path("rejects", f"{shard}.parquet")
    if rejects:
        nbytes += st.write_parquet(rejects_uri, rejects_table(rejects))
    elif st.exists(rejects_uri):  # an interrupted try's, under another threshold
        st.delete(rejects_uri)
    marker = {"shard": shard, "tally": PL.tally(filtered), "bytes": nbytes,
              **{k: res[k] for k in ("audio_s", "featurize_s", "forward_s", "search_s",
                                     "frames")}}
    st.write_json(ctx.shard_marker(shard), marker)
    return marker


def label_shards(ctx: StepContext, pool: D.Pool, entries: list[dict], acwt: float,
                 threshold: float) -> list[dict]:
    jobs = [(e["shard"], shard_records(ctx, e["shard"])) for e in entries]
    prog = Progress(sum(len(r) for _, r in jobs), desc="pseudolabel", unit="utts",
                    interval_s=10)
    markers, audio, t0 = [], 0.0, time.perf_counter()
    for res in pool.results("label", jobs, lambda j: (j[1], acwt, j[0])):
        markers.append(write_shard(ctx, res, threshold))
        audio += res["audio_s"]
        t = markers[-1]["tally"]
        prog.update(t["utts"], kept=f"{t['kept_utts']}/{t['utts']}",
                    x_real_time=audio / max(time.perf_counter() - t0, 1e-9))
    prog.close()
    return markers


# ----------------------------------------------------------------- the step
def speed(fresh: list[dict], wall: float, workers: int) -> dict[str, Any]:
    """x real time of the labelling (wall, and per core: model + search CPU seconds)."""
    if not fresh:
        return {"x_real_time": None, "x_real_time_per_core": None, "workers": workers}
    audio = sum(m["audio_s"] for m in fresh)
    cpu = sum(m["featurize_s"] + m["forward_s"] + m["search_s"] for m in fresh)
    return {"x_real_time": round(audio / max(wall, 1e-9), 1),
            "x_real_time_per_core": round(audio / max(cpu, 1e-9), 1),
            "search_s": round(sum(m["search_s"] for m in fresh), 2),
            "forward_s": round(sum(m["forward_s"] for m in fresh), 2),
            "featurize_s": round(sum(m["featurize_s"] for m in fresh), 2),
            "audio_s": round(audio, 2), "wall_s": round(wall, 2), "workers": workers}


def render(r: dict, dev: dict, rtf: dict) -> str:
    def pct(x):
        return "   n/a" if x is None else f"{100 * x:6.2f}"

    ch, at = dev["choice"], dev["at_threshold"]
    return "\n".join([
        f"acwt {dev['acwt']} and threshold {dev['threshold']:.4f} ({dev['threshold_from']}; "
        f"on {dev['split']}: unfiltered WER {pct(ch['unfiltered_wer'])} %, kept "
        f"{pct(at['wer_kept'])} % on {pct(at['kept_audio_fraction'])} % of the audio, rule "
        f"met: {ch['rule_met']})",
        f"{'pseudo-labels':<14} {'utts':>6} {'WER %':>7}",
        f"{'all':<14} {r['utts']:>6} {pct(r['wer_all'])}",
        f"{'kept':<14} {r['kept_utts']:>6} {pct(r['wer_kept'])}",
        f"{'dropped':<14} {r['dropped_utts']:>6} {pct(r['wer_dropped'])}",
        f"kept {pct(r['kept_audio_fraction'])} % of the audio; dropped by reason "
        f"{r['dropped_by_reason']}; {rtf['x_real_time']}x real time "
        f"({rtf['x_real_time_per_core']}x per core)"])


def run(ctx: StepContext, args: Any = None) -> dict[str, Any]:
    select = ctx.require("select")
    corpus = ctx.cfg.data.corpus
    model = teacher_model(ctx, args)
    entries = selected_shards(ctx)
    read = decoder_setup.read_inputs(ctx, model, corpus)
    plan = plan_of(ctx, model, corpus, select, read)
    earlier = ctx.resume_plan(plan)
    if earlier is not None:
        return earlier
    assets = decoder_setup.load_assets(ctx, model, corpus, read)
    read.clear()  # the LM's text is in the graph now
    # below ray.inline_hours of selected audio: the workers in this process (D.Pool)
    hours = select.get("metrics", {}).get("audio_hours")
    pool = D.Pool(ctx.cfg, assets.model_bytes, assets.graph_dir, assets.log_prior, corpus,
                  worker=PL.PseudoLabelWorker, inline=runs_inline(ctx.cfg, hours))
    dev = dev_choice(ctx, pool, corpus)
    done = {e["shard"]: m for e in entries if (m := ctx.shard_done(e["shard"])) is not None}
    t0 = time.perf_counter()
    fresh = label_shards(ctx, pool, [e for e in entries if e["shard"] not in done],
                         dev["acwt"], dev["threshold"])
    rtf = speed(fresh, time.perf_counter() - t0, pool.workers)
    markers = list(done.values()) + fresh
    r = PL.rates(PL.merge_tallies(m["tally"] for m in markers))
    print(render(r, dev, rtf), flush=True)
    metrics = {**r, "acwt": dev["acwt"], "threshold": dev["threshold"],
               "threshold_from": dev["threshold_from"], "dev": dev["at_threshold"],
               "dev_unfiltered_wer": dev["choice"]["unfiltered_wer"],
               "dev_rule_met": dev["choice"]["rule_met"], "rtf": rtf,
               "shards": len(entries), "shards_skipped": len(done)}
    counts = {"in": r["utts"], "out": r["kept_utts"], "rejected": r["dropped_utts"],
              "kept": r["kept_utts"], "dropped": r["dropped_utts"],
              "dropped_by_reason": r["dropped_by_reason"]}
    return ctx.finish(inputs=plan, counts=counts, metrics=metrics,
                      bytes_written=sum(m["bytes"] for m in markers),
                      extra={"labels": ctx.path("labels"), "model": model})
