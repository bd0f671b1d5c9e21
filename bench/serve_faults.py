"""`amflow bench serve_faults --run-id R [--model M]`: what the streaming recognizer makes
of inputs without speech, and what its speech gate (serve.speech_*) costs on speech.

The recognizer of `amflow serve` (the run's student, graph and tuned acwt: amflow.steps.
serve.load_assets), in this process without Ray (serving.recognizer.transcribe), once
with serve.speech_gate off and once on:
  - fault inputs, each 12 utterances of 5 s in one stream (a minute): digital silence,
    a constant full-scale signal, mains hum (tasks.speech.room.hum) at -20 dBFS and near
    full scale, white, pink and brown noise, fan noise, sparse clatter: words per minute;
  - speech: the test split's speakers, each a stream of its utterances in time order:
    WER, and the same utterances with 3 s of digital silence, of hum and of pink noise
    (20 dB below the utterance's level) before and after each (where a recognizer without
    a gate inserts words, and silence weighs on the speaker's mean normalisation).
Writes runs/<R>/bench/serve_faults.json.
"""
from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from typing import Any

import numpy as np

FAULT_S, FAULT_UTTS = 5.0, 12
RATE = 16000


def fault_inputs(seed: int = 0) -> dict[str, np.ndarray]:
    """name -> a minute of float32 audio in [-1, 1] with no speech in it."""
    from tasks.speech import room

    rng = np.random.default_rng(seed)
    n = int(FAULT_S * FAULT_UTTS * RATE)
    full = 32767 / 32768
    waves = {"digital_silence": np.zeros(n), "full_scale_constant": np.full(n, full),
             "hum_-20dBFS": 0.1 * room.hum(rng, n), "hum_-3dBFS": 0.7 * room.hum(rng, n),
             "white_-30dBFS": 0.0316 * rng.standard_normal(n),
             "pink_-20dBFS": 0.1 * room.colored_noise(rng, n, 1.0),
             "brown_-20dBFS": 0.1 * room.colored_noise(rng, n, 2.0),
             "fan_-20dBFS": 0.1 * room.fan(rng, n), "clatter_-20dBFS": 0.1 * room.clatter(rng, n)}
    return {k: np.clip(v, -1.0, full).astype(np.float32) for k, v in waves.items()}


def words_per_minute(rec, wave: np.ndarray) -> dict[str, Any]:
    from serving.recognizer import transcribe

    step = int(FAULT_S * RATE)
    finals = transcribe(rec, [wave[i:i + step] for i in range(0, len(wave), step)])
    words = [w for f in finals for w in f["final"].split()]
    return {"words": len(words), "wpm": round(len(words) / (len(wave) / RATE / 60), 2),
            "rows": sum(f["frames"] for f in finals), "examples": sorted(set(
                f["final"] for f in finals if f["final"]))[:5]}


def speaker_streams(ctx, corpus: str, split: str = "test") -> list[tuple[list, list[np.ndarray]]]:
    """Per speaker of `split`, (records, waves) in time order."""
    from bench.serve import load_audio
    from decoding.decode import split_records

    recs, _ = split_records(ctx.storage, corpus, split)
    by: dict[str, list] = defaultdict(list)
    for r in sorted(recs, key=lambda r: (r.speaker_id, r.created_ts, r.utt_id)):
        by[r.speaker_id].append(r)
    out = []
    for spk in sorted(by):
        pcm = load_audio(ctx, corpus, [by[spk]])
        out.append((by[spk], [np.frombuffer(pcm[r.utt_id], "<i2").astype(np.float32) / 32768
                              for r in by[spk]]))
    return out


