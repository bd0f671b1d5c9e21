"""`amflow bench features`: our features step core vs lhotse, one core each, side by side.

Competitors, each in its own process (spawned from this one, pinned to one core when the
machine has enough, BLAS/torch threads = 1), started together behind a barrier so they
see the same machine load:

  ours    tasks.features.process_shard on one shard holding all the bench utterances:
          read + decode WAV, batched numpy fbank, causal CMN, LFR, uint8/fp16 encoding,
          CMVN stats, Parquet write (the whole per-shard work of `amflow features`)
  lhotse  CutSet.compute_and_store_features with a 64-bin lhotse `Fbank` (num_jobs=1,
          its default lilcom storage) over the same files

then, as the ceiling reference, the bare kernels on samples already in memory (no I/O):
kaldi-native-fbank per utterance and our FbankComputer. Each figure is audio seconds per
wall second (x real time), best of `AMFLOW_BENCH_REPEATS` (3) timed runs after a warm-up.

Audio: the utterances of `data.corpus` when it has metadata (up to AMFLOW_BENCH_SECONDS,
default 1200 s), else that much synthetic speech-like audio (harmonics + noise, 2-8 s
utterances, 10 speakers) written as 16-bit WAV under the bench run directory.
"""
from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
               "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


# --------------------------------------------------------------------------- audio
def _synth(dir_: Path, seconds: float, seed: int = 0) -> list[dict]:
    import soundfile as sf

    rng = np.random.default_rng(seed)
    out, total, i = [], 0.0, 0
    while total < seconds:
        spk = f"bspk{i % 10:02d}"
        dur = float(rng.uniform(2.0, 8.0))
        n = int(dur * 16000)
        t = np.arange(n) / 16000
        f0 = rng.uniform(90, 250)
        x = 0.02 * rng.standard_normal(n)
        for h in range(1, 10):
            x += (0.12 / h) * np.sin(2 * np.pi * f0 * h * t + rng.uniform(0, 6.28))
        x *= 0.3 + np.abs(np.sin(2 * np.pi * rng.uniform(1, 4) * t))
        path = dir_ / spk / f"{spk}_{i:05d}.wav"
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(path, np.clip(x, -1, 1), 16000, subtype="PCM_16")
        out.append({"utt_id": path.stem, "speaker_id": spk, "duration": n / 16000,
                    "path": str(path)})
        total += n / 16000
        i += 1
    return out


def _corpus_audio(cfg, seconds: float) -> list[dict]:
    """Local corpus utterances (the lhotse side needs local files), up to `seconds`."""
    from amflow.storage import Storage
    from tasks.audio import resolve_uri
    from tasks.select import MetadataError, metadata_files, parse_metadata_line

    st = Storage(cfg.storage)
    corpus = cfg.data.corpus
    if st.local_path(corpus) is None:
        return []
    out, total = [], 0.0
    for uri in metadata_files(st, corpus):
        for line in st.read_text(uri).splitlines():
            try:
                rec = parse_metadata_line(line)
            except MetadataError:
                continue
            path = st.local_path(resolve_uri(corpus, rec.audio_uri))
            if path and os.path.exists(path):
                out.append({"utt_id": rec.utt_id, "speaker_id": rec.speaker_id,
                            "duration": rec.duration, "path": path})
                total += rec.duration
            if total >= seconds:
                return out
    return out


# --------------------------------------------------------------------------- workers
def _pin(core: int | None) -> None:
    if core is not None and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {core})
        except OSError:
            pass


def _time_best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _worker_ours(cfg_dict: dict, utts: list[dict], work: str, repeats: int, core,
                 barrier, queue) -> None:
    _pin(core)
    import pyarrow as pa

    from amflow.config import load_config
    from amflow.runs import StepContext
    from tasks.features import process_shard
    from tasks.select import MANIFEST_SCHEMA

    cfg = load_config(None, [f"storage.root={work}/ours", "features.io_threads=1",
                             f"features.storage_dtype={cfg_dict['storage_dtype']}"])
    ctx = StepContext(cfg, "bench", "features")
    rows = sorted(utts, key=lambda u: (u["speaker_id"], u["utt_id"]))
    man = pa.table({
        "shard": ["bench"] * len(rows), "split": ["unlabeled"] * len(rows),
        "utt_id": [u["utt_id"] for u in rows], "speaker_id": [u["speaker_id"] for u in rows],
        "duration": [u["duration"] for u in rows],
        "created_at": ["2024-01-01T00:00:00Z"] * len(rows),
        "created_ts": [float(i) for i in range(len(rows))], "locale": ["en-US"] * len(rows),
        "condition": [""] * len(rows), "text": [""] * len(rows),
        "audio_uri": [u["path"] for u in rows]}, schema=MANIFEST_SCHEMA)
    ctx.storage.write_parquet(f"{work}/ours/manifest.parquet", man)
    ctx.storage.write_parquet(f"{work}/ours/warm.parquet", man.slice(0, 3))
    payload = {"manifest": f"{work}/ours/manifest.parquet", "split": "unlabeled"}
    process_shard(ctx, "warm", dict(payload, manifest=f"{work}/ours/warm.parquet"))
    barrier.wait()
    stats: dict = {}

    def once() -> None:
        stats.update(process_shard(ctx, "bench", payload))

    best = _time_best(once, repeats)
    queue.put(("ours", best, {"out": stats["out"], "bytes": stats["bytes"],
                              "audio_s": stats["audio_s"]}))


