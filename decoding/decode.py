"""The decode library behind `amflow decode` (the step: amflow/steps/decode.py; the
decoder's inputs: decoding/assets.py): a model to words on a corpus split; WER per condition.

    amflow decode --model M [--data CORPUS] [--split test] [--out FILE] --run-id R

Reads   --model   model.pt (default: runs/<R>/train[-<decode.tag>]/model.pt): CMVN, phone
                  list, features config and class priors (counted from the training
                  targets; for an older model file, from its run's training partitions)
        --data    a corpus in the input format (default data.corpus): transcripts (`text`)
                  and audio of the records of --split and of decode.tune_split
        data.lexicon (default <corpus>/lexicon.txt) and decode.lm (default runs/<R>/lm/
                  lm.arpa, written by `amflow lm --run-id R`; a clear error when missing)
Writes  --out     JSON (default runs/<R>/decode[-<tag>]/result.json): wer, ser, sub/del/ins,
                  per_condition {DP1..: WER}, per_condition_ser, acwt (tuned on
                  decode.tune_split), tuning [{acwt, wer}], rtf, oov, rejected, graph
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

import json
import logging
import time
from collections import defaultdict
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from core.config import Config, DecodeConfig, StorageConfig
from core.model_card import ModelCard
from core.progress import Progress
from core.outcomes import Reject, StepError
from core.storage import Storage, join
from decoding import wer as W
from decoding.batching import batched
from decoding.graph import read_graph
from decoding.lexicon import Lexicon, words_of
from decoding.search import Searcher, acoustic_scores
from tasks.select import records_of_split

log = logging.getLogger(__name__)


# ----------------------------------------------------------------- the worker (a Ray actor)
class DecodeWorker:
    """Holds one model and one graph; featurises, scores and searches shards."""

    def __init__(self, model_bytes: bytes, graph_dir: str, log_prior: np.ndarray,
                 corpus: str, storage_cfg: StorageConfig, beam: float, max_active: int,
                 threads: int = 1, gate: Any = None):
        """`gate`: decode_gate's (None: every frame is recognised)."""
        # torch (and what imports it) is deferred in this module: the driver imports it
        # for the pool, the actors load it when they start
        import torch

        from training.checkpoint import card_from_bytes

        torch.set_num_threads(threads)
        self.model, self.card = card_from_bytes(model_bytes)
        self.searcher = Searcher(read_graph(graph_dir), beam, max_active)
        self.log_prior = np.asarray(log_prior, np.float32)
        self.corpus = corpus
        self.storage = Storage(storage_cfg)
        self.gate = gate

    def score(self, records: list) -> dict:
        """Featurise a shard (one or more speakers' streams) and run the model."""
        t0 = time.perf_counter()
        feats, rejects, audio_s = featurize(self.storage, self.corpus, records, self.card,
                                            self.gate)
        t1 = time.perf_counter()
        out = list(zip([r for r, _ in feats], with_rows(
            lambda xs: log_posteriors(self.model, xs), [x for _, x in feats])))
        return {"utts": out, "rejects": rejects, "audio_s": audio_s,
                "featurize_s": t1 - t0, "forward_s": time.perf_counter() - t1}

    def search(self, utts: list, acwt: float) -> dict:
        t0 = time.perf_counter()
        hyps = []
        for rec, log_post in utts:
            if log_post is None:  # the speech gate kept no row: no words
                hyps.append((rec, [], True))
                continue
            words, _, final = self.searcher.best_words(
                acoustic_scores(log_post, self.log_prior, acwt))
            hyps.append((rec, words, final))
        return {"hyps": hyps, "search_s": time.perf_counter() - t0,
                "frames": sum(len(lp) for _, lp in utts if lp is not None)}


def with_rows(forward: Any, feats: Sequence[np.ndarray]) -> list:
    """forward(feats with rows) per utterance, None for one with no rows (the speech gate
    kept none: decode.speech_gate); a model cannot run on no rows."""
    idx = [i for i, x in enumerate(feats) if len(x)]
    out: list = [None] * len(feats)
    for i, y in zip(idx, forward([feats[i] for i in idx]) if idx else []):
        out[i] = y
    return out


