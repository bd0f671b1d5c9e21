"""`amflow decode`: a model to words on a corpus split; WER per condition.

    amflow decode --model M [--data CORPUS] [--split test] [--out FILE] --run-id R

Reads   --model   model.pt (default: runs/<R>/train[-<decode.tag>]/model.pt): CMVN, phone
                  list, features config and class priors (counted from the training
                  targets; for an older model file, from its run's training partitions)
        --data    a corpus in the input format (default data.corpus): transcripts (`text`)
                  and audio of the records of --split and of decode.tune_split
        data.lexicon (default <corpus>/lexicon.txt) and decode.lm (default runs/<R>/lm/
                  lm.arpa, estimated first with `amflow lm`'s settings when missing)
Writes  --out     JSON (default runs/<R>/decode[-<tag>]/result.json): wer, ser, sub/del/ins,
                  per_condition {DP1..: WER}, per_condition_ser, acwt (tuned on
                  decode.tune_split), tuning [{acwt, wer}], rtf, oov, rejected, graph
                  wer_ci95 / per_condition_ci95 [lo, hi] (bootstrap over utterances),
                  errors / per_condition_errors (S/D/I counts), confusions (top pairs)
        runs/<R>/decode[-<tag>]/errors.txt   sclite-like REF/HYP alignment, S/D/I, confusions
        runs/<R>/decode[-<tag>]/hyps.jsonl and hyps.parquet   1-best words per utterance
        runs/<R>/graph/<key>/  HLG.fst, words.txt, graph.json (built once per lexicon, LM
                  and class set, then reused)
        _SUCCESS.json, rejects/rejects.parquet

How: utterances are grouped by speaker into shards (features are per-speaker streams:
causal mean normalisation carries over a speaker's utterances in time order, as in the
features step). A pool of Ray actors (decode.workers, one CPU each) each holds the model
and the graph: per shard it featurises, runs the model, and returns the log posteriors;
the search runs per shard for each acoustic scale on the tuning split, then with the best
scale on the scored split. Acoustic scores = acwt x (log posterior - log prior).
"""
from __future__ import annotations

import io
import logging
import os
import tempfile
import time
from collections import defaultdict
from typing import Any, Sequence

import numpy as np

from amflow.progress import Progress
from amflow.runs import Reject, StepContext, StepError, rejects_table
from amflow.storage import join
from decoding import error_analysis
from decoding import wer as W
from decoding.lexicon import Lexicon, LexiconError, read_lexicon, words_of

log = logging.getLogger(__name__)


# ----------------------------------------------------------------- the worker (a Ray actor)
class DecodeWorker:
    """Holds one model and one graph; featurises, scores and searches shards."""

    def __init__(self, model_bytes: bytes, graph_dir: str, log_prior: np.ndarray,
                 corpus: str, storage_cfg: Any, beam: float, max_active: int,
                 threads: int = 1):
        import torch

        from amflow.storage import Storage
        from decoding.graph import read_graph
        from decoding.search import Searcher
        from training.checkpoint import model_from_bytes

        torch.set_num_threads(threads)
        self.model, self.meta = model_from_bytes(model_bytes)
        self.searcher = Searcher(read_graph(graph_dir), beam, max_active)
        self.log_prior = np.asarray(log_prior, np.float32)
        self.corpus = corpus
        self.storage = Storage(storage_cfg)

    def score(self, records: list) -> dict:
        """Featurise a shard (one or more speakers' streams) and run the model."""
        import torch

        t0 = time.perf_counter()
        feats, rejects, audio_s = featurize(self.storage, self.corpus, records, self.meta)
        t1 = time.perf_counter()
        out = list(zip([r for r, _ in feats], log_posteriors(self.model, [x for _, x in feats])))
        return {"utts": out, "rejects": rejects, "audio_s": audio_s,
                "featurize_s": t1 - t0, "forward_s": time.perf_counter() - t1}

    def search(self, utts: list, acwt: float) -> dict:
        from decoding.search import acoustic_scores

        t0 = time.perf_counter()
        hyps = []
        for rec, log_post in utts:
            words, _, final = self.searcher.best_words(
                acoustic_scores(log_post, self.log_prior, acwt))
            hyps.append((rec, words, final))
        return {"hyps": hyps, "search_s": time.perf_counter() - t0,
                "frames": sum(len(lp) for _, lp in utts)}


