"""Viterbi alignment kept to a reference CTM's phones (`align.guide=ctm`).

Two uses. Training the aligner from a reference alignment instead of a flat start (as
Kaldi recipes bootstrap from TIMIT's hand labels): every realignment while training keeps
to the reference's phone at every frame, the GMMs learn the reference's segmentation, and
the stage's final alignment is free. And a bound: a model trained on the reference itself,
aligning freely, shows how close this model class (3-state HMMs, MFCCs at 10 ms, the
lexicon's pronunciations) can come to that reference at all; the guided alignment shows
what the topology and the lexicon alone allow (a phone under 3 frames cannot be followed).

The constraint is a cost, not a hard cut: each frame whose transition id belongs to a phone
the reference does not allow there costs `PENALTY` (scaled log-likelihood units), so the
search follows the reference wherever some path can, and elsewhere takes the path with the
fewest frames off it (a too-short phone, a pronunciation the lexicon lacks).
"""
from __future__ import annotations

import numpy as np

from alignment import lexicon_graphs as lg
from alignment.features import FRAME_SHIFT_S

# per frame off the reference, in scaled units (x10 in log-likelihood at acoustic scale 0.1):
# well above any frame's acoustic difference between phones, well below the retry beam's
# reach for whole utterances
PENALTY = 30.0


def allowed_phones(ref: list[tuple[str, float, float]], num_frames: int, lang: lg.Lang
                   ) -> np.ndarray:
    """[T, phone ids] bool, the phones frame t may take: the reference phone at the frame's
    centre (the scoring convention of ctm.score), and the closure phone of a stop that
    starts the next reference segment (espeak-ng gives a stop's closure to the phone
    before it). A frame no reference segment covers, or whose phone the lexicon does not
    know, may take any phone."""
    ids = lang.phone_id
    out = np.ones((num_frames, len(lang.phones)), bool)
    centres = np.arange(num_frames) * FRAME_SHIFT_S + FRAME_SHIFT_S / 2
    for i, (phone, start, end) in enumerate(ref):
        frames = (centres >= start) & (centres < end)
        if phone not in ids or not frames.any():
            continue
        row = np.zeros(len(lang.phones), bool)
        row[ids[phone]] = True
        closure = lang.closure_of.get(ref[i + 1][0]) if i + 1 < len(ref) else None
        if closure in ids:
            row[ids[closure]] = True
        out[frames] = row
    return out


def guided_loglikes(pdf_loglikes: np.ndarray, pdf_of: np.ndarray, phone_of: np.ndarray,
                    allowed: np.ndarray, scale: float, penalty: float = PENALTY) -> np.ndarray:
    """[T, transition ids] for gmm.align_loglikes (column i - 1 for transition id i): each
    transition id's scaled pdf log-likelihood, less `penalty` where its phone is not
    allowed at that frame. pdf_of / phone_of: per transition id, index 0 unused."""
    scaled = scale * pdf_loglikes[:, pdf_of[1:]]
    return scaled - penalty * ~allowed[:, phone_of[1:]]
