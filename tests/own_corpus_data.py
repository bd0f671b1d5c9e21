"""A corpus of a user's kind, made with espeak-ng: Kaldi data directories train / dev /
test of short word sequences at a chosen sample rate, disjoint speakers, no lexicon.

    make_kaldi_corpus(root, rate=8000, ...) -> {split: number of utterances}

Used by tests/test_own_corpus.py (the how-to's recipe) and scripts/measure_8khz.py.
"""
from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import soundfile as sf
from scipy.signal import resample_poly

from tasks.speech import espeak

WORDS = ["yes", "no", "up", "down", "left", "right", "stop", "go", "one", "two", "three",
         "four"]
VOICES = ["", "f3", "m3", "klatt", "f2", "m7", "f1", "m2", "f4", "m1", "klatt2", "m4"]


def _voices(n: int) -> list[espeak.VoiceParams]:
    have = {v.variant_name for v in espeak.variants()} | {""}
    names = [v for v in VOICES if v in have] or [""]
    return [espeak.VoiceParams(variant=names[i % len(names)], pitch=35 + (i * 11) % 40,
                               rate=140 + (i * 13) % 50) for i in range(n)]


def _say(text: str, voice: espeak.VoiceParams, seed: int, rate: int) -> np.ndarray:
    syn = espeak.synthesize(text, voice, seed=seed)
    frac = Fraction(rate, syn.sample_rate)
    x = resample_poly(syn.audio.astype(np.float32) / 32768.0, frac.numerator,
                      frac.denominator)
    return np.round(np.clip(x, -1, 1) * 32767).astype(np.int16)


def make_kaldi_corpus(root: Path, rate: int = 8000, speakers: dict | None = None,
                      utts: dict | None = None, seed: int = 0,
                      transcribed: float = 1.0) -> dict[str, int]:
    """Kaldi dirs root/{train,dev,test}: `speakers` per split (default 4/2/2), `utts`
    per speaker (default 8/4/4), 1-3 words each; audio under root/wav/ at `rate`. Only
    the first `transcribed` share of each train speaker's utterances has a `text` line:
    the rest is untranscribed audio (counted as "untranscribed")."""
    speakers = speakers or {"train": 4, "dev": 2, "test": 2}
    utts = utts or {"train": 8, "dev": 4, "test": 4}
    voices = _voices(sum(speakers.values()))
    rng = np.random.default_rng(seed)
    counts, k = {}, 0
    for split in ("train", "dev", "test"):
        d = root / split
        d.mkdir(parents=True, exist_ok=True)
        wav, spk, txt = [], [], []
        for s in range(speakers[split]):
            voice, k = voices[k], k + 1
            name = f"{split}{s}"
            for u in range(utts[split]):
                uid = f"{name}-{u:03d}"
                words = " ".join(rng.choice(WORDS, size=int(rng.integers(1, 4))))
                path = root / "wav" / f"{uid}.wav"
                path.parent.mkdir(parents=True, exist_ok=True)
                sf.write(path, _say(words, voice, int(rng.integers(1 << 30)), rate), rate,
                         subtype="PCM_16")
                wav.append(f"{uid} {path}\n")
                spk.append(f"{uid} {name}\n")
                if split != "train" or u < round(transcribed * utts[split]):
                    txt.append(f"{uid} {words}\n")
        (d / "wav.scp").write_text("".join(wav))
        (d / "utt2spk").write_text("".join(spk))
        (d / "text").write_text("".join(txt))
        counts[split] = len(txt)
        if split == "train":
            counts["untranscribed"] = len(wav) - len(txt)
    return counts
