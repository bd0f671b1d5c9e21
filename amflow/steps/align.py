"""`amflow align`: GMM-HMM forced alignment of the selected transcribed audio to senones.

Reads  `runs/<R>/select/shards/*.parquet` of the splits in `align.splits`, the audio they
       point at, the lexicon (`data.lexicon` or `<corpus>/lexicon.txt`) and, for scoring
       (and, with `align.guide=ctm`, to train from: alignment/guide.py),
       `<corpus>/alignments.ctm`.
Writes `runs/<R>/align/alignments/<shard>.parquet`  utt_id, speaker_id, num_frames, phones
                                                    (phone ids), senones (pdf ids) and
                                                    nn_senones (the network tree's leaf)
                                                    per 10 ms frame
       `runs/<R>/align/alignments.ctm`              phone CTM (silence included)
       `runs/<R>/align/tree`                        Kaldi binary ContextDependency
       `runs/<R>/align/nn_tree`, `nn_tree.json`     the network's tree (one pdf class per
                                                    phone, align.nn_senones leaves): Kaldi
                                                    binary and core.senones JSON
       `runs/<R>/align/final.mdl`, `mono.mdl`       Kaldi text models (TransitionModel + AmDiagGmm)
       `runs/<R>/align/topo`, `phones.txt`, `model.pkl` (kaldi-hmm-gmm objects, pickled)
       `runs/<R>/align/rejects/align.parquet`, `_SUCCESS.json`

One `ShardJob` per select shard (a Ray actor unless `align.use_ray` is false) keeps its
features and alignments; the driver sums their statistics and updates the model
(alignment/train.py has the recipe).

With `align.reuse` (default `teacher`), a student's run whose teacher's run aligned the
same utterances with the same settings, lexicon, corpus and network tree takes those
alignments and models instead of training (alignment/reuse.py); metrics say
`alignments_from`.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
from collections import Counter
from typing import Any

import kaldi_hmm_gmm  # noqa: F401  first: OpenFST import-order trap (alignment/__init__.py)
import numpy as np
import pyarrow as pa

from alignment import ctm as C
from alignment import lexicon_graphs as lg
from alignment import model_io
from alignment import reuse
from alignment.features import FeatureOptions
from alignment.nnet import NnetOptions
from alignment.jobs import ShardJob, Utterance, run_jobs
from alignment.train import (NothingToAlign, RecipeOptions, Stage, failures, frame_classes,
                             network_tree, train)
from alignment.tree import Tree
from core.config import Config, FeaturesConfig, StorageConfig
from core.reject_hints import nothing_left
from core.runs import SUCCESS, Reject, StepContext, StepError, rejects_table
from core.senones import ContextTree, ContextTreeError
from core.storage import Storage, join
from decoding.lexicon import LexiconError, read_lexicon, words_of
from tasks import alignments as ref_al
from tasks.audio import decode_audio, read_audio_bytes
from tasks.speech.phone_sets import resolve_names

log = logging.getLogger(__name__)

ALIGN_SCHEMA = pa.schema([
    ("utt_id", pa.string()), ("speaker_id", pa.string()), ("shard", pa.string()),
    ("num_frames", pa.int32()), ("frame_shift_ms", pa.float32()),
    ("phones", pa.list_(pa.int16())), ("senones", pa.list_(pa.int32())),
    ("nn_senones", pa.list_(pa.int32())),
])


def load_shard(storage_cfg: StorageConfig, fcfg: FeaturesConfig, manifest: str,
               shard: str, clean: dict[str, str] | None = None
               ) -> tuple[list[Utterance], list[Reject]]:
    """A select manifest -> utterances with their audio (runs inside the job); with
    `clean` (utt_id -> URI), each utterance's dry rendering instead."""
    st = Storage(storage_cfg)
    utts, rejects = [], []
    for row in st.read_parquet(manifest).to_pylist():
        uri = row["audio_uri"] if clean is None else clean.get(row["utt_id"])
        if uri is None:
            rejects.append(Reject(row["utt_id"], "no_clean_audio",
                                  "align.audio=clean: the record has no clean_audio_uri", shard))
            continue
        data, reason, detail = read_audio_bytes(st, uri)
        res = decode_audio(data, fcfg, row["duration"]) if data is not None else None
        if res is None or res.samples is None:
            rejects.append(Reject(row["utt_id"], (res.reason if res else reason) or
                                  "unreadable_audio", res.detail if res else detail, shard))
            continue
        utts.append(Utterance(row["utt_id"], row["speaker_id"], words_of(row["text"] or ""),
                              res.samples))
    return utts, rejects