def log_posteriors(model, feats: Sequence[np.ndarray], batch_frames: int = 20000
                   ) -> list[np.ndarray]:
    """Log posteriors per utterance; length-sorted padded batches (the models take
    lengths, so padding never reaches a real frame's output)."""
    import torch

    order = sorted(range(len(feats)), key=lambda i: len(feats[i]))
    out: list[np.ndarray | None] = [None] * len(feats)
    batch: list[int] = []

    def flush() -> None:
        lens = torch.tensor([len(feats[i]) for i in batch])
        x = torch.zeros(len(batch), int(lens.max()), feats[batch[0]].shape[1])
        for j, i in enumerate(batch):
            x[j, :lens[j]] = torch.from_numpy(feats[i])
        with torch.no_grad():
            y = torch.log_softmax(model(x, lens).float(), -1).numpy()
        for j, i in enumerate(batch):
            out[i] = y[j, :int(lens[j])]
        batch.clear()

    for i in order:
        if batch and len(feats[i]) * (len(batch) + 1) > batch_frames:
            flush()
        batch.append(i)
    if batch:
        flush()
    return out  # type: ignore[return-value]


def featurize(storage, corpus: str, records: Sequence, meta: dict):
    """Features per record exactly as evaluate computes them; (rec, feats) and rejects."""
    from amflow.config import FeaturesConfig
    from tasks.fbank import FbankComputer
    from tasks.features import featurize_records
    from training.data import Normalizer
    from training.loop import dataclass_from_dict

    fcfg = dataclass_from_dict(FeaturesConfig, meta.get("features") or {})
    norm = Normalizer.from_stats(meta["cmvn"], int(meta["spec"]["input_dim"]))
    out, rejects, audio_s = [], [], 0.0
    for r, wave, x in featurize_records(storage, corpus, records, fcfg, FbankComputer(fcfg),
                                        rejects):
        audio_s += len(wave) / fcfg.sample_rate
        out.append((r, norm(x).astype(np.float32)))
    return out, rejects, audio_s


# ----------------------------------------------------------------- inputs
def load_lexicon(ctx: StepContext, corpus: str) -> tuple[Lexicon, str, str]:
    uri = ctx.cfg.data.lexicon or join(corpus, "lexicon.txt")
    if not ctx.storage.exists(uri):
        raise StepError(f"no lexicon at {uri}: set data.lexicon to a Kaldi lexicon.txt "
                        "(`amflow corpus` writes one for the embedded corpus)")
    text = ctx.storage.read_text(uri)
    try:
        return read_lexicon(text), text, uri
    except LexiconError as exc:
        raise StepError(f"{uri}: {exc}") from exc


def load_lm(ctx: StepContext) -> tuple[str, str]:
    """(ARPA text, URI): decode.lm, else this run's `amflow lm` output (estimated now)."""
    st = ctx.storage
    uri = ctx.cfg.decode.lm or ctx.other("lm", "lm.arpa")
    if not st.exists(uri):
        if ctx.cfg.decode.lm:
            raise StepError(f"decode.lm {uri} does not exist")
        from decoding import lm

        log.info("no LM at %s: estimating it (amflow lm, lm.* settings)", uri)
        lm.run(StepContext(ctx.cfg, ctx.run_id, "lm"))
    return st.read_text(uri), uri


def ensure_graph(ctx: StepContext, lex: Lexicon, lex_text: str, arpa: str,
                 classes: Sequence[str]) -> tuple[str, dict]:
    """A local directory holding HLG for (lexicon, LM, classes): cached under the run."""
    from decoding import graph as G

    key = G.graph_key(lex_text, arpa, classes, ctx.cfg.decode.sil_prob)
    st = ctx.storage
    remote = ctx.other("graph", key)
    local = st.local_path(remote) or os.path.join(tempfile.gettempdir(), "amflow-graph", key)
    names = ("HLG.fst", "words.txt", "graph.json")
    if all(os.path.exists(os.path.join(local, n)) for n in names):
        return local, G.read_graph(local).info
    if all(st.exists(join(remote, n)) for n in names):
        os.makedirs(local, exist_ok=True)
        for n in names:
            with open(os.path.join(local, n), "wb") as f:
                f.write(st.read_bytes(join(remote, n)))
        return local, G.read_graph(local).info
    try:
        graph = G.build_graph(lex, arpa, classes, ctx.cfg.decode.sil_prob)
    except G.GraphError as exc:
        raise StepError(f"cannot build the decoding graph: {exc}") from exc
    tmp = tempfile.mkdtemp(prefix="amflow-graph-")
    graph.write(tmp)
    for n in names:
        with open(os.path.join(tmp, n), "rb") as f:
            st.write_bytes(join(remote, n), f.read())
    log.info("graph %s: %s", key, graph.info)
    return (local if st.local_path(remote) else tmp), graph.info