def decode_gate(cfg: Config) -> Any:
    """decode.speech_gate: the gate `amflow serve` applies (serve.speech_*), else None."""
    from tasks.speech_activity import settings_of

    return settings_of(cfg.serve) if cfg.decode.speech_gate else None


def log_posteriors(model, feats: Sequence[np.ndarray], batch_frames: int = 20000
                   ) -> list[np.ndarray]:
    """Log posteriors per utterance; length-sorted padded batches (the models take
    lengths, so padding never reaches a real frame's output)."""
    import torch

    def forward(x: np.ndarray, lens: np.ndarray) -> list[np.ndarray]:
        with torch.no_grad():
            y = torch.log_softmax(model(torch.from_numpy(x), torch.from_numpy(lens)).float(),
                                  -1).numpy()
        return [y[j, :n] for j, n in enumerate(lens)]

    return batched(feats, forward, batch_frames)


def featurize(storage, corpus: str, records: Sequence, card: ModelCard, gate: Any = None):
    """Features per record exactly as evaluate computes them; (rec, feats) and rejects.
    `gate`: tasks.features.featurize_records's (no-speech records: no rows)."""
    from core.config import FeaturesConfig
    from tasks.fbank import FbankComputer
    from tasks.features import featurize_records
    from training.data import Normalizer
    from training.loop import dataclass_from_dict

    fcfg = dataclass_from_dict(FeaturesConfig, card.features)
    norm = Normalizer.from_stats(card.cmvn, card.input_dim)
    out, rejects, audio_s = [], [], 0.0
    for r, wave, x in featurize_records(storage, corpus, records, fcfg, FbankComputer(fcfg),
                                        rejects, gate=gate):
        audio_s += len(wave) / fcfg.sample_rate
        out.append((r, norm(x).astype(np.float32)))
    return out, rejects, audio_s


# ----------------------------------------------------------------- inputs
def split_records(storage: Storage, corpus: str, split: str) -> tuple[list, list[Reject]]:
    """Records of `split` with a transcript; the rest rejected with the reason."""
    recs, _ = records_of_split(storage, corpus, split)  # malformed lines: no split
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
def _workers_that_fit(wanted: int, resources: dict) -> int:
    """decode.workers capped at the cluster's CPUs: ActorPool hands a shard to every actor
    at once, and an actor that can never be placed would hold its shard forever."""
    cpus = int(resources.get("CPU", 0))
    if cpus < 1:
        raise StepError("the Ray cluster has no CPU for decode workers (ray.num_cpus / ray.address)")
    if wanted > cpus:
        log.warning("decode.workers=%d but the Ray cluster has %d CPUs: using %d workers",
                    wanted, cpus, cpus)
    return min(wanted, cpus)