def _lexicon(ctx: StepContext) -> tuple[lg.Lang, str]:
    """The lexicon's Lang and the sha256 of its text (part of what align's result is of)."""
    uri = ctx.cfg.data.lexicon_uri()
    if not ctx.storage.exists(uri):
        raise StepError(f"align needs a lexicon: {uri} not found (set data.lexicon, or run "
                        f"`amflow corpus`, which writes <corpus>/lexicon.txt)")
    text = ctx.storage.read_text(uri)
    try:
        lex = read_lexicon(text)
    except LexiconError as exc:
        raise StepError(f"{uri}: {exc}") from exc
    a = ctx.cfg.align
    return (lg.make_lang(lex.prons, a.sil_prob, closure_stops(a.closure_stops, lex, uri),
                         a.shared_closure),
            hashlib.sha256(text.encode()).hexdigest())


def closure_stops(names: list[str], lex: Any, uri: str) -> set[str]:
    """align.closure_stops spelt as the lexicon spells them (p -> P in upper-case
    ARPAbet, said at INFO); names that match no phone of the lexicon are a WARNING, all
    of them: a StepError (the option would silently do nothing)."""
    phones = lex.phones()
    found, missing = resolve_names(names, phones)
    if found != [n for n in names if n in phones]:
        log.info("align: align.closure_stops %s are %s in %s's phone set", names, found, uri)
    if missing and not found:
        raise StepError(f"align.closure_stops {names}: none is a phone of {uri} (its "
                        f"phones: {' '.join(sorted(phones)[:40])}); set align.closure_stops "
                        f"to its unvoiced stops, or [] for no closure phones")
    if missing:
        log.warning("align: align.closure_stops %s are not phones of %s: they get no closure "
                    "phone", missing, uri)
    return set(found)


def _clean_uris(ctx: StepContext) -> dict[str, str] | None:
    """utt_id -> dry rendering URI (align.audio=clean), else None."""
    if ctx.cfg.align.audio != "clean":
        return None
    # deferred: training/ pulls in torch, which only this option needs
    from training.example_servers import load_clean_sources

    clean = load_clean_sources(ctx.storage, ctx.cfg.data.corpus.rstrip("/"))
    return {u: v["uri"] for u, v in clean.items()}


def _jobs(ctx: StepContext, shards: list[dict], lang: lg.Lang) -> list[Any]:
    cfg: Config = ctx.cfg
    fopts = FeatureOptions(sample_rate=cfg.features.sample_rate)
    clean = _clean_uris(ctx)
    loaders = []
    for e in shards:
        manifest = ctx.other("select", "shards", f"{e['shard']}.parquet")
        mine = None
        if clean is not None:  # only this shard's part travels to its job
            utts = ctx.storage.read_parquet(manifest, columns=["utt_id"])
            mine = {u: clean[u] for u in utts.column("utt_id").to_pylist() if u in clean}
        loaders.append((e["shard"], functools.partial(load_shard, cfg.storage, cfg.features,
                                                      manifest, e["shard"], mine)))
    if not cfg.align.use_ray:
        return [ShardJob(sid, load, lang, fopts) for sid, load in loaders]
    import ray  # deferred: heavy, and only this path needs it

    from core.raycluster import init_ray, step_resources

    init_ray(cfg)
    cpus = float(ray.cluster_resources().get("CPU", 1.0))
    # actors hold their CPUs while alive: share the cluster's between the shards' actors
    actor = ray.remote(ShardJob).options(num_cpus=max(0.01, min(1.0, cpus / len(loaders))),
                                         resources=step_resources(cfg, "align") or None)
    return [actor.remote(sid, load, lang, fopts) for sid, load in loaders]


