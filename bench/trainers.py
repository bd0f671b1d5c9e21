"""`amflow bench trainers`: every distributed algorithm against 1-worker SGD, Table-I style.

For each of 1-worker SGD, then sgd / gtc / bmuf / htm / ma with 4 and 8 workers, the real
per-worker training function (`training.loop.train_worker`, labeled recipe, the student
model of `config.model`) trains from the same initial model on the same labeled data for
the same number of passes over it (`train.epochs`), each run in its own gloo process group
of N local processes (`training.distributed.spawn_local`; on a 2-core machine 8 workers
are 8 processes time-sharing the cores, so frames/s here measure the algorithms'
overhead under contention, not GPU scaling: `amflow simulate` projects that).

Reported per run, as in Table I of the petabyte-scale paper: relative frame-accuracy
difference against 1-worker SGD (dev split when there is one, else the last training
pass), frames/s, bytes sent per worker per minibatch, compression against dense fp32
gradients (4 bytes x parameters per minibatch, what `sgd` sends), the GTC sent fraction,
communication seconds. The `measured` block of the output is what `amflow simulate` reads.

Data, in order of preference:
1. this run's `repartition/labeled` (+ `repartition/dev`, `features/cmvn.json`,
   `features/phones.json`);
2. the pipeline, when this checkout has the corpus step: `amflow corpus` (its own corpus
   under the bench dir, 2.5 h with 35 % of the speakers labeled by default), `select`,
   `features`, `repartition` (labeled and dev) for this run id (subprocesses, same config);
3. otherwise synthetic labeled speech-like features written in the training row format
   (phone-conditioned 64-d frames with speaker offsets and correlated noise, stacked 3 to
   192-d at 33 Hz, a bigram phone sequence so context matters), marked as such.
The labeled rows are re-split into partitions divisible by 4 and 8 workers under
`runs/<R>/bench/trainers/data/`.

Setup (the bench profile, `BENCH_PROFILE`; bench.profile=config keeps the config's
model/train keys, and any key given with --set wins): a 2 x 128 student (0.3 M
parameters), momentum SGD (0.9) as in the papers, lr 0.5 -> 0.05 exponentially over the
passes, 512 frames per worker minibatch, 30 passes (at 10 passes an 8-worker run makes
only ~250 updates on the 105k-frame embedded corpus and every method that is not
plain sgd trails by 1.5-3.4 %; at 30 passes the gaps are what remains at convergence,
bench/TRAINERS.md has both tables). As in the HTM paper (section 3.2:
"we used same pre-trained model for each experiment"), every method starts from one
model pre-trained with 1-worker SGD (bench.pretrain passes at the initial rate,
default 3); then every method, 1-worker SGD included, makes the same number of passes.
Sparse GTC updates need many minibatches to move an element (~tau/|g| of them), and
the first minibatches from a random model are the least tolerant of that.

Small data needs small blocks: with `train.block_size` minibatches per BMUF/HTM block and
`train.ma_samples` frames between MA averages, a worker that takes S minibatches per pass
would sync too rarely; the bench lowers block size and MA period to at most S/4 per pass
(printed; set bench.keep_sync=true to keep the config's values). The profile's BMUF/HTM
block is 3 minibatches: at 8 workers, 3 against 6 moved BMUF from -1.3 % to -0.6 % at the
same rate and let it take a larger one (still 3x fewer bytes than sgd at 8 workers).

Learning rate (bench.lr_rule=tuned, the default: each algorithm at the best rule
measured, see bench/TRAINERS.md; `lr_scale`; sgd/gtc found at 10 passes, bmuf/htm at 30
passes with blocks of 3):
- `sgd` averages gradients over N workers, an N-times larger minibatch: lr x N (linear),
  kept stable by Kaldi's max-change (`train.max_change` 2 in the profile; the cap is
  never reached by 1-worker SGD). Measured: x sqrt(N) -3.5 %, x N -0.5 %; x N without
  max-change diverged.
- `gtc`: lr x N, with momentum correction and a 60-minibatch tau warm-up (profile):
  measured at 8 workers -2.6 %; without the correction x N drops to -12 % and
  x sqrt(N) was the best rule (-6.1 %). The correction moves the momentum before the
  compression, so the large rate no longer amplifies GTC's delayed bursts.
- `bmuf`: lr x sqrt(2 N) with the local momentum reset after every block
  (`train.block_reset_momentum`): the reset keeps local momentum from building up
  within a short block; the block momentum (eta = 1 - 1/N from zeta / (N (1 - eta)) =
  C with zeta = C = 1) does the rest. Measured at 8 workers, blocks of 3, 30 passes:
  x2 -1.3 %, x3 -0.6 %, x4 +0.6 %, x6 -3.7 % (the edge of stability); at 4 workers
  x2 -1.6 %, x3 -0.7 %. (With blocks of 6 at 10 passes x4 was unstable.)
- `htm`: lr x N at 8 workers, x 1.5 N at 4 (`HTM_LR`; x N elsewhere): its groups
  average group_size gradients like sgd, then BMUF across the groups as above, with
  momentum correction in the groups. Measured at 8 workers (4 groups of 2), blocks of 3,
  30 passes: x3 -3.0 %, x4 -2.5 %, x6 -0.8 %, x8 -0.2 %; at 4 workers x4 -1.9 %,
  x6 -1.2 %.
- `ma` scales its own rate by N (Kaldi), so x 1 here.
bench.lr_rule=sqrt, linear or none applies that rule to sgd and gtc and x 1 to
the others (the previous bench's setting was sqrt).

Variants: `ma+ng` in bench.algos is ma with Kaldi's online natural gradient
(`train.natural_gradient`), at ma's rate.

Config (`--set bench.<key>=...`, core/config/serve.py BenchConfig): bench.workers (default
4,8), bench.algos (sgd,gtc,bmuf,htm,ma), bench.epochs (0: the profile's train.epochs),
bench.pretrain (3), bench.lr_rule, bench.profile (bench | config), bench.keep_sync,
bench.synth_seconds (1800), bench.corpus_hours (2.5), bench.labeled_share (0.35).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from core import records
from core.config import Config, TrainConfig, replace_train, with_overrides
from core.runs import StepError
from core.storage import join
from training.algorithms import ALGORITHMS
from training.data import SplitIndex, partition_uris
from training.distributed import spawn_local
from training.loop import train_worker
from training.models import resolve_num_classes
from training.plan import WorkerPlan

log = logging.getLogger(__name__)

SYNTH_PHONES = 40


# ---------------------------------------------------------------------------------------
# Data.
# ---------------------------------------------------------------------------------------

def synth_split(seconds: float, seed: int, speakers: int, split: str,
                phone_means: np.ndarray, trans: np.ndarray) -> tuple[list[dict], np.ndarray]:
    """Rows in the feature row format, and the stacked 192-d rows for CMVN stats."""
    rng = np.random.default_rng(seed)
    rows, stacked_all = [], []
    total, i = 0.0, 0
    spk_offset = rng.normal(0, 0.4, (speakers, phone_means.shape[1])).astype(np.float32)
    while total < seconds:
        spk = i % speakers
        n100 = int(rng.uniform(200, 600))
        labels100 = np.empty(n100, np.int64)
        t, ph = 0, int(rng.integers(1, SYNTH_PHONES))
        while t < n100:
            d = int(rng.integers(4, 16))
            labels100[t:t + d] = ph
            t += d
            ph = int(rng.choice(SYNTH_PHONES, p=trans[ph]))
        noise = rng.normal(0, 1.0, (n100, phone_means.shape[1])).astype(np.float32)
        for k in range(1, n100):  # AR(1): correlated noise across frames
            noise[k] += 0.6 * noise[k - 1]
        x = phone_means[labels100] + spk_offset[spk] + 0.8 * noise
        tr = n100 // 3
        stacked = x[: 3 * tr].reshape(tr, 3 * x.shape[1])
        lab = records.offset_labels(labels100, 0, 3, tr)
        row = {"utt_id": f"synth-{split}-{i:05d}", "speaker_id": f"sspk{spk:02d}",
               "split": split, "condition": "SYN", "shard": f"synth-{split}",
               **records.encode_feats(stacked, "float16"),
               "labels": records.encode_int16(lab),
               "frame_labels": records.encode_int16(labels100)}
        rows.append(row)
        stacked_all.append(stacked)
        total += n100 / 100.0
        i += 1
    return rows, np.concatenate(stacked_all)


def write_rows(ctx, uri: str, rows: list[dict]) -> None:
    ctx.storage.write_parquet(uri, records.to_table(rows, records.feature_schema("float16")))


def synth_data(ctx, out: str, seconds: float) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    means = rng.normal(0, 1.0, (SYNTH_PHONES, 64)).astype(np.float32)
    trans = rng.dirichlet(np.full(SYNTH_PHONES, 0.2), size=SYNTH_PHONES)  # peaky bigrams
    lab_rows, lab_x = synth_split(seconds, 1, 12, "labeled", means, trans)
    dev_rows, _ = synth_split(max(seconds / 8, 60), 2, 12, "dev", means, trans)
    write_rows(ctx, join(out, "labeled_all", "part-00000.parquet"), lab_rows)
    write_rows(ctx, join(out, "dev", "part-00000.parquet"), dev_rows)
    x = lab_x.astype(np.float64)
    cmvn = {"count": int(x.shape[0]), "sum": x.sum(0).tolist(), "sumsq": (x**2).sum(0).tolist()}
    return {"labeled": [join(out, "labeled_all", "part-00000.parquet")],
            "dev": [join(out, "dev", "part-00000.parquet")], "cmvn": cmvn,
            "phones": [f"p{i:02d}" for i in range(SYNTH_PHONES)], "source": "synthetic"}


def run_data(ctx) -> dict[str, Any] | None:
    st = ctx.storage
    lab = partition_uris(st, ctx.other("repartition", "labeled"))
    cmvn_uri = ctx.other("features", "cmvn.json")
    if not lab or not st.exists(cmvn_uri):
        return None
    phones_uri = ctx.other("features", "phones.json")
    return {"labeled": lab, "dev": partition_uris(st, ctx.other("repartition", "dev")),
            "cmvn": st.read_json(cmvn_uri),
            "phones": st.read_json(phones_uri) if st.exists(phones_uri) else [],
            "source": ctx.other("repartition")}


def pipeline_data(ctx, args) -> dict[str, Any] | None:
    """Build the labeled data with the pipeline steps (when this checkout has them):
    a corpus of its own under the bench dir (bench.corpus_hours, default 2.5 h, with
    bench.labeled_share, default 0.35, of the speakers labeled), then select, features
    and repartition of the labeled and dev splits for this run id."""
    if any(importlib.util.find_spec(f"tasks.{m}") is None
           for m in ("corpus", "select", "features", "repartition")):
        return None
    hours, share = ctx.cfg.bench.corpus_hours, ctx.cfg.bench.labeled_share
    corpus = ctx.path("trainers", "corpus")
    base = [sys.executable, "-m", "amflow.cli"]
    common: list[str] = []
    if getattr(args, "config", None):
        common += ["--config", args.config]
    for o in getattr(args, "overrides", []) or []:
        common += ["--set", o]
    common += ["--set", f"data.corpus={corpus}", "--set", f"corpus.hours={hours}",
               "--set", f"corpus.labeled_share={share}"]
    run = ["--run-id", ctx.run_id]
    steps = [["corpus", "--out", corpus, *common],
             ["select", *run, *common, "--set", f"select.hours={hours}",
              "--set", "select.splits=labeled,dev"],
             ["features", *run, *common],
             ["repartition", *run, *common, "--set", "repartition.splits=labeled,dev",
              "--set", "train.workers=8"]]
    for s in steps:
        log.info("bench trainers: building data: amflow %s", " ".join(s))
        p = subprocess.run(base + s, capture_output=True, text=True)
        if p.returncode != 0:
            tail = p.stderr.strip().splitlines()[-3:] if p.stderr else [str(p.returncode)]
            log.warning("bench trainers: `amflow %s` failed (%s); using synthetic data",
                        s[0], " | ".join(tail))
            return None
    return run_data(ctx)


def resplit(ctx, uris: list[str], out: str, parts: int) -> list[str]:
    """All rows of `uris` into `parts` partitions balanced by frames."""
    tables = [records.read_table(ctx.storage, u) for u in uris]
    t = pa.concat_tables(tables, promote_options="default")
    frames = t.column("num_frames").to_numpy()
    order = np.argsort(-frames, kind="stable")
    load = np.zeros(parts, np.int64)
    assign = [[] for _ in range(parts)]
    for i in order:
        j = int(np.argmin(load))
        assign[j].append(int(i))
        load[j] += frames[i]
    out_uris = []
    for j, idx in enumerate(assign):
        uri = join(out, f"part-{j:05d}.parquet")
        ctx.storage.write_parquet(uri, t.take(pa.array(sorted(idx), pa.int64())))
        out_uris.append(uri)
    return out_uris


# ---------------------------------------------------------------------------------------
# Runs.
# ---------------------------------------------------------------------------------------

def _train_rank(rank: int, world: int, plan: WorkerPlan) -> dict:
    out = train_worker(plan)
    return out if rank == 0 else {}


def dev_curve(ctx, train_dir: str) -> list[float]:
    """Dev frame accuracy after every pass (rank 0's model; the final value in the table
    is after `finalize()`, i.e. the averaged / global model)."""
    uri = join(train_dir, "metrics.jsonl")
    if not ctx.storage.exists(uri):
        return []
    recs = [json.loads(x) for x in ctx.storage.read_text(uri).splitlines() if x.strip()]
    return [round(r["frame_acc"], 4) for r in recs if r.get("kind") == "dev"]


def steps_per_pass(frames: int, workers: int, minibatch: int) -> int:
    return max(1, frames // workers // minibatch)


# The bench profile: a small student and the papers' local optimizer (momentum SGD with a
# decaying rate), so that the 11 trainings fit in well under 30 min on 2 cores.
# bench.profile=config uses the config's own model/train settings instead; a key
# given with --set always wins over the profile.
BENCH_PROFILE: dict[str, Any] = {
    "model.student.layers": 2, "model.student.hidden": 128,  # 0.3 M parameters
    "train.optimizer": "sgd", "train.momentum": 0.9, "train.schedule": "exponential",
    "train.lr": 0.5, "train.final_lr": 0.05, "train.minibatch_frames": 512,
    "train.epochs": 30, "train.finetune_epochs": 0, "train.block_size": 3,
    # GTC's operating point: tau = 20 x mean |g| per tensor sends ~0.5 % of the elements
    # per minibatch in this training (>= 100x fewer bytes, the papers' "couple of orders of
    # magnitude"); the config default 100 sends 0.03 % here (3000x) and leaves GTC far
    # behind after a few hundred minibatches. HTM's groups 10x denser: at 5 (4x, the
    # paper's 2 vs 8) HTM-8 was -0.15 % / -2.14 % on two shuffle seeds, at 2 -0.49 % / -0.79 %
    # (bench/TRAINERS.md); its bytes are dominated by the BMUF tier either way.
    "train.gtc_tau_scale": 20.0, "train.htm_tau_scale": 2.0,
    # GTC (and HTM's groups) with the momentum on the sender (momentum correction) and tau
    # ramped up over the first 60 minibatches: what lets GTC take lr x N (see `lr_scale`).
    "train.gtc_momentum_correction": True, "train.gtc_warmup": 60,
    # Kaldi's per-minibatch max-change (what lets sgd take lr x N; inactive at 1 worker)
    # and BMUF/HTM's local momentum reset after each block (see `lr_scale`).
    "train.max_change": 2.0, "train.block_reset_momentum": True,
}


# HTM's measured best multiple of N per worker count (module doc); x N where unmeasured.
HTM_LR = {4: 1.5, 8: 1.0}


def lr_scale(algo: str, workers: int, rule: str = "tuned") -> float:
    """The factor on the profile's learning rate for `algo` at `workers` (module doc)."""
    if workers <= 1:
        return 1.0
    if rule == "tuned":
        return {"sgd": float(workers), "gtc": float(workers),
                "bmuf": math.sqrt(2.0 * workers),
                "htm": HTM_LR.get(workers, 1.0) * workers}.get(algo, 1.0)
    if algo not in ("sgd", "gtc"):
        return 1.0
    return {"sqrt": math.sqrt(workers), "linear": float(workers), "none": 1.0}[rule]


