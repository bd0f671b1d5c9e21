"""Pseudo-labels: the teacher's words for unlabeled speech, each with a confidence and its
scores, and the filter that keeps the confident ones (the step: amflow/steps/pseudolabel.py).

    PseudoLabelWorker          a decode.DecodeWorker (a Ray actor holding the model and the
                               graph, the same search `amflow decode` runs) that returns a
                               `Label` per utterance
    label_of(rec, log_post, path, acwt) -> Label
    apply_filter(labels, threshold) -> [(Label, reason)]   reason "" = kept
    drop_counts(filtered) -> {reason: n}
    choose_threshold(dev labels, max_wer_ratio, min_kept) -> dict   the rule below
    tally(filtered) / merge_tallies / rates   WER of the kept, the dropped and all (the
                               calibration), the kept share of the audio, per shard summed
    labels_table(filtered) -> the Parquet rows the students read (LABELS_SCHEMA)

The confidence: the mean, over the 1-best path's frames, of the acoustic model's posterior
of the class the path puts at that frame, p(c_t | x_t) (in [0, 1]). The search picks the
path by acoustic score and LM together: where the LM pulls in a word the audio does not
support, or where the model is torn between classes (far-field, noise), the chosen
classes' posteriors are low. It costs one gather over posteriors the decode already holds,
so pseudo-labelling stays as fast as decoding. The alternative the lattice offers, the
margin between the best and second-best word sequences, is out of reach at that cost:
kaldi-decoder's LatticeSimpleDecoder has no max_active and hands Python only its raw,
undeterminised lattice (~1,000 states for 22 frames of a 6-word graph), whose n-best
paths differ in alignment, not words; a word-level margin needs it walked, projected and
determinised per utterance in Python, on the step that must run at >= 100x real time.
Silence frames count too: a hypothesis that puts silence where speech is (deleted words)
is as wrong as one that puts words there. On a weak teacher the geometric mean, the mean
over non-silence frames, the worst 10-frame window, a frame likelihood ratio and the LM
log-probability per word ranked no better (docs/results/2026-11-29-pseudolabels.md).

am_score: the path's acoustic log-likelihood ratio, sum_t (log p(c_t | x_t) - log p(c_t))
(unscaled: the searched scores divided by acwt); lm_score: the graph's log-probability of
the path (LM, pronunciation and silence probabilities), natural log.

The threshold rule (`choose_threshold`, on the dev split, whose transcripts are known):
the lowest confidence threshold whose kept set has a WER <= max_wer_ratio x the unfiltered
set's WER while keeping >= min_kept of the dev audio. When no threshold meets it, the
threshold with the lowest kept WER among those keeping >= min_kept of the audio (the
lowest such on ties), reported with rule_met false.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
import pyarrow as pa

from decoding import wer as W
from decoding.decode import DecodeWorker
from decoding.lexicon import words_of
from decoding.search import BestPath, acoustic_scores

# Why an utterance gets no pseudo-label (besides the audio reasons featurize gives).
DECODE_FAILED = "decode_failed"  # the search kept no path
EMPTY = "empty_hypothesis"  # the path holds no word
NOT_FINAL = "no_final_state"  # the beam lost every path that ends the sentence: truncated
LOW_CONFIDENCE = "low_confidence"

LABELS_SCHEMA = pa.schema([
    ("utt_id", pa.string()), ("text", pa.string()), ("confidence", pa.float64()),
    ("am_score", pa.float64()), ("lm_score", pa.float64()), ("kept", pa.bool_()),
    ("reason", pa.string()), ("duration", pa.float64()), ("speaker_id", pa.string()),
    ("condition", pa.string()), ("audio_uri", pa.string()),
])


@dataclass
class Label:
    utt_id: str
    text: str  # the hypothesis, words joined by one space
    confidence: float
    am_score: float
    lm_score: float
    duration: float
    speaker_id: str = ""
    condition: str = ""
    audio_uri: str = ""
    failure: str = ""  # a reason it cannot be kept whatever the threshold; "" = none
    detail: str = ""
    # against the record's transcript when it has one (calibration only, never written
    # beside the labels a student reads)
    errors: int | None = None
    ref_words: int | None = None


def path_confidence(log_post: np.ndarray, classes: np.ndarray) -> float:
    """Mean posterior of the path's class per frame (module docstring)."""
    if len(classes) == 0 or len(classes) != len(log_post):
        return 0.0
    p = np.exp(log_post[np.arange(len(classes)), classes].astype(np.float64))
    return float(np.clip(p.mean(), 0.0, 1.0))


def _failure(path: BestPath) -> str:
    if not path.ok:
        return DECODE_FAILED
    if not path.words:
        return EMPTY
    return "" if path.final else NOT_FINAL