def _score_ctm(ctx: StepContext, got: reuse.Taken) -> dict | None:
    """A taken alignment (its CTM lines) against the corpus CTM, over this run's utterances."""
    frames = {r["utt_id"]: r["num_frames"] for rows in got.rows.values() for r in rows}
    hyps = ref_al.read_ctm("\n".join(got.ctm))[0]
    return _total_score(((u, _segments(h), frames[u]) for u, h in hyps.items()),
                        _reference(ctx))


def _reference(ctx: StepContext) -> dict:
    """The corpus's alignments.ctm (utt_id -> Alignment): it measures, and with
    align.guide=ctm it is trained from; {} if none."""
    uri = join(ctx.cfg.data.corpus.rstrip("/"), "alignments.ctm")
    return ref_al.read_ctm(ctx.storage.read_text(uri))[0] if ctx.storage.exists(uri) else {}


def _score(results: list[list[dict]], lang: lg.Lang, ref: dict) -> dict | None:
    return _total_score(((r["utt_id"], [(lang.phones[p], s * C.FRAME_SHIFT_S,
                                         (s + n) * C.FRAME_SHIFT_S)
                                        for p, s, n in C.segments(r["phones"], r["starts"])],
                          len(r["phones"])) for rows in results for r in rows), ref)


def _total_score(hyps: Any, ref: dict) -> dict | None:
    """(utt_id, [(phone, start s, end s)], frames) per utterance against the reference
    CTM; None without one."""
    if not ref:
        return None
    total = C.Score()
    for utt, hyp, num_frames in hyps:
        a = ref.get(utt)
        if a is not None:
            total.add(C.score(hyp, _segments(a),
                              num_frames))
    return total.summary()


def _write_rows(ctx: StepContext, shard: str, rows: list[dict]) -> int:
    """One shard's alignments (rows as ALIGN_SCHEMA's columns)."""
    table = pa.Table.from_pylist(rows, schema=ALIGN_SCHEMA)
    return ctx.storage.write_parquet(ctx.path("alignments", f"{shard}.parquet"), table)


def _write(ctx: StepContext, results: list[list[dict]], shards: list[dict], lang: lg.Lang,
           final: Stage, mono: Stage, plain: dict, nn_tree: Tree | None) -> int:
    st = ctx.storage
    written, lines = 0, []
    ct = ContextTree.from_dict(plain)
    for e, rows in zip(shards, results):
        written += _write_rows(ctx, e["shard"], [{
            "utt_id": r["utt_id"], "speaker_id": r["speaker_id"], "shard": e["shard"],
            "num_frames": len(r["phones"]), "frame_shift_ms": 10.0,
            "phones": r["phones"].astype(np.int16).tolist(),
            "senones": r["senones"].astype(np.int32).tolist(),
            "nn_senones": frame_classes(ct, r["phones"], r["starts"], lang.sil_id).tolist()}
            for r in rows])
        for r in rows:
            lines += C.ctm_lines(r["utt_id"], C.segments(r["phones"], r["starts"]), lang.phones)
    st.write_text(ctx.path("alignments.ctm"), "\n".join(lines) + "\n")
    st.write_text(ctx.path("phones.txt"), "".join(f"{p} {i}\n" for i, p in
                                                   enumerate(lang.phones)))
    st.write_bytes(ctx.path("tree"), model_io.tree_bytes(final.tree))
    # the network's tree (one pdf class per phone; core.senones reads the JSON form); a
    # tree taken from a teacher exists as JSON only
    if nn_tree is not None:
        st.write_bytes(ctx.path("nn_tree"), model_io.tree_bytes(nn_tree.context_dependency()))
    st.write_json(ctx.path("nn_tree.json"), plain)
    st.write_text(ctx.path("topo"), str(final.tm.topo))
    st.write_text(ctx.path("final.mdl"), model_io.model_text(final.tm, final.am))
    if final.transform is not None:  # Kaldi's final.mat: the LDA + MLLT feature transform
        st.write_text(ctx.path("final.mat"), model_io.matrix_text(final.transform))
    if final.speaker_transforms:  # Kaldi's trans.*: per-speaker fMLLR, a text archive
        st.write_text(ctx.path("trans.ark"), model_io.matrix_archive(final.speaker_transforms))
    st.write_text(ctx.path("mono.mdl"), model_io.model_text(mono.tm, mono.am))
    st.write_bytes(ctx.path("model.pkl"), model_io.pickled(final.tree, final.tm, final.am))
    return written


