"""`amflow bench features`: our features step core vs lhotse, one core each, in one run.

Competitors, each in its own process spawned from this one (one process tree), all pinned
to the same single core with BLAS/torch threads = 1. Each sets itself up first (imports,
warm-up); then they are timed in turn, round after round, so they never compete with each
other for the machine and all see the same background load:

  ours    tasks.features.process_shard on one shard holding all the bench utterances:
          read + decode WAV, batched numpy fbank, causal CMN, LFR, uint8/fp16 encoding,
          CMVN stats, Parquet write (the whole per-shard work of `amflow features`)
  lhotse  CutSet.compute_and_store_features with a 64-bin lhotse `Fbank` (num_jobs=1,
          its default lilcom storage) over the same files

  kaldi_native_fbank   the ceiling reference: its bare kernel, per utterance, on samples
          already in memory (no I/O); and `numpy_kernel`, our FbankComputer, likewise.
Each figure is audio seconds per wall second (x real time), the best of
`bench.repeats` (3) rounds.

Audio: the utterances of `data.corpus` when it has metadata (up to bench.seconds,
default 1200 s), else that much synthetic speech-like audio (harmonics + noise, 2-8 s
utterances, 10 speakers) written as 16-bit WAV to a temporary directory.
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
import soundfile as sf

from core.config import Config, FeaturesConfig
from core.storage import Storage
from tasks.audio import decode_audio, resolve_uri
from tasks.select import MetadataError, metadata_files, parse_metadata_line

# The competitors' own imports (pyarrow and the features step, lhotse, torch,
# kaldi-native-fbank) stay inside their `_setup_*`: each runs in its own spawned process,
# which should load only what that competitor needs (lhotse is optional).

log = logging.getLogger(__name__)
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
               "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


# --------------------------------------------------------------------------- audio
def _synth(dir_: Path, seconds: float, seed: int = 0) -> list[dict]:
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


def _clean_16k_mono(path: str) -> bool:
    """Only audio both competitors take as it is (decodable, 16 kHz, mono)."""
    try:
        info = sf.info(path)
    except Exception:  # noqa: BLE001 - libsndfile raises several types
        return False
    if info.samplerate != 16000 or info.channels != 1:
        return False
    with open(path, "rb") as f:
        return decode_audio(f.read(), FeaturesConfig(resample=False, downmix=False)).reason \
            is None


def _corpus_audio(cfg: Config, seconds: float) -> list[dict]:
    """Local corpus utterances (the lhotse side needs local files), up to `seconds`."""
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
            if path and os.path.exists(path) and _clean_16k_mono(path):
                out.append({"utt_id": rec.utt_id, "speaker_id": rec.speaker_id,
                            "duration": rec.duration, "path": path})
                total += rec.duration
            if total >= seconds:
                return out
    return out


# --------------------------------------------------------------------------- workers
# Each competitor lives in its own spawned process: it sets itself up (imports, warm-up),
# reports "ready", then times one full pass per "go" from the parent. The parent runs the
# competitors in turn, round after round, so they never compete for the (shared, small)
# machine with each other, and each one's figure is its best round.
def _pin(core: int | None) -> None:
    if core is not None and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {core})
        except OSError:
            pass


def _serve(conn, once) -> None:
    conn.send(("ready", None))
    while conn.recv() == "go":
        t0 = time.perf_counter()
        extra = once()
        conn.send((time.perf_counter() - t0, extra))


def _setup_ours(opts: dict, utts: list[dict], work: str):
    import pyarrow as pa

    from core.config import load_config
    from core.storage import Storage
    from tasks.features import FeaturesJob, process_shard
    from tasks.select import MANIFEST_SCHEMA

    cfg = load_config(None, [f"storage.root={work}/ours", "features.io_threads=1",
                             f"features.storage_dtype={opts['storage_dtype']}"])
    job = FeaturesJob(cfg.storage, cfg.features, f"{work}/ours/features")
    st = Storage(cfg.storage)
    rows = sorted(utts, key=lambda u: (u["speaker_id"], u["utt_id"]))
    man = pa.table({
        "shard": ["bench"] * len(rows), "split": ["unlabeled"] * len(rows),
        "utt_id": [u["utt_id"] for u in rows], "speaker_id": [u["speaker_id"] for u in rows],
        "duration": [u["duration"] for u in rows],
        "created_at": ["2024-01-01T00:00:00Z"] * len(rows),
        "created_ts": [float(i) for i in range(len(rows))], "locale": ["en-US"] * len(rows),
        "condition": [""] * len(rows), "text": [""] * len(rows),
        "audio_uri": [u["path"] for u in rows]}, schema=MANIFEST_SCHEMA)
    st.write_parquet(f"{work}/ours/manifest.parquet", man)
    st.write_parquet(f"{work}/ours/warm.parquet", man.slice(0, 3))
    payload = {"manifest": f"{work}/ours/manifest.parquet", "split": "unlabeled"}
    process_shard(job, "warm", dict(payload, manifest=f"{work}/ours/warm.parquet"))

    def once() -> dict:
        stats = process_shard(job, "bench", payload)
        return {"out": stats["out"], "bytes": stats["bytes"], "audio_s": stats["audio_s"]}

    return once


def _setup_lhotse(opts: dict, utts: list[dict], work: str):
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
    runs = iter(range(10 ** 6))

    def once() -> dict:
        out = Path(f"{work}/lhotse-{next(runs)}")
        cuts.compute_and_store_features(extractor, storage_path=out, num_jobs=1,
                                        progress_bar=False)
        size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        shutil.rmtree(out, ignore_errors=True)
        return {"bytes": size}

    return once


def _load_waves(utts: list[dict]) -> list[np.ndarray]:
    return [sf.read(u["path"], dtype="float32")[0] for u in utts]


def _setup_knf(opts: dict, utts: list[dict], work: str):
    from tasks.fbank import kaldi_fbank, kaldi_options

    fcfg = FeaturesConfig()
    waves = _load_waves(utts)
    kopts = kaldi_options(fcfg)
    kaldi_fbank(waves[0], fcfg, kopts)
    return lambda: [kaldi_fbank(w, fcfg, kopts) for w in waves] and {}


def _setup_numpy(opts: dict, utts: list[dict], work: str):
    from tasks.fbank import FbankComputer

    waves = _load_waves(utts)
    comp = FbankComputer(FeaturesConfig())
    comp.compute(waves[:3])
    return lambda: comp.compute(waves) and {}


SETUPS = {"ours": _setup_ours, "lhotse": _setup_lhotse, "kaldi_native_fbank": _setup_knf,
          "numpy_kernel": _setup_numpy}


def _worker(name: str, opts: dict, utts: list[dict], work: str, core, conn) -> None:
    _pin(core)
    _serve(conn, SETUPS[name](opts, utts, work))


def _rounds(names: list[str], args: tuple, core, repeats: int) -> dict[str, tuple[float, dict]]:
    ctx = mp.get_context("spawn")
    pipes, procs = {}, []
    for name in names:
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(name, *args, core, child), name=name)
        p.start()
        pipes[name] = parent
        procs.append(p)
    try:
        for name in names:
            if not pipes[name].poll(1800):
                raise RuntimeError(f"bench worker {name} did not get ready")
            pipes[name].recv()
        best: dict[str, tuple[float, dict]] = {}
        for _ in range(repeats):
            for name in names:
                pipes[name].send("go")
                secs, extra = pipes[name].recv()
                if name not in best or secs < best[name][0]:
                    best[name] = (secs, extra)
    finally:
        for name in names:
            try:
                pipes[name].send("stop")
            except (BrokenPipeError, OSError):
                pass
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.terminate()
    for p in procs:
        if p.exitcode:
            raise RuntimeError(f"bench worker {p.name} exited with {p.exitcode}")
    return best


# --------------------------------------------------------------------------- entry
def run(ctx, args) -> dict[str, Any]:
    cfg = ctx.cfg
    seconds, repeats = cfg.bench.seconds, cfg.bench.repeats
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
            cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
            core = cores[-1] if cores else None
            wargs = ({"storage_dtype": cfg.features.storage_dtype}, utts, work)
            best = _rounds(list(SETUPS), wargs, core, repeats)
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ours_s, ours_x = best["ours"]
    lh_s, lh_x = best["lhotse"]
    knf_s, np_s = best["kaldi_native_fbank"][0], best["numpy_kernel"][0]
    result = {
        "audio_seconds": round(audio_s, 2), "utterances": len(utts), "source": source,
        "repeats": repeats,
        "ours_xrt": round(audio_s / ours_s, 1),
        "lhotse_xrt": round(audio_s / lh_s, 1),
        "ratio_vs_lhotse": round(lh_s / ours_s, 3),
        "kaldi_native_fbank_kernel_xrt": round(audio_s / knf_s, 1),
        "numpy_fbank_kernel_xrt": round(audio_s / np_s, 1),
        "ours_mb_per_audio_hour": round(ours_x["bytes"] / 1e6 / (audio_s / 3600), 2),
        "lhotse_mb_per_audio_hour": round(lh_x["bytes"] / 1e6 / (audio_s / 3600), 2),
        "storage_dtype": cfg.features.storage_dtype,
        "goal": ">= 1.5x lhotse (floor 1.0x)",
    }
    print(f"\nfeatures bench on {audio_s:.0f} s of audio ({len(utts)} utterances, {source}), "
          f"one core each, in turn, best of {repeats} rounds:")
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