def label_of(rec, log_post: np.ndarray, path: BestPath, acwt: float) -> Label:
    """One utterance's Label from its log posteriors and its 1-best path."""
    failure = _failure(path)
    ok = path.ok
    lab = Label(rec.utt_id, " ".join(path.words),
                path_confidence(log_post, path.classes) if ok else 0.0,
                -path.am_cost / acwt if ok else float("nan"),
                -path.graph_cost if ok else float("nan"),
                float(rec.duration), rec.speaker_id, rec.condition or "", rec.audio_uri,
                failure)
    if rec.text and words_of(rec.text):
        s = W.score(words_of(rec.text), path.words)
        lab.errors, lab.ref_words = s.errors, s.ref_words
    return lab


def rejected_label(rec, reason: str, detail: str) -> Label:
    """A record whose audio never reached the model (featurize's reject)."""
    lab = Label(rec.utt_id, "", 0.0, float("nan"), float("nan"), float(rec.duration),
                rec.speaker_id, rec.condition or "", rec.audio_uri, reason, detail)
    if rec.text and words_of(rec.text):
        lab.errors = lab.ref_words = len(words_of(rec.text))
    return lab


class PseudoLabelWorker(DecodeWorker):
    """DecodeWorker's model and search, returning Labels (confidence, scores)."""

    def label_scored(self, utts: list, acwt: float) -> dict:
        """Labels of already scored utterances [(record, log posteriors)] at `acwt`."""
        t0 = time.perf_counter()
        labels = [label_of(rec, lp, self.searcher.best_path(
            acoustic_scores(lp, self.log_prior, acwt)), acwt) if lp is not None else
            rejected_label(rec, EMPTY, "the speech gate (decode.speech_gate) kept no frame")
            for rec, lp in utts]
        return {"labels": labels, "search_s": time.perf_counter() - t0,
                "frames": sum(len(lp) for _, lp in utts if lp is not None)}

    def label(self, records: list, acwt: float, shard: str = "") -> dict:
        """Featurise, score and search a shard's records: every record gets a Label (a
        record whose audio failed gets its reject's reason)."""
        scored = self.score(records)
        out = self.label_scored(scored["utts"], acwt)
        by_id = {r.utt_id: r for r in records}
        out["labels"] += [rejected_label(by_id[j.utt_id], j.reason, j.detail)
                          for j in scored["rejects"]]
        out.update({k: scored[k] for k in ("audio_s", "featurize_s", "forward_s")})
        out["shard"] = shard
        return out


# ----------------------------------------------------------------- the filter
def apply_filter(labels: Iterable[Label], threshold: float) -> list[tuple[Label, str]]:
    """(label, reason) per label: its failure, else low_confidence under `threshold`,
    else "" (kept)."""
    out = []
    for lab in labels:
        reason = lab.failure or (LOW_CONFIDENCE if lab.confidence < threshold else "")
        out.append((lab, reason))
    return out