def _options(cfg: Config) -> RecipeOptions:
    a = cfg.align
    return RecipeOptions(a.num_senones, a.mono_iters, a.tri_iters, a.realign_every,
                         a.mono_gauss, a.tri_gauss, a.beam, a.retry_beam, a.min_leaf_count,
                         a.lda_mllt, a.splice_context, a.lda_dim, a.sat, tuple(a.fmllr_iters),
                         a.fmllr_min_frames,
                         NnetOptions(a.nnet_rounds, a.nnet_context, epochs=a.nnet_epochs,
                                     acoustic_scale=a.nnet_acoustic_scale),
                         guided=a.guide == "ctm", boost_silence=a.boost_silence,
                         flat_start_silence_db=a.flat_start_silence_db,
                         baum_welch_passes=a.baum_welch_passes,
                         baum_welch_scale=a.baum_welch_scale, mono_subset=a.mono_subset)


def run(ctx: StepContext, args: Any = None) -> dict[str, Any]:
    st, acfg = ctx.storage, ctx.cfg.align
    select = ctx.require("select")
    shards = [e for e in st.read_json(ctx.other("select", "shards.json"))["shards"]
              if e["split"] in acfg.splits]
    if not shards:
        raise StepError(f"select has no shards of splits {acfg.splits} (align.splits)")
    lang, lexicon = _lexicon(ctx)
    src = tree_source(ctx.cfg)  # checked before the GMMs train, not after
    taken, card_info = _taken_tree(ctx, src, lang) if src else (None, {})
    utts = _shard_utts(ctx, shards)
    from_dir = _reuse_source(ctx, utts, lexicon, taken, card_info)
    # A finished align is reused only for the same select output, settings and lexicon
    # (use_ray is where it runs, not what it computes)
    plan = {"select_finished_at": select.get("finished_at"),
            "align": {k: v for k, v in dataclasses.asdict(acfg).items() if k != "use_ray"},
            "network_tree_from": src, "lexicon": lexicon,
            "alignments_from": from_dir and {
                "dir": from_dir,
                "finished_at": st.read_json(join(from_dir, SUCCESS)).get("finished_at")}}
    done = ctx.resume_plan(plan)
    if done is not None and not _labelled_with(ctx, taken):
        # The plan names the tree by where it is; a teacher trained again there may hold
        # another tree, and labels of the old one would not be its classes
        log.warning("align: the network tree at %s is not the one this run's alignments "
                    "are labelled with (trained again?); starting over", src)
        st.delete_dir(ctx.step_uri)
        done = ctx.resume_plan(plan)
    if done is not None:
        return done
    if from_dir:
        return _take(ctx, select, utts, from_dir, taken)
    ref = _reference(ctx)
    jobs = _jobs(ctx, shards, lang)
    opts = _options(ctx.cfg)
    if opts.guided:
        _set_guide(ctx, jobs, ref)
    scores: dict[str, Any] = {}
    stages: dict[str, Stage] = {}

    def on_stage(stage: Stage, js: list) -> None:
        stages[stage.name] = stage
        scores[stage.name] = _score(run_jobs(js, "results", stage.tm), lang, ref)
        log.info("align: %s stage vs the reference CTM: %s", stage.name, scores[stage.name])

    try:
        final, hist = train(jobs, lang, opts, on_stage)
    except NothingToAlign:
        rejects = _all_rejects(jobs, {})
        _write_rejects(ctx, rejects)
        raise StepError(nothing_left("align", sum(e["utts"] for e in shards),
                                     (r.reason for r in rejects),
                                     ctx.path("rejects", "align.parquet"))) from None
    except (RuntimeError, ValueError) as exc:
        raise StepError(f"align: {exc}") from exc
    results = run_jobs(jobs, "results", final.tm)
    if final.built is not None:
        warn_fewer_leaves("align.num_senones", ctx.cfg.align.num_senones,
                          final.built.num_leaves, ctx.cfg.align.min_leaf_count)
    plain, nn_tree = (taken, None) if taken else _network_tree(ctx, jobs, lang, final)
    written = _write(ctx, results, shards, lang, final, stages["mono"], plain, nn_tree)
    hist.nn_senones = int(plain["num_leaves"])
    return _finish(ctx, select, jobs, shards, results, final, hist, scores, written)