class Pool:
    """decode.workers DecodeWorker actors (or `worker`, a subclass) behind
    ray.util.ActorPool; a worker of another kind (decoding/ctc_decode.py's) with the same
    score / search methods takes `worker_args` after the model's bytes.
    `inline` (a split below ray.inline_hours of audio: `inline_for`): one worker in this
    process, the shards one after another, with the threads a Ray task has
    (ray.worker_threads): the same arithmetic, so the same words, without a Ray or an actor
    to start for a few minutes of audio."""

    def __init__(self, cfg: Config, model_bytes: bytes, graph_dir: str,
                 log_prior: np.ndarray | None, corpus: str, worker: type = DecodeWorker,
                 worker_args: tuple | None = None, inline: bool = False):
        dc = cfg.decode
        self.cfg = cfg
        args = worker_args if worker_args is not None else (
            graph_dir, log_prior, corpus, cfg.storage, dc.beam, dc.max_active, 1,
            decode_gate(cfg))
        self.local = None
        if inline:
            from core.raycluster import worker_threads

            with worker_threads(cfg):
                self.local, self.workers = worker(model_bytes, *args), 1
            return
        import ray
        from ray.util import ActorPool

        from core.raycluster import init_ray

        init_ray(cfg)
        self.workers = _workers_that_fit(dc.workers, ray.cluster_resources())
        actor = ray.remote(num_cpus=1, **_pool_resources(cfg))(worker)
        model_ref = ray.put(model_bytes)
        self.actors = [actor.remote(model_ref, *args) for _ in range(self.workers)]
        self.pool = ActorPool(self.actors)

    def results(self, method: str, items: list, args: Callable[[Any], tuple] = lambda x: (x,)):
        """The worker method's result for each of `items` (its arguments: `args(item)`), in
        any order on Ray."""
        if self.local is None:
            yield from self.pool.map_unordered(
                lambda a, x: getattr(a, method).remote(*args(x)), items)
            return
        from core.raycluster import worker_threads

        for item in items:
            with worker_threads(self.cfg):
                yield getattr(self.local, method)(*args(item))

    def score(self, shards: list[list], desc: str) -> list[dict]:
        prog = Progress(sum(len(s) for s in shards), desc=desc, unit="utts", interval_s=10)
        out = []
        for res in self.results("score", shards):
            out.append(res)
            prog.update(len(res["utts"]) + len(res["rejects"]))
        prog.close()
        return out

    def search(self, scored: list[dict], acwt: Any, desc: str) -> tuple[list, float, int]:
        """Hyps of every scored utterance; `acwt` is what the workers' search takes (the
        hybrid's acoustic scale, a CTC worker's setting)."""
        prog = Progress(sum(len(s["utts"]) for s in scored), desc=desc, unit="utts",
                        interval_s=10)
        hyps, search_s, frames = [], 0.0, 0
        jobs = [s["utts"] for s in scored if s["utts"]]
        for res in self.results("search", jobs, lambda u: (u, acwt)):
            hyps += res["hyps"]
            search_s += res["search_s"]
            frames += res["frames"]
            prog.update(len(res["hyps"]))
        prog.close()
        return hyps, search_s, frames


def inline_for(cfg: Config, storage: Storage, corpus: str, records: Sequence,
               other_splits: Sequence[str] = ()) -> bool:
    """Whether a decode of `records` (and of `other_splits`, e.g. the tuning split) is
    below ray.inline_hours of audio: its Pool then runs in the step's process."""
    from core.raycluster import runs_inline

    if cfg.ray.inline_hours <= 0:
        return False
    seconds = sum(r.duration for r in records)
    for split in other_splits:
        seconds += sum(r.duration for r in split_records(storage, corpus, split)[0])
    return runs_inline(cfg, seconds / 3600)


def _pool_resources(cfg: Config) -> dict:
    res = cfg.ray.step_resources.get("decode") or {}
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


# ----------------------------------------------------------------- tuning, reporting
def tune_acwt(dc: DecodeConfig, storage: Storage, pool: Pool, corpus: str, lex: Lexicon
              ) -> tuple[list[dict], float]:
    """WER on decode.tune_split for each decode.acwt; the best scale (first on ties)."""
    if not dc.tune_split or len(dc.acwt) == 1:
        return [], dc.acwt[0]
    try:
        recs, _ = split_records(storage, corpus, dc.tune_split)
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
    warn_grid_edge(rows, best["acwt"], dc.tune_split)
    return rows, best["acwt"]


def warn_grid_edge(rows: list[dict], best: float, split: str) -> str:
    """A best acwt at the smallest or largest of decode.acwt (the WER still falling there)
    may have a better one beyond the grid: a WARNING with the numbers; the edge or ""."""
    grid = sorted(r["acwt"] for r in rows)
    if len(grid) < 2 or len({r["wer"] for r in rows}) == 1 or grid[0] < best < grid[-1]:
        return ""
    edge, beyond = ("lowest", best / 1.5) if best == grid[0] else ("highest", best * 1.5)
    wer = {r["acwt"]: r["wer"] for r in rows}
    log.warning("decode: acwt %s (WER %.2f %% on %s) is the %s of decode.acwt %s (next: "
                "%.2f %%): the best scale may lie beyond the grid; add e.g. %.3g to "
                "decode.acwt", best, 100 * wer[best], split, edge, grid,
                100 * wer[grid[1] if edge == "lowest" else grid[-2]], beyond)
    return edge