def speech_wer(rec, streams, around: np.ndarray | None = None) -> dict[str, Any]:
    """WER of the streamed finals; `around`: 3 s of audio put before and after each
    utterance, scaled to AROUND_DB below the utterance's RMS level (unless all zeros)."""
    from decoding import wer as W
    from decoding.lexicon import words_of
    from serving.recognizer import transcribe

    scores, hyps, rows = [], {}, []
    for recs, waves in streams:
        if around is not None:
            waves = [np.concatenate([_level(around, w), w, _level(around, w)]) for w in waves]
        for r, f in zip(recs, transcribe(rec, waves)):
            hyps[r.utt_id] = f["final"]
            scores.append(W.score(words_of(r.text), f["final"].split(), r.condition or "unknown"))
            rows.append({"utt_id": r.utt_id, "errors": scores[-1].errors,
                         "ref_words": scores[-1].ref_words})
    agg = W.aggregate(scores)
    return {"wer": round(agg["wer"], 5), "ins": round(agg["ins"], 5), "ref_words": agg["ref_words"],
            "per_condition": {k: round(v, 5) for k, v in agg["per_condition"].items()},
            "utterances": len(scores), "hyps": hyps, "rows": rows}


AROUND_DB = 20.0  # the hum and noise around speech: this far below the speech's level


def _level(x: np.ndarray, speech: np.ndarray) -> np.ndarray:
    rms = float(np.sqrt(np.mean(x.astype(np.float64) ** 2)))
    if rms == 0:
        return x
    target = float(np.sqrt(np.mean(speech.astype(np.float64) ** 2))) * 10 ** (-AROUND_DB / 20)
    return (x * (target / rms)).astype(np.float32)


def run(ctx, args) -> dict[str, Any]:
    from amflow.steps.serve import load_assets, serve_context
    from serving.app import make_recognizer
    from serving.export_checks import paired_delta

    ctx, model = serve_context(ctx, getattr(args, "model", None))
    assets = load_assets(ctx, model)
    corpus = getattr(args, "data", None) or ctx.cfg.data.corpus
    streams = speaker_streams(ctx, corpus)
    faults = fault_inputs()
    sc = dataclasses.replace(ctx.cfg.serve, device="cpu", dtype="fp32")
    hum, pink = faults["hum_-20dBFS"][:3 * RATE], faults["pink_-20dBFS"][:3 * RATE]
    out: dict[str, Any] = {"model": assets["model_uri"], "acwt": assets["acwt"], "faults": {},
                           "speech": {}, "gate": {k: v for k, v in dataclasses.asdict(sc).items()
                                                  if k.startswith("speech_")}}
    for gated in (False, True):
        rec = make_recognizer(assets, dataclasses.replace(sc, speech_gate=gated))
        key = "gate" if gated else "no_gate"
        t0 = time.perf_counter()
        for name, wave in faults.items():
            out["faults"].setdefault(name, {})[key] = words_per_minute(rec, wave)
        out["speech"][key] = {
            "test": speech_wer(rec, streams),
            "test_in_3s_silence": speech_wer(rec, streams, np.zeros(3 * RATE, np.float32)),
            "test_in_3s_hum": speech_wer(rec, streams, hum),
            "test_in_3s_pink": speech_wer(rec, streams, pink)}
        out["speech"][key]["wall_s"] = round(time.perf_counter() - t0, 1)
        print(f"{key}: " + ", ".join(f"{n} {v[key]['wpm']} wpm" for n, v in out["faults"].items())
              + "; WER " + ", ".join(f"{k} {v['wer']}" for k, v in out["speech"][key].items()
                                    if isinstance(v, dict)), flush=True)
    base, gate = out["speech"]["no_gate"]["test"]["hyps"], out["speech"]["gate"]["test"]["hyps"]
    out["speech"]["finals_changed_by_gate"] = sum(base[u] != gate[u] for u in base)
    out["speech"]["gate_vs_no_gate"] = {  # the WER change with its 95 % CI, per speech set
        k: paired_delta(out["speech"]["no_gate"][k]["rows"], v["rows"])
        for k, v in out["speech"]["gate"].items() if isinstance(v, dict)}
    for key in ("no_gate", "gate"):  # the per-utterance words stay out of the summary
        for v in out["speech"][key].values():
            if isinstance(v, dict):
                v.pop("hyps")
                v.pop("rows")
    return out