def _set_guide(ctx: StepContext, jobs: list, ref: dict) -> None:
    """align.guide=ctm: every job keeps its utterances to the corpus CTM."""
    if not ref:
        raise StepError(f"align.guide=ctm needs the corpus's reference CTM: "
                        f"{join(ctx.cfg.data.corpus.rstrip('/'), 'alignments.ctm')} not found")
    run_jobs(jobs, "set_guide", {u: _segments(a) for u, a in ref.items()})


def _segments(a: ref_al.Alignment) -> list[tuple[str, float, float]]:
    """A CTM's alignment as (phone, start s, end s) rows, as ctm.score and guide read them."""
    return list(zip(a.phones, a.starts.tolist(), a.ends.tolist()))


def tree_source(cfg: Config) -> str:
    """Where the network's tree comes from: align.network_tree, else a student run's
    teacher (targets.teacher), else "" (grown here)."""
    return cfg.align.network_tree or cfg.targets.teacher


def _labelled_with(ctx: StepContext, taken: dict | None) -> bool:
    """Whether this run's finished alignments carry the network tree `taken` (a tree grown
    here always does: the plan holds everything it is grown from)."""
    if taken is None:
        return True
    uri = ctx.path("nn_tree.json")
    return ctx.storage.exists(uri) and (ContextTree.from_dict(ctx.storage.read_json(uri))
                                        == ContextTree.from_dict(taken))


def _network_tree(ctx: StepContext, jobs: list, lang: lg.Lang, final: Stage
                  ) -> tuple[dict, Tree]:
    """The network's tree grown from the final alignment: core.senones JSON and Tree."""
    acfg = ctx.cfg.align
    try:
        tree = network_tree(jobs, lang, final, acfg.nn_senones or acfg.num_senones,
                            acfg.min_leaf_count)
    except ValueError as exc:
        raise StepError(f"align.nn_senones: {exc}") from exc
    plain = tree.to_plain(lang.phones, lang.phones[lang.sil_id])
    key = "align.nn_senones" if acfg.nn_senones else "align.num_senones"
    warn_fewer_leaves(key, acfg.nn_senones or acfg.num_senones, int(plain["num_leaves"]),
                      acfg.min_leaf_count)
    return plain, tree