VARIANTS = {"": {}, "ng": {"natural_gradient": True}}


def parse_algo(name: str) -> tuple[str, dict[str, Any]]:
    """`ma+ng` -> ("ma", {"natural_gradient": True}): the algorithm and its train.* extras."""
    algo, _, variant = name.partition("+")
    if algo not in ALGORITHMS or variant not in VARIANTS:
        raise StepError(f"bench.algos: unknown method {name!r} (algorithms: "
                        f"{', '.join(ALGORITHMS)}; variants: +ng)")
    if variant == "ng" and algo != "ma":
        raise StepError(f"bench.algos: {name!r}: natural gradient runs in ma only")
    return algo, VARIANTS[variant]


def bench_config(cfg: Config, args: Any) -> tuple[Config, dict[str, Any]]:
    """(the config with the bench profile applied, the profile keys applied); with
    bench.profile=config the config as it is. A key given with --set wins."""
    if cfg.bench.profile == "config":
        return cfg, {}
    given = {o.split("=", 1)[0].strip() for o in (getattr(args, "overrides", None) or [])}
    applied = {k: v for k, v in BENCH_PROFILE.items() if k not in given}
    return with_overrides(cfg, applied), applied


def _plan(ctx, cfg: Config, train: TrainConfig, train_dir: str, labeled: list[str],
          data: dict, num_classes: int, feat_dim: int, init_model: str | None) -> WorkerPlan:
    """One bench training's plan, its output dir emptied first."""
    for uri in ctx.storage.list(train_dir, recursive=True):
        ctx.storage.delete(uri)
    return WorkerPlan(cfg=dataclasses.replace(cfg, train=train), run_id=ctx.run_id,
                      train_dir=train_dir, kind="student",
                      splits={"labeled": labeled, "dev": data["dev"]}, cmvn=data["cmvn"],
                      phones=list(data["phones"]), num_classes=int(num_classes),
                      feat_dim=int(feat_dim), stack=ctx.cfg.features.stack,
                      init_model=init_model, progress=False)