def drop_counts(filtered: Sequence[tuple[Label, str]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, reason in filtered:
        if reason:
            counts[reason] = counts.get(reason, 0) + 1
    return dict(sorted(counts.items()))


def _wer(labels: Sequence[Label]) -> float | None:
    n = sum(lab.ref_words or 0 for lab in labels if lab.ref_words is not None)
    if not n:
        return None
    return sum(lab.errors or 0 for lab in labels if lab.errors is not None) / n


def tally(filtered: Sequence[tuple[Label, str]]) -> dict:
    """Sums that add up across shards: utterances, audio, and errors / reference words
    (against the records' transcripts, where they have one) of all, kept and dropped."""
    out = {"utts": 0, "kept_utts": 0, "audio_s": 0.0, "kept_audio_s": 0.0,
           "errors": {g: [0, 0] for g in ("all", "kept", "dropped")},
           "dropped_by_reason": drop_counts(filtered)}
    for lab, reason in filtered:
        out["utts"] += 1
        out["audio_s"] += lab.duration
        if not reason:
            out["kept_utts"] += 1
            out["kept_audio_s"] += lab.duration
        if lab.ref_words is not None:
            for g in ("all", "dropped" if reason else "kept"):
                out["errors"][g][0] += lab.errors or 0
                out["errors"][g][1] += lab.ref_words
    return out


def merge_tallies(tallies: Iterable[dict]) -> dict:
    out = tally([])
    for t in tallies:
        for k in ("utts", "kept_utts", "audio_s", "kept_audio_s"):
            out[k] += t[k]
        for g, (e, n) in t["errors"].items():
            out["errors"][g][0] += e
            out["errors"][g][1] += n
        for r, n in t["dropped_by_reason"].items():
            out["dropped_by_reason"][r] = out["dropped_by_reason"].get(r, 0) + n
    out["dropped_by_reason"] = dict(sorted(out["dropped_by_reason"].items()))
    return out


def rates(t: dict) -> dict:
    """The calibration report of a tally: WER of the kept, the dropped and all (None
    without references), the kept share of the utterances and of the audio."""
    wer = {g: (e / n if n else None) for g, (e, n) in t["errors"].items()}
    return {"wer_all": wer["all"], "wer_kept": wer["kept"], "wer_dropped": wer["dropped"],
            "kept_wer_reduction": (1 - wer["kept"] / wer["all"])
            if wer["all"] and wer["kept"] is not None else None,
            "ref_words": t["errors"]["all"][1], "utts": t["utts"], "kept_utts": t["kept_utts"],
            "dropped_utts": t["utts"] - t["kept_utts"],
            "kept_fraction": t["kept_utts"] / t["utts"] if t["utts"] else 0.0,
            "audio_s": round(t["audio_s"], 3), "kept_audio_s": round(t["kept_audio_s"], 3),
            "kept_audio_fraction": t["kept_audio_s"] / t["audio_s"] if t["audio_s"] else 0.0,
            "dropped_by_reason": t["dropped_by_reason"]}


# ----------------------------------------------------------------- choosing the threshold
@dataclass
class _Point:
    threshold: float
    kept_fraction: float  # of the audio
    kept_wer: float | None
    kept_utts: int


@dataclass
class ThresholdChoice:
    threshold: float
    rule_met: bool
    unfiltered_wer: float
    kept_wer: float | None
    kept_fraction: float
    curve: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"threshold": self.threshold, "rule_met": self.rule_met,
                "unfiltered_wer": self.unfiltered_wer, "kept_wer": self.kept_wer,
                "kept_fraction": self.kept_fraction, "curve": self.curve}


def _curve(labels: Sequence[Label]) -> list[_Point]:
    """Kept share of the audio and kept WER at each candidate threshold (0 and every
    distinct confidence of a label that can be kept), highest threshold first."""
    audio = sum(lab.duration for lab in labels) or 1.0
    ok = sorted((lab for lab in labels if not lab.failure), key=lambda x: -x.confidence)
    points, errs, words, secs = [], 0, 0, 0.0
    for i, lab in enumerate(ok):
        errs += lab.errors or 0
        words += lab.ref_words or 0
        secs += lab.duration
        if i + 1 < len(ok) and ok[i + 1].confidence == lab.confidence:
            continue  # a threshold keeps all of equal confidence or none
        points.append(_Point(lab.confidence, secs / audio, errs / words if words else None, i + 1))
    if points:
        last = points[-1]
        points.append(_Point(0.0, last.kept_fraction, last.kept_wer, last.kept_utts))
    return points


def choose_threshold(labels: Sequence[Label], max_wer_ratio: float, min_kept: float,
                     curve_points: int = 40) -> ThresholdChoice:
    """The threshold rule of the module docstring, on labels with references."""
    scored = [lab for lab in labels if lab.ref_words is not None]
    if not scored:
        raise ValueError("no label has a reference transcript: no threshold can be chosen")
    unfiltered = _wer(scored) or 0.0
    points = _curve(scored)
    enough = [p for p in points if p.kept_fraction >= min_kept and p.kept_utts]
    met = [p for p in enough if p.kept_wer is not None
           and p.kept_wer <= max_wer_ratio * unfiltered + 1e-12]
    if met:
        best = min(met, key=lambda p: p.threshold)
    elif enough:
        best = min(enough, key=lambda p: (p.kept_wer if p.kept_wer is not None else 1e9,
                                          p.threshold))
    else:  # failures alone drop more than 1 - min_kept: keep every label that can be kept
        best = points[-1] if points else _Point(0.0, 0.0, None, 0)
    step = max(1, len(points) // curve_points)
    curve = [{"threshold": round(p.threshold, 6), "kept_fraction": round(p.kept_fraction, 4),
              "kept_wer": None if p.kept_wer is None else round(p.kept_wer, 4)}
             for p in points[::step]]
    return ThresholdChoice(best.threshold, bool(met), unfiltered, best.kept_wer,
                           best.kept_fraction, curve)


# ----------------------------------------------------------------- output rows
def labels_table(filtered: Sequence[tuple[Label, str]]) -> pa.Table:
    rows = sorted(filtered, key=lambda f: f[0].utt_id)
    return pa.table({
        "utt_id": [x.utt_id for x, _ in rows], "text": [x.text for x, _ in rows],
        "confidence": [x.confidence for x, _ in rows],
        "am_score": [x.am_score for x, _ in rows], "lm_score": [x.lm_score for x, _ in rows],
        "kept": [not r for _, r in rows], "reason": [r for _, r in rows],
        "duration": [x.duration for x, _ in rows], "speaker_id": [x.speaker_id for x, _ in rows],
        "condition": [x.condition for x, _ in rows], "audio_uri": [x.audio_uri for x, _ in rows],
    }, schema=LABELS_SCHEMA)


def calibration_table(filtered: Sequence[tuple[Label, str]]) -> pa.Table:
    """Per utterance: errors against the transcript (kept apart from the labels)."""
    rows = sorted(filtered, key=lambda f: f[0].utt_id)
    return pa.table({"utt_id": [x.utt_id for x, _ in rows],
                     "errors": pa.array([x.errors for x, _ in rows], pa.int64()),
                     "ref_words": pa.array([x.ref_words for x, _ in rows], pa.int64()),
                     "kept": [not r for _, r in rows]})


def reject_detail(lab: Label, reason: str, threshold: float) -> str:
    if reason == LOW_CONFIDENCE:
        return f"confidence {lab.confidence:.4f} < threshold {threshold:.4f}"
    return lab.detail or reason