def split_records(ctx: StepContext, corpus: str, split: str) -> tuple[list, list[Reject]]:
    """Records of `split` with a transcript; the rest rejected with the reason."""
    from tasks.select import records_of_split

    recs, _ = records_of_split(ctx.storage, corpus, split)  # malformed lines: no split
    keep, rejects = [], []
    for r in recs:
        if not r.text or not words_of(r.text):
            rejects.append(Reject(r.utt_id, "no_transcript", "the record has no `text` to score"))
        else:
            keep.append(r)
    return keep, rejects


def shards_of(records: Sequence, num: int) -> list[list]:
    """Speakers dealt into `num` shards of about equal audio (longest first)."""
    by: dict[str, list] = defaultdict(list)
    for r in records:
        by[r.speaker_id].append(r)
    shards: list[list] = [[] for _ in range(max(1, min(num, len(by))))]
    load = [0.0] * len(shards)
    for spk in sorted(by, key=lambda s: -sum(r.duration for r in by[s])):
        i = int(np.argmin(load))
        shards[i] += by[spk]
        load[i] += sum(r.duration for r in by[spk])
    return shards


# ----------------------------------------------------------------- the pool
class Pool:
    """decode.workers DecodeWorker actors behind ray.util.ActorPool."""

    def __init__(self, ctx: StepContext, model_bytes: bytes, graph_dir: str,
                 log_prior: np.ndarray, corpus: str):
        import ray
        from ray.util import ActorPool

        from amflow.raycluster import init_ray

        init_ray(ctx.cfg)
        dc = ctx.cfg.decode
        actor = ray.remote(num_cpus=1, **_pool_resources(ctx))(DecodeWorker)
        model_ref = ray.put(model_bytes)
        self.actors = [actor.remote(model_ref, graph_dir, log_prior, corpus, ctx.cfg.storage,
                                    dc.beam, dc.max_active) for _ in range(dc.workers)]
        self.pool = ActorPool(self.actors)

    def score(self, shards: list[list], desc: str) -> list[dict]:
        prog = Progress(sum(len(s) for s in shards), desc=desc, unit="utts", interval_s=10)
        out = []
        for res in self.pool.map_unordered(lambda a, s: a.score.remote(s), shards):
            out.append(res)
            prog.update(len(res["utts"]) + len(res["rejects"]))
        prog.close()
        return out

    def search(self, scored: list[dict], acwt: float, desc: str) -> tuple[list, float, int]:
        prog = Progress(sum(len(s["utts"]) for s in scored), desc=desc, unit="utts",
                        interval_s=10)
        hyps, search_s, frames = [], 0.0, 0
        jobs = [s["utts"] for s in scored if s["utts"]]
        for res in self.pool.map_unordered(lambda a, u: a.search.remote(u, acwt), jobs):
            hyps += res["hyps"]
            search_s += res["search_s"]
            frames += res["frames"]
            prog.update(len(res["hyps"]))
        prog.close()
        return hyps, search_s, frames


def _pool_resources(ctx: StepContext) -> dict:
    res = ctx.cfg.ray.step_resources.get("decode") or {}
    return {"resources": dict(res)} if res else {}


def score_hyps(hyps: list, lex: Lexicon) -> tuple[dict, list[dict], dict]:
    """WER of (record, words, reached_final) triples; rows for hyps.jsonl; OOV counts."""
    scores, rows = [], []
    oov = {"tokens": 0, "words": 0}
    for rec, words, final in sorted(hyps, key=lambda h: h[0].utt_id):
        ref = words_of(rec.text)
        missing = [w for w in ref if w not in lex]
        oov["tokens"] += len(missing)
        oov["words"] += len(ref)
        s = W.score(ref, words, rec.condition or "unknown")
        scores.append(s)
        rows.append({"utt_id": rec.utt_id, "condition": rec.condition or "unknown",
                     "ref": " ".join(ref), "hyp": " ".join(words), "errors": s.errors,
                     "ref_words": s.ref_words, "reached_final": final})
    oov["rate"] = oov["tokens"] / oov["words"] if oov["words"] else 0.0
    return W.aggregate(scores), rows, oov


# ----------------------------------------------------------------- the step
def _context(ctx: StepContext) -> StepContext:
    tag = ctx.cfg.decode.tag
    step = f"decode-{tag}" if tag else "decode"
    if ctx.step == step:
        return ctx
    new = StepContext(ctx.cfg, ctx.run_id, step, force=ctx.force)
    new.started = ctx.started
    return new