@dataclass
class BenchData:
    """The labeled partitions every method trains on, and what they hold."""

    data: dict[str, Any]  # source, dev partitions, cmvn, phones
    labeled: list[str]  # re-split into a multiple of every worker count
    total_frames: int
    feat_dim: int
    num_classes: int


def _bench_data(ctx, args, parts: int) -> BenchData:
    bc = ctx.cfg.bench
    data = run_data(ctx) or pipeline_data(ctx, args)
    if data is None:
        data = synth_data(ctx, join(ctx.path("trainers"), "data"), bc.synth_seconds)
    labeled = resplit(ctx, data["labeled"], join(ctx.path("trainers"), "data", "labeled"), parts)
    index = SplitIndex.load(ctx.storage, labeled, "labels")
    if len(index) == 0:
        raise StepError(f"no usable labeled rows in {data['labeled']}")
    return BenchData(data, labeled, index.total_frames, index.feat_dim,
                     resolve_num_classes(ctx.cfg.model, data["phones"]))


def _pretrain(ctx, cfg0: Config, bd: BenchData, passes: int) -> tuple[str | None, Any]:
    """The shared starting point (the HTM paper, section 3.2: every method starts from the
    same model, pre-trained with 1-GPU SGD): `passes` of 1-worker SGD at the initial rate.
    (its model.pt URI or None, its dev frame accuracy)."""
    if passes <= 0:
        return None, None
    tc0 = cfg0.train
    train = replace_train(tc0, algorithm="sgd", workers=1, epochs=passes, finetune_epochs=0,
                          final_lr=tc0.optim.lr, checkpoint_every=10**9, threads=1,
                          model="student", recipe="labeled", tag="bench-pretrain")
    pdir = join(ctx.path("trainers"), "pretrain")
    plan = _plan(ctx, cfg0, train, pdir, bd.labeled, bd.data, bd.num_classes, bd.feat_dim,
                 None)
    log.info("bench trainers: pre-training (%d passes of 1-worker SGD)", passes)
    out = spawn_local(_train_rank, 1, plan, timeout=7200)[0]
    acc = out["metrics"].get("dev_frame_acc")
    print(f"pretrain acc {acc} ({passes} passes)", flush=True)
    return join(pdir, "model.pt"), acc


