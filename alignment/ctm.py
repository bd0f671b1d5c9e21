"""Frame alignments -> phone segments and CTM lines; scoring against a reference CTM.

Frame t spans [t * 10 ms, (t + 1) * 10 ms) (features.py), so a phone starting at frame t
starts at t * 10 ms.

    segments(phones, starts)           -> [(phone id, first frame, frames)]
    fold_closures(phones, starts, ids) -> closure frames given to the phone before
    ctm_lines(utt_id, segs, names)     -> Kaldi CTM `utt 1 start dur phone` lines
    score(hyp, ref, tolerance)         -> frame phone accuracy and boundary accuracy

Scoring: a frame is right when the reference phone at its centre (t * 10 ms + 5 ms) is the
aligned phone. Boundaries: the non-silence phone sequences of both are matched
(difflib's longest matching blocks, so a different pronunciation variant or a missing
linking phone costs only its own phones); for every matched phone its start and its end
are compared, and the share within `tolerance` seconds is reported.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

import numpy as np

from alignment.features import FRAME_SHIFT_S

SIL = "sil"


def segments(phones: np.ndarray, starts: np.ndarray) -> list[tuple[int, int, int]]:
    idx = np.flatnonzero(starts).tolist() + [len(phones)]
    return [(int(phones[a]), a, b - a) for a, b in zip(idx[:-1], idx[1:]) if b > a]


def fold_closures(phones: np.ndarray, starts: np.ndarray, closure_ids: set[int],
                  sil_id: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """A closure phone's frames (lexicon_graphs.with_closures) relabelled as the phone
    before it (silence at an utterance's start) and merged into that phone's segment."""
    if not closure_ids:
        return phones, starts
    phones, starts = phones.copy(), starts.copy()
    prev = sil_id
    for p, a, n in segments(phones, starts):
        if p in closure_ids:
            phones[a:a + n] = prev
            if a > 0:
                starts[a] = False
        else:
            prev = p
    return phones, starts


def ctm_lines(utt_id: str, segs: list[tuple[int, int, int]], names: list[str]) -> list[str]:
    return [f"{utt_id} 1 {a * FRAME_SHIFT_S:.2f} {n * FRAME_SHIFT_S:.2f} {names[p]}"
            for p, a, n in segs]


@dataclass
class Score:
    frames: int = 0
    frames_right: int = 0
    boundaries: int = 0
    boundaries_within: int = 0
    ref_phones: int = 0
    matched_phones: int = 0
    utterances: int = 0
    same_sequence: int = 0
    # frames of the utterances whose phone sequence equals the reference's: where the
    # lexicon's pronunciation is what was spoken, only boundary placement can be wrong
    same_sequence_frames: int = 0
    same_sequence_frames_right: int = 0

    def add(self, o: "Score") -> "Score":
        for k in self.__dataclass_fields__:
            setattr(self, k, getattr(self, k) + getattr(o, k))
        return self

    def summary(self) -> dict:
        return {"frame_phone_accuracy": round(self.frames_right / max(1, self.frames), 4),
                "boundaries_within_20ms": round(self.boundaries_within /
                                                max(1, self.boundaries), 4),
                "boundaries": self.boundaries, "frames": self.frames,
                "matched_phone_share": round(self.matched_phones / max(1, self.ref_phones), 4),
                "same_phone_sequence_share": round(self.same_sequence /
                                                   max(1, self.utterances), 4),
                "frame_phone_accuracy_same_sequence": round(
                    self.same_sequence_frames_right / max(1, self.same_sequence_frames), 4),
                "utterances": self.utterances}


def score(hyp: list[tuple[str, float, float]], ref: list[tuple[str, float, float]],
          num_frames: int, tolerance: float = 0.02) -> Score:
    """hyp/ref: (phone, start s, end s) sorted; frames of the hypothesis' length."""
    sc = Score(utterances=1)
    r_st = np.array([s for _, s, _ in ref])
    r_en = np.array([e for _, _, e in ref])
    h_st = np.array([s for _, s, _ in hyp])
    centres = np.arange(num_frames) * FRAME_SHIFT_S + FRAME_SHIFT_S / 2
    ri = np.searchsorted(r_st, centres, side="right") - 1
    hi = np.searchsorted(h_st, centres, side="right") - 1
    inside = (ri >= 0) & (centres < r_en[np.clip(ri, 0, None)])
    rp = np.array([p for p, _, _ in ref], dtype=object)
    hp = np.array([p for p, _, _ in hyp], dtype=object)
    sc.frames = int(inside.sum())
    sc.frames_right = int((rp[ri[inside]] == hp[np.clip(hi[inside], 0, None)]).sum())
    hs = [x for x in hyp if x[0] != SIL]
    rs = [x for x in ref if x[0] != SIL]
    sc.ref_phones = len(rs)
    sc.same_sequence = int([p for p, _, _ in hs] == [p for p, _, _ in rs])
    sc.same_sequence_frames = sc.frames * sc.same_sequence
    sc.same_sequence_frames_right = sc.frames_right * sc.same_sequence
    m = difflib.SequenceMatcher(None, [p for p, _, _ in hs], [p for p, _, _ in rs],
                                autojunk=False)
    for blk in m.get_matching_blocks():
        for k in range(blk.size):
            h, r = hs[blk.a + k], rs[blk.b + k]
            sc.matched_phones += 1
            sc.boundaries += 2
            sc.boundaries_within += (abs(h[1] - r[1]) <= tolerance + 1e-9) + \
                (abs(h[2] - r[2]) <= tolerance + 1e-9)
    return sc