def warn_fewer_leaves(key: str, asked: int, got: int, min_leaf_count: float) -> None:
    """A tree grown to fewer leaves than asked (too little data: each leaf needs
    align.min_leaf_count frames, and a split must gain) is said, with the numbers."""
    if got < asked:
        log.warning("align: the tree has %d leaves, fewer than %s=%d asked: too little data "
                    "for that many (each leaf needs align.min_leaf_count=%g frames): %d are "
                    "used (set %s=%d to ask for what the data gives, or lower "
                    "align.min_leaf_count)", got, key, asked, min_leaf_count, got, key, got)


def _taken_tree(ctx: StepContext, src: str, lang: lg.Lang) -> tuple[dict, dict]:
    """The tree of a model card (model.pt) or an nn_tree.json, checked against this
    lexicon's phones: a student's classes must be its teacher's. With the card's `info`
    (where the model was trained; {} for a JSON tree)."""
    key = "align.network_tree" if ctx.cfg.align.network_tree else "targets.teacher"
    if not ctx.storage.exists(src):
        raise StepError(f"{key}: {src} not found (the network tree to label with)")
    info: dict = {}
    if src.endswith(".json"):
        plain = ctx.storage.read_json(src)
    else:  # deferred: torch, which only this path needs
        from training.checkpoint import load_model_card

        card = load_model_card(ctx.storage, src)[1]
        plain, info = card.context, card.info
        if not plain:
            raise StepError(f"{key}: the model {src} has phone classes (it was trained with "
                            "features.labels=ctm), no network tree: a student of it needs "
                            "features.labels=ctm too")
    try:
        tree = ContextTree.from_dict(plain)
    except (ContextTreeError, KeyError, TypeError) as exc:
        raise StepError(f"{key}: {src}: {exc}") from exc
    if list(tree.phones) != list(lang.phones):
        raise StepError(f"{key}: the tree of {src} has {len(tree.phones)} phones, this "
                        f"lexicon {len(lang.phones)}: they must be the same phone set")
    log.info("align: the network's tree (%d leaves) from %s", tree.num_leaves, src)
    return tree.to_dict(), info


def _shard_utts(ctx: StepContext, shards: list[dict]) -> dict[str, list[str]]:
    """shard -> the utterance ids of its select manifest."""
    return {e["shard"]: ctx.storage.read_parquet(
        ctx.other("select", "shards", f"{e['shard']}.parquet"), columns=["utt_id"]
    ).column("utt_id").to_pylist() for e in shards}


def _reuse_source(ctx: StepContext, utts: dict[str, list[str]], lexicon: str,
                  taken: dict | None, card_info: dict) -> str:
    """The align output to take this run's alignments from (align.reuse), "" to train.
    An explicit URI that does not fit is an error; the teacher's run is only a candidate."""
    mode = ctx.cfg.align.reuse
    if mode == "never":
        return ""
    src = reuse.teacher_align_dir(card_info) if mode == "teacher" else mode
    if not src:
        return ""
    why = reuse.problem(ctx.storage, src, reuse.compared(dataclasses.asdict(ctx.cfg.align)),
                        lexicon, ctx.cfg.data.corpus, taken,
                        {u for us in utts.values() for u in us})
    if why and mode != "teacher":
        raise StepError(f"align.reuse: {src} cannot give this run's alignments: {why}")
    if why:
        log.warning("align: training here, not taking the teacher run's alignments (%s): %s",
                    src, why)
        return ""
    log.info("align: taking the alignments of %s (align.reuse=%s)", src, mode)
    return src