def _worker_lhotse(cfg_dict: dict, utts: list[dict], work: str, repeats: int, core,
                   barrier, queue) -> None:
    _pin(core)
    import logging as lg

    import torch

    torch.set_num_threads(1)
    lg.getLogger("lhotse").setLevel(lg.ERROR)
    from lhotse import CutSet, Fbank, FbankConfig, Recording, RecordingSet

    recs = RecordingSet.from_recordings(
        Recording.from_file(u["path"], recording_id=u["utt_id"]) for u in utts)
    cuts = CutSet.from_manifests(recordings=recs)
    extractor = Fbank(FbankConfig(num_mel_bins=64))
    warm = CutSet.from_cuts(list(cuts)[:3])
    warm.compute_and_store_features(extractor, storage_path=f"{work}/lhotse-warm", num_jobs=1,
                                    progress_bar=False)
    barrier.wait()
    runs = iter(range(1000))

    def once() -> None:
        out = f"{work}/lhotse-{next(runs)}"
        cuts.compute_and_store_features(extractor, storage_path=out, num_jobs=1,
                                        progress_bar=False)

    best = _time_best(once, repeats)
    size = sum(f.stat().st_size for f in Path(f"{work}/lhotse-0").rglob("*") if f.is_file())
    queue.put(("lhotse", best, {"bytes": size}))


def _worker_kernels(cfg_dict: dict, utts: list[dict], work: str, repeats: int, core,
                    barrier, queue) -> None:
    _pin(core)
    import soundfile as sf

    from amflow.config import FeaturesConfig
    from tasks.fbank import FbankComputer, kaldi_fbank, kaldi_options

    fcfg = FeaturesConfig()
    waves = [sf.read(u["path"], dtype="float32")[0] for u in utts]
    opts = kaldi_options(fcfg)
    comp = FbankComputer(fcfg)
    comp.compute(waves[:3])
    kaldi_fbank(waves[0], fcfg, opts)
    barrier.wait()
    t_knf = _time_best(lambda: [kaldi_fbank(w, fcfg, opts) for w in waves], repeats)
    t_np = _time_best(lambda: comp.compute(waves), repeats)
    queue.put(("kernels", t_knf, {"numpy_s": t_np}))


def _race(targets: list, args: tuple, cores: list) -> dict[str, tuple[float, dict]]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(targets))
    queue = ctx.Queue()
    procs = [ctx.Process(target=t, args=(*args, core, barrier, queue))
             for t, core in zip(targets, cores)]
    for p in procs:
        p.start()
    out = {}
    for _ in procs:
        name, secs, extra = queue.get(timeout=3600)
        out[name] = (secs, extra)
    for p in procs:
        p.join()
        if p.exitcode:
            raise RuntimeError(f"bench worker {p.name} exited with {p.exitcode}")
    return out


# --------------------------------------------------------------------------- entry
def run(ctx, args) -> dict[str, Any]:
    cfg = ctx.cfg
    seconds = float(os.environ.get("AMFLOW_BENCH_SECONDS", "1200"))
    repeats = int(os.environ.get("AMFLOW_BENCH_REPEATS", "3"))
    work = tempfile.mkdtemp(prefix="amflow-bench-")
    try:
        utts = _corpus_audio(cfg, seconds)
        source = cfg.data.corpus
        if sum(u["duration"] for u in utts) < min(seconds, 60.0):
            utts = _synth(Path(work) / "audio", seconds)
            source = "synthetic"
        audio_s = float(sum(u["duration"] for u in utts))
        old = {v: os.environ.get(v) for v in THREAD_VARS}
        os.environ.update({v: "1" for v in THREAD_VARS})
        try:
            ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
            cores = sorted(os.sched_getaffinity(0))[:2] if ncpu >= 2 else [None, None]
            wargs = ({"storage_dtype": cfg.features.storage_dtype}, utts, work, repeats)
            race = _race([_worker_ours, _worker_lhotse], wargs, cores)
            kern = _race([_worker_kernels], wargs, cores[:1])
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ours_s, ours_x = race["ours"]
    lh_s, lh_x = race["lhotse"]
    knf_s, kx = kern["kernels"]
    result = {
        "audio_seconds": round(audio_s, 2), "utterances": len(utts), "source": source,
        "repeats": repeats,
        "ours_xrt": round(audio_s / ours_s, 1),
        "lhotse_xrt": round(audio_s / lh_s, 1),
        "ratio_vs_lhotse": round(lh_s / ours_s, 3),
        "kaldi_native_fbank_kernel_xrt": round(audio_s / knf_s, 1),
        "numpy_fbank_kernel_xrt": round(audio_s / kx["numpy_s"], 1),
        "ours_mb_per_audio_hour": round(ours_x["bytes"] / 1e6 / (audio_s / 3600), 2),
        "lhotse_mb_per_audio_hour": round(lh_x["bytes"] / 1e6 / (audio_s / 3600), 2),
        "storage_dtype": cfg.features.storage_dtype,
        "goal": ">= 1.5x lhotse (floor 1.0x)",
    }
    print(f"\nfeatures bench on {audio_s:.0f} s of audio ({len(utts)} utterances, {source}), "
          f"one core each, best of {repeats}:")
    print(f"  {'ours (features step core)':<34} {result['ours_xrt']:>9.1f} x RT   "
          f"{result['ours_mb_per_audio_hour']:>6.2f} MB/h")
    print(f"  {'lhotse compute_and_store_features':<34} {result['lhotse_xrt']:>9.1f} x RT   "
          f"{result['lhotse_mb_per_audio_hour']:>6.2f} MB/h")
    print(f"  {'ratio ours / lhotse':<34} {result['ratio_vs_lhotse']:>9.3f}")
    print(f"  {'kaldi-native-fbank kernel (ceiling)':<34} "
          f"{result['kaldi_native_fbank_kernel_xrt']:>9.1f} x RT")
    print(f"  {'our numpy fbank kernel':<34} {result['numpy_fbank_kernel_xrt']:>9.1f} x RT\n")
    log.info("bench features: %s", json.dumps(result))
    return result