def _model(ctx: StepContext, args: Any) -> tuple[str, bytes, dict]:
    from training.checkpoint import model_from_bytes
    from training.launch import model_dir_name

    uri = getattr(args, "model", None) or ctx.other(model_dir_name(ctx.cfg.decode.tag), "model.pt")
    if not ctx.storage.exists(uri):
        raise StepError(f"model {uri} not found: train one with `amflow train` or pass --model URI")
    data = ctx.storage.read_bytes(uri)  # once: the meta here, the same bytes to the actors
    _, meta = model_from_bytes(data, uri)
    for key in ("cmvn", "phones"):
        if not meta.get(key):
            raise StepError(f"{uri} carries no {key}: decode needs a self-describing model.pt")
    return uri, data, meta


def _check_phones(lex: Lexicon, phones: Sequence[str], lex_uri: str, model_uri: str) -> None:
    missing = sorted(lex.phones() - set(phones))
    if missing:
        raise StepError(f"the lexicon {lex_uri} uses phones that the model {model_uri} has "
                        f"no class for: {missing[:20]} (model classes: {len(phones)})")


def run(ctx: StepContext, args: Any = None) -> dict[str, Any]:
    from decoding.priors import model_counts
    from decoding.search import log_priors

    ctx = _context(ctx)
    cfg, st = ctx.cfg, ctx.storage
    dc = cfg.decode
    corpus = getattr(args, "data", None) or cfg.data.corpus
    split = getattr(args, "split", None) or "test"
    if split == dc.tune_split:
        raise StepError(f"--split {split} is decode.tune_split: tune on one split, score another")
    out_uri = getattr(args, "out", None) or ctx.path("result.json")
    model_uri, model_bytes, meta = _model(ctx, args)
    done = _finished(ctx, {"model": model_uri, "data": corpus, "split": split}, out_uri)
    if done is not None:
        return done
    phones = list(meta["phones"])
    lex, lex_text, lex_uri = load_lexicon(ctx, corpus)
    _check_phones(lex, phones, lex_uri, model_uri)
    arpa, lm_uri = load_lm(ctx)
    graph_dir, graph_info = ensure_graph(ctx, lex, lex_text, arpa, phones)
    try:
        counts, prior_source = model_counts(st, meta, model_uri, len(phones))
    except ValueError as exc:
        raise StepError(str(exc)) from exc
    recs, rejects = split_records(ctx, corpus, split)
    n_in = len(recs) + len(rejects)
    t0 = time.perf_counter()
    pool = Pool(ctx, model_bytes, graph_dir, log_priors(counts), corpus)
    tuning, acwt = _tune(ctx, pool, corpus, lex)
    scored = pool.score(shards_of(recs, 2 * dc.workers), f"decode {split}: features+model")
    hyps, search_s, frames = pool.search(scored, acwt, f"decode {split}: search")
    wall = time.perf_counter() - t0
    rejects += [r for s in scored for r in s["rejects"]]
    result, rows, oov = score_hyps(hyps, lex)
    result.update(error_analysis.result_fields(rows))  # wer_ci95, S/D/I counts
    audio_s = sum(s["audio_s"] for s in scored)
    forward_s = sum(s["forward_s"] for s in scored)
    result.update({
        "model": model_uri, "data": corpus, "split": split, "acwt": acwt, "lm_weight": 1 / acwt,
        "tune_split": dc.tune_split, "tuning": tuning, "lm": lm_uri, "lexicon": lex_uri,
        "graph": graph_info, "priors_from": prior_source, "oov": oov,
        "rejected": _reasons(rejects), "audio_s": round(audio_s, 2),
        "rtf": _rtf(scored, search_s, audio_s, wall, dc.workers),
        "model_kind": meta["spec"]["kind"]})
    st.write_json(out_uri, result)
    _write_hyps(ctx, rows)
    st.write_text(ctx.path("errors.txt"), error_analysis.render(rows))  # sclite-like
    if rejects:
        st.write_parquet(ctx.path("rejects", "rejects.parquet"), rejects_table(rejects))
    print(render(result), flush=True)
    metrics = {"wer": result["wer"], "ser": result["ser"], "per_condition_wer": result["per_condition"],
               "per_condition": result["per_condition"], "acwt": acwt,
               "rtf_per_core": result["rtf"]["total_per_core"], "oov_rate": oov["rate"],
               "frames": frames, "forward_s": round(forward_s, 2)}
    return ctx.finish(inputs={"model": model_uri, "data": corpus, "split": split, "lm": lm_uri,
                              "lexicon": lex_uri},
                      counts={"in": n_in, "out": len(hyps), "rejected": len(rejects)},
                      metrics=metrics, extra={"out": out_uri})