def _take(ctx: StepContext, select: dict, utts: dict[str, list[str]], src: str,
          taken: dict | None) -> dict[str, Any]:
    """align's outputs from the earlier align output `src` (_reuse_source accepted it)."""
    st = ctx.storage
    got = reuse.take(st, src, utts)
    written = sum(_write_rows(ctx, shard, rows) for shard, rows in got.rows.items())
    st.write_text(ctx.path("alignments.ctm"), "\n".join(got.ctm) + "\n")
    for name in reuse.MODEL_FILES:
        if st.exists(join(src, name)):
            data = st.read_bytes(join(src, name))
            st.write_bytes(ctx.path(name), data)
            written += len(data)
    st.write_json(ctx.path("nn_tree.json"), taken or st.read_json(join(src, "nn_tree.json")))
    reasons = _write_rejects(ctx, got.rejects)
    n_out = sum(len(rows) for rows in got.rows.values())
    # the source's stage scores are over its utterances: kept apart, and the taken
    # alignment scored over this run's
    source = got.summary.get("metrics", {})
    metrics = {**{k: v for k, v in source.items() if not k.startswith("score_")},
               "source_scores": {k: v for k, v in source.items() if k.startswith("score_")},
               "score_taken": _score_ctm(ctx, got), "alignments_from": src,
               "network_tree_from": tree_source(ctx.cfg) or None, "reject_reasons": reasons,
               "frames": sum(r["num_frames"] for rows in got.rows.values() for r in rows)}
    return ctx.finish(
        inputs={**_inputs(ctx, select), "alignments_from": join(src, SUCCESS)},
        counts={"in": sum(len(u) for u in utts.values()), "out": n_out,
                "rejected": len(got.rejects)},
        metrics=metrics, bytes_written=written)


def _finish(ctx: StepContext, select: dict, jobs: list, shards: list[dict], results: list,
            final: Stage, hist: Any, scores: dict, written: int) -> dict[str, Any]:
    shard_of = {r["utt_id"]: e["shard"] for e, rows in zip(shards, results) for r in rows}
    rejects = _all_rejects(jobs, shard_of)
    n_out = sum(len(rows) for rows in results)
    reasons = _write_rejects(ctx, rejects)
    metrics = {
        "num_senones": final.built.num_leaves if final.built else None,
        "nn_senones": hist.nn_senones, "network_tree_from": tree_source(ctx.cfg) or None,
        "gaussians": final.am.num_gauss, "phones": len(lang_phones(final)),
        "iterations": hist.iters, "realignments": hist.realignments,
        "frames": sum(len(r["phones"]) for rows in results for r in rows),
        "score_mono": scores.get("mono"), "score_tri": scores.get("tri"),
        "score_lda_mllt": scores.get("lda_mllt"), "score_sat": scores.get("sat"),
        "score_nnet": scores.get("nnet"), "nnet_rounds": hist.nnet, "fmllr": hist.fmllr,
        "guide": ctx.cfg.align.guide, "flat_start": hist.flat_start,
        "stage_seconds": hist.seconds,
        **{f"score_{k}": v for k, v in scores.items() if k.endswith("_guided")},
        "reject_reasons": reasons,
    }
    return ctx.finish(
        inputs=_inputs(ctx, select),
        counts={"in": sum(e["utts"] for e in shards), "out": n_out, "rejected": len(rejects)},
        metrics=metrics, bytes_written=written)


def _all_rejects(jobs: list, shard_of: dict[str, str]) -> list[Reject]:
    """What the jobs rejected on load and what failed to compile or align."""
    rejects = [r for rs in run_jobs(jobs, "load_rejects") for r in rs]
    for utt, why in failures(jobs).items():
        reason, _, detail = why.partition(": ")
        rejects.append(Reject(utt, reason, detail, shard_of.get(utt, "")))
    return rejects


def _write_rejects(ctx: StepContext, rejects: list[Reject]) -> dict[str, int]:
    """rejects/align.parquet; the count per reason, for the metrics."""
    ctx.storage.write_parquet(ctx.path("rejects", "align.parquet"), rejects_table(rejects))
    return dict(Counter(r.reason for r in rejects))


def _inputs(ctx: StepContext, select: dict) -> dict[str, Any]:
    """What an align output was made from (its summary's `inputs`)."""
    return {"select": ctx.other("select", SUCCESS), "corpus": ctx.cfg.data.corpus,
            "select_finished_at": select.get("finished_at"), "splits": ctx.cfg.align.splits}


def lang_phones(stage: Stage) -> list[int]:
    return list(stage.tm.phones)