def reasons(rejects: list[Reject]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rejects:
        out[r.reason] = out.get(r.reason, 0) + 1
    return out


def step_metrics(result: dict, scored: list[dict], frames: int, **extra: Any) -> dict:
    """A decode step's metrics (its summary, the Airflow XCom and asset event) from its
    result.json body, the same for every model kind: WER with its CI, SER, per condition,
    speed; `extra`: the kind's tuned scales."""
    return {"wer": result["wer"], "wer_ci95": result["wer_ci95"], "ser": result["ser"],
            "per_condition_wer": result["per_condition"],
            "per_condition": result["per_condition"], **extra,
            "rtf_per_core": result["rtf"]["total_per_core"], "oov_rate": result["oov"]["rate"],
            "frames": frames, "forward_s": round(sum(s["forward_s"] for s in scored), 2)}


def rtf(scored: list[dict], search_s: float, audio_s: float, wall: float, workers: int) -> dict:
    """Real-time factors per core (CPU seconds per audio second), and the speed-ups."""
    feat = sum(s["featurize_s"] for s in scored)
    fwd = sum(s["forward_s"] for s in scored)
    a = max(audio_s, 1e-9)
    return {"featurize_per_core": round(feat / a, 5), "forward_per_core": round(fwd / a, 5),
            "search_per_core": round(search_s / a, 5),
            "total_per_core": round((fwd + search_s) / a, 5),
            "x_real_time_per_core": round(a / max(fwd + search_s, 1e-9), 1),
            "wall_x_real_time": round(a / max(wall, 1e-9), 1), "workers": workers}


def write_hyps(storage: Storage, out_uri: str, rows: list[dict]) -> None:
    """The hypotheses, one row per utterance, as `out_uri`/hyps.jsonl and hyps.parquet."""
    storage.write_text(join(out_uri, "hyps.jsonl"), "".join(json.dumps(r) + "\n" for r in rows))
    storage.write_parquet(join(out_uri, "hyps.parquet"), pa.Table.from_pylist(rows))


def _blank(setting: dict) -> str:
    """A CTC search's blank penalty beside its acwt (decoding/ctc_decode.py)."""
    return f" blank {setting['blank_penalty']}" if "blank_penalty" in setting else ""


def render(result: dict) -> str:
    lines = [f"{'condition':<10} {'words':>6} {'WER %':>7} {'SER %':>7} {'sub':>6} {'del':>6} {'ins':>6}"]
    for c, d in result["per_condition_detail"].items():
        lines.append(f"{c:<10} {d['ref_words']:>6} {100 * d['wer']:>7.2f} {100 * d['ser']:>7.2f} "
                     f"{100 * d['sub']:>6.2f} {100 * d['del']:>6.2f} {100 * d['ins']:>6.2f}")
    lines.append(f"{'all':<10} {result['ref_words']:>6} {100 * result['wer']:>7.2f} "
                 f"{100 * result['ser']:>7.2f} {100 * result['sub']:>6.2f} "
                 f"{100 * result['del']:>6.2f} {100 * result['ins']:>6.2f}")
    tuned = ", ".join(f"{r['acwt']}{_blank(r)}: {100 * r['wer']:.2f} %"
                      for r in result["tuning"])
    lines.append(f"acwt {result['acwt']}{_blank(result)} (tuned on {result['tune_split'] or 'nothing'}: {tuned}); "
                 f"{result['rtf']['x_real_time_per_core']}x real time per core "
                 f"(model + search)")
    return "\n".join(lines)