def _train_method(ctx, cfg0: Config, bd: BenchData, method: str, n: int, epochs: int,
                  init_model: str | None) -> dict[str, Any]:
    """One method at `n` workers from the shared model: its metrics and settings."""
    bc, tc0 = ctx.cfg.bench, cfg0.train
    name = f"{method}-{n}"
    algo, extras = parse_algo(method)
    mb = tc0.batches.minibatch_frames
    spp = steps_per_pass(bd.total_frames, n, mb)
    block, ma_samples = tc0.algo.block_size, tc0.algo.ma_samples
    if not bc.keep_sync:
        block = max(1, min(block, spp // 4))
        ma_samples = max(mb, min(ma_samples, (spp // 4) * mb))
    scale = lr_scale(algo, n, bc.lr_rule)
    train = replace_train(tc0, **extras, lr=tc0.optim.lr * scale,
                          final_lr=tc0.optim.final_lr * scale, algorithm=algo, workers=n,
                          epochs=epochs, block_size=block, ma_samples=ma_samples,
                          group_size=min(tc0.algo.group_size, n), checkpoint_every=10**9,
                          threads=1, model="student", recipe="labeled", tag=f"bench-{name}")
    train_dir = join(ctx.path("trainers"), name)
    plan = _plan(ctx, cfg0, train, train_dir, bd.labeled, bd.data, bd.num_classes,
                 bd.feat_dim, init_model)
    log.info("bench trainers: %s (%d workers, block %d, ma period %d frames)", name, n,
             block, ma_samples)
    t0 = time.time()
    m = spawn_local(_train_rank, n, plan, timeout=7200)[0]["metrics"]
    print(f"{name:8s} acc {m.get('dev_frame_acc', m.get('final_train_frame_acc'))} "
          f"frames/s {m.get('frames_per_s')} bytes/step {m.get('algo_bytes_per_step')}",
          flush=True)
    # after the metrics: their "algorithm" is the bare one ("ma" for "ma+ng")
    return {"workers": n, "wall_s": round(time.time() - t0, 1), "block_size": block,
            "ma_samples": ma_samples, "lr": train.optim.lr,
            "dev_curve": dev_curve(ctx, train_dir), **m, "algorithm": method}


def _table(results: dict[str, Any]) -> tuple[list[dict[str, Any]], str, int]:
    """(Table-I rows against 1-worker SGD, the accuracy metric, parameters)."""
    base_m = results["sgd-1"]
    acc_key = "dev_frame_acc" if base_m.get("dev_frame_acc") is not None else \
        "final_train_frame_acc"
    params = int(base_m["parameters"])
    dense = 4.0 * params
    table = []
    for r in results.values():
        acc = r.get(acc_key)
        rel = 100.0 * (acc - base_m[acc_key]) / base_m[acc_key] if acc is not None else None
        bps = float(r.get("algo_bytes_per_step") or 0.0)
        table.append({
            "method": r["algorithm"], "workers": r["workers"], "frame_acc": acc,
            "rel_frame_acc_pct": None if rel is None else round(rel, 2),
            "frames_per_s": r.get("frames_per_s"),
            "speedup_vs_sgd1": round(r["frames_per_s"] / base_m["frames_per_s"], 2)
            if base_m.get("frames_per_s") else None,
            "bytes_per_worker_per_minibatch": round(bps, 1),
            "compression_vs_dense": round(dense / bps, 1) if bps else None,
            "sent_fraction": r.get("algo_sent_fraction"),
            "comm_s": r.get("algo_comm_seconds"), "steps": r.get("steps"),
            "block_size": r["block_size"] if r["algorithm"] in ("bmuf", "htm") else None})
    return table, acc_key, params


def _measured(results: dict[str, Any], algos: list[str], top: int, params: int, mb: int
              ) -> dict[str, Any]:
    """What `amflow simulate` reads: each method's algorithm stats at the most workers."""
    measured = {"params_measured": params, "minibatch_frames": mb,
                "compute_s_per_minibatch": results["sgd-1"].get("compute_s_per_minibatch"),
                "algorithms": {}}
    for algo in algos:
        r = results.get(f"{algo}-{top}")
        if r is None:
            continue
        st = {k[len("algo_"):]: v for k, v in r.items() if k.startswith("algo_")}
        st["workers"] = top
        measured["algorithms"][algo] = st
    return measured


def _markdown(table: list[dict[str, Any]], head: str) -> str:
    lines = [head, "",
             "| Method | Workers | frame acc. | Rel. frame acc. (%) | frames/s | speedup "
             "| bytes/worker/minibatch | compression vs dense | sent fraction |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in table:
        sf = row["sent_fraction"]
        fa = row["frame_acc"]
        lines.append(f"| {row['method'].upper()} | {row['workers']} | "
                     f"{'' if fa is None else f'{fa:.4f}'} | {row['rel_frame_acc_pct']} | "
                     f"{row['frames_per_s']} | {row['speedup_vs_sgd1']} | "
                     f"{row['bytes_per_worker_per_minibatch']:.0f} | "
                     f"{row['compression_vs_dense']} | "
                     f"{'' if sf is None else f'{sf * 100:.3f} %'} |")
    return "\n".join(lines) + "\n"


def run(ctx, args) -> dict[str, Any]:
    bc = ctx.cfg.bench
    cfg0, profile = bench_config(ctx.cfg, args)
    tc0 = cfg0.train
    workers_list, algos = list(bc.workers), list(bc.algos)
    for a in ("sgd", *algos):  # sgd: the 1-worker reference; a bad name fails up front
        parse_algo(a)
    epochs = bc.epochs or tc0.passes.epochs
    mb = tc0.batches.minibatch_frames
    bd = _bench_data(ctx, args, math.lcm(*workers_list))
    t_all = time.time()
    if profile:
        log.info("bench trainers: profile %s", profile)
    # Every method, 1-worker SGD included, trains `epochs` passes from the shared model.
    init_model, pretrain_acc = _pretrain(ctx, cfg0, bd, bc.pretrain)
    runs = [("sgd", 1)] + [(a, n) for n in workers_list for a in algos]
    results = {f"{m}-{n}": _train_method(ctx, cfg0, bd, m, n, epochs, init_model)
               for m, n in runs}
    table, acc_key, params = _table(results)
    top = max(workers_list)
    measured = _measured(results, algos, top, params, mb)
    setup = (f"{bc.pretrain} passes of 1-worker SGD pre-training shared by every method, "
             "then " if bc.pretrain > 0 else "")
    scales = ", ".join(f"{a} x{lr_scale(parse_algo(a)[0], top, bc.lr_rule):g}" for a in algos)
    student = cfg0.model.student
    head = (f"Trainers on {bd.data['source']} ({bd.total_frames} labeled frames; {setup}"
            f"{epochs} passes each; {params} parameters, student "
            f"{student.layers}x{student.hidden}, {tc0.optim.optimizer} lr "
            f"{tc0.optim.lr:g} -> {tc0.optim.final_lr:g} (x {bc.lr_rule} rule: {scales}"
            f" at {top} workers), minibatch {mb} frames per worker; accuracy = {acc_key}"
            + (f", {pretrain_acc:.4f} after pre-training" if pretrain_acc else "") + "):")
    md = _markdown(table, head)
    ctx.storage.write_text(ctx.path("trainers.md"), md)
    print(md)
    at_top = [r["rel_frame_acc_pct"] for r in table
              if r["workers"] == top and r["rel_frame_acc_pct"] is not None]
    worst = max((abs(v) for v in at_top), default=None)
    return {"data": bd.data["source"], "labeled_frames": bd.total_frames, "epochs": epochs,
            "pretrain_passes": bc.pretrain, "pretrain_dev_frame_acc": pretrain_acc,
            "profile": profile,
            "parameters": params, "accuracy_metric": acc_key, "table": table,
            "runs": results, "measured": measured, "table_md": ctx.path("trainers.md"),
            "max_abs_rel_frame_acc_pct_at_8": worst,
            "min_rel_frame_acc_pct_at_8": min(at_top, default=None),
            "within_1pct_at_8": None if not at_top else all(v >= -1.0 for v in at_top),
            "wall_s": round(time.time() - t_all, 1)}