def _finished(ctx: StepContext, inputs: dict, out_uri: str) -> dict | None:
    """The earlier summary when this decode already finished on the same inputs (and
    --force was not given): re-running a DAG reuses it, as the other steps do."""
    from amflow.runs import SUCCESS

    st = ctx.storage
    if ctx.force or not st.exists(ctx.path(SUCCESS)):
        return None
    done = st.read_json(ctx.path(SUCCESS))
    same = all(done.get("inputs", {}).get(k) == v for k, v in inputs.items())
    if same and done.get("out") == out_uri and st.exists(out_uri):
        log.info("%s already finished on these inputs (%s); use --force to decode again",
                 ctx.step_uri, ctx.path(SUCCESS))
        return done
    return None


def _tune(ctx: StepContext, pool: Pool, corpus: str, lex: Lexicon) -> tuple[list[dict], float]:
    """WER on decode.tune_split for each decode.acwt; the best scale (first on ties)."""
    dc = ctx.cfg.decode
    if not dc.tune_split or len(dc.acwt) == 1:
        return [], dc.acwt[0]
    try:
        recs, _ = split_records(ctx, corpus, dc.tune_split)
    except StepError as exc:
        log.warning("no tuning: %s; using decode.acwt[0] = %s", exc, dc.acwt[0])
        return [], dc.acwt[0]
    scored = pool.score(shards_of(recs, 2 * dc.workers), f"tune on {dc.tune_split}: features+model")
    rows = []
    for a in dc.acwt:
        hyps, _, _ = pool.search(scored, a, f"tune acwt {a}")
        rows.append({"acwt": a, "wer": score_hyps(hyps, lex)[0]["wer"]})
        log.info("tuning on %s: acwt %.2f WER %.2f %%", dc.tune_split, a, 100 * rows[-1]["wer"])
    best = min(rows, key=lambda r: r["wer"])
    return rows, best["acwt"]


def _reasons(rejects: list[Reject]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rejects:
        out[r.reason] = out.get(r.reason, 0) + 1
    return out


def _rtf(scored: list[dict], search_s: float, audio_s: float, wall: float, workers: int) -> dict:
    """Real-time factors per core (CPU seconds per audio second), and the speed-ups."""
    feat = sum(s["featurize_s"] for s in scored)
    fwd = sum(s["forward_s"] for s in scored)
    a = max(audio_s, 1e-9)
    return {"featurize_per_core": round(feat / a, 5), "forward_per_core": round(fwd / a, 5),
            "search_per_core": round(search_s / a, 5),
            "total_per_core": round((fwd + search_s) / a, 5),
            "x_real_time_per_core": round(a / max(fwd + search_s, 1e-9), 1),
            "wall_x_real_time": round(a / max(wall, 1e-9), 1), "workers": workers}


def _write_hyps(ctx: StepContext, rows: list[dict]) -> None:
    import json

    import pyarrow as pa

    ctx.storage.write_text(ctx.path("hyps.jsonl"), "".join(json.dumps(r) + "\n" for r in rows))
    ctx.storage.write_parquet(ctx.path("hyps.parquet"), pa.Table.from_pylist(rows))


def render(result: dict) -> str:
    lines = [f"{'condition':<10} {'words':>6} {'WER %':>7} {'SER %':>7} {'sub':>6} {'del':>6} {'ins':>6}"]
    for c, d in result["per_condition_detail"].items():
        lines.append(f"{c:<10} {d['ref_words']:>6} {100 * d['wer']:>7.2f} {100 * d['ser']:>7.2f} "
                     f"{100 * d['sub']:>6.2f} {100 * d['del']:>6.2f} {100 * d['ins']:>6.2f}")
    lines.append(f"{'all':<10} {result['ref_words']:>6} {100 * result['wer']:>7.2f} "
                 f"{100 * result['ser']:>7.2f} {100 * result['sub']:>6.2f} "
                 f"{100 * result['del']:>6.2f} {100 * result['ins']:>6.2f}")
    tuned = ", ".join(f"{r['acwt']}: {100 * r['wer']:.2f} %" for r in result["tuning"])
    lines.append(f"acwt {result['acwt']} (tuned on {result['tune_split'] or 'nothing'}: {tuned}); "
                 f"{result['rtf']['x_real_time_per_core']}x real time per core "
                 f"(model + search)")
    return "\n".join(lines)
