"""Phone alignments: CTM parsing, the phone inventory, 100 Hz frame labels.

Public functions (also used by `amflow evaluate`):

    read_ctm(text) -> (alignments, errors)
        Kaldi CTM lines `utt_id channel start_s duration_s phone [confidence]` ->
        {utt_id: Alignment(starts, ends, phones)} sorted by start, and a list of
        (line number, utt_id, message) for malformed lines (those utterances are dropped
        whole: a partial alignment would mislabel frames). Zero-length segments are skipped.
    ctm_utt_ids(text) -> set[str]
        The utterance ids a CTM covers (cheap; used by `select` to infer splits).
    parse_phones_txt(text) -> list[str]
        An optional `phones.txt`: one phone per line (`phone` or Kaldi's `phone id`;
        with ids, ordered by id). Blank lines and `#` comments are skipped.
    build_inventory(phones_txt, alignments) -> list[str]
        The run's class list, index = class id: phones.txt order when given, else the
        sorted phones seen in the CTM; `<unk>` is always present (appended when missing).
    load_inventory(storage, corpus_root, alignments) -> list[str]
        build_inventory with `<corpus>/phones.txt` if it exists.
    frame_labels(alignment, num_frames, phone_ids, fcfg) -> (int16 labels | None, reason, detail)
        One label per 100 Hz frame: the phone whose segment holds the frame centre
        (t * shift + length / 2). Frames in a gap or past either end take the nearest
        segment's phone when it is at most `fcfg.align_tolerance_s` away; farther than
        that the alignment does not cover the audio and the utterance is rejected
        (`alignment_mismatch`). An alignment reaching more than the tolerance past the
        end of the audio is also a mismatch. Phones outside the inventory map to `<unk>`.
    frame_labels_ids(starts, ends, ids, num_frames, fcfg) -> the same with phones already ids.
    lfr_labels(frame_labels, num_rows, stack, subsample) -> int16 labels of the low-frame-rate
        rows at offset 0 (the centre source frame of each stacked row).
    read_align_labels(storage, align_dir) -> (ContextTree, {utt_id: int16 per-frame classes})
        features.labels=align: `amflow align`'s network-tree leaves per 10 ms frame
        (alignments/*.parquet, column nn_senones) and its tree (nn_tree.json).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from core.config import FeaturesConfig
from core.senones import ContextTree
from core.storage import Storage, join

UNK = "<unk>"


@dataclass
class Alignment:
    starts: np.ndarray  # float64 seconds, sorted
    ends: np.ndarray
    phones: list[str]

    def phone_ids(self, phone_ids: dict[str, int]) -> np.ndarray:
        unk = phone_ids[UNK]
        return np.array([phone_ids.get(p, unk) for p in self.phones], dtype=np.int16)


def read_ctm(text: str) -> tuple[dict[str, Alignment], list[tuple[int, str, str]]]:
    raw: dict[str, list[tuple[float, float, str]]] = {}
    bad: dict[str, tuple[int, str]] = {}
    errors: list[tuple[int, str, str]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith(";;") or s.startswith("#"):
            continue
        parts = s.split()
        utt = parts[0]
        if len(parts) < 5:
            errors.append((lineno, utt, f"line {lineno}: expected 5 fields, got {len(parts)}"))
            bad.setdefault(utt, (lineno, "short line"))
            continue
        try:
            start, dur = float(parts[2]), float(parts[3])
        except ValueError:
            errors.append((lineno, utt, f"line {lineno}: start/duration not numbers: {s[:80]}"))
            bad.setdefault(utt, (lineno, "bad number"))
            continue
        if not (math.isfinite(start) and math.isfinite(dur)) or start < 0 or dur < 0:
            errors.append((lineno, utt, f"line {lineno}: bad start {start} or duration {dur}"))
            bad.setdefault(utt, (lineno, "bad interval"))
            continue
        if dur == 0:  # an empty segment labels no frame
            continue
        raw.setdefault(utt, []).append((start, start + dur, parts[4]))
    out: dict[str, Alignment] = {}
    for utt, segs in raw.items():
        if utt in bad:
            continue
        segs.sort(key=lambda t: t[0])
        out[utt] = Alignment(np.array([a for a, _, _ in segs], dtype=np.float64),
                             np.array([b for _, b, _ in segs], dtype=np.float64),
                             [p for _, _, p in segs])
    return out, errors


def ctm_utt_ids(text: str) -> set[str]:
    ids = set()
    for line in text.splitlines():
        s = line.strip()
        if s and not s.startswith(";;") and not s.startswith("#"):
            ids.add(s.split(None, 1)[0])
    return ids


def parse_phones_txt(text: str) -> list[str]:
    entries: list[tuple[int, int, str]] = []
    for i, line in enumerate(text.splitlines()):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        parts = s.split()
        order = i
        if len(parts) >= 2:
            try:
                order = int(parts[1])
            except ValueError:
                order = i
        entries.append((order, i, parts[0]))
    entries.sort()
    seen: set[str] = set()
    out = []
    for _, _, p in entries:
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def build_inventory(phones_txt: list[str] | None, alignments: dict[str, Alignment]) -> list[str]:
    if phones_txt:
        inv = list(phones_txt)
    else:
        inv = sorted({p for a in alignments.values() for p in a.phones} - {UNK})
    if UNK not in inv:
        inv.append(UNK)
    return inv


def load_inventory(storage: Storage, corpus_root: str,
                   alignments: dict[str, Alignment]) -> list[str]:
    uri = join(corpus_root, "phones.txt")
    phones = parse_phones_txt(storage.read_text(uri)) if storage.exists(uri) else None
    return build_inventory(phones, alignments)


def frame_labels(alignment: Alignment, num_frames: int, phone_ids: dict[str, int],
                 fcfg: FeaturesConfig) -> tuple[np.ndarray | None, str | None, str]:
    """int16 [num_frames] labels at 100 Hz, or (None, "alignment_mismatch", detail)."""
    return frame_labels_ids(alignment.starts, alignment.ends, alignment.phone_ids(phone_ids),
                            num_frames, fcfg)


def frame_labels_ids(starts: np.ndarray, ends: np.ndarray, ids: np.ndarray, num_frames: int,
                     fcfg: FeaturesConfig) -> tuple[np.ndarray | None, str | None, str]:
    """frame_labels for segments whose phones are already class ids."""
    if num_frames <= 0:
        return np.zeros(0, np.int16), None, ""
    shift = fcfg.frame_shift_ms / 1000.0
    length = fcfg.frame_length_ms / 1000.0
    tol = fcfg.align_tolerance_s
    centres = np.arange(num_frames) * shift + (length / 2 if fcfg.snip_edges else shift / 2)
    audio_end = (num_frames - 1) * shift + (length if fcfg.snip_edges else shift)
    if len(starts) == 0:
        return None, "alignment_mismatch", "empty alignment"
    if ends.max() > audio_end + tol:
        return None, "alignment_mismatch", (f"alignment ends at {ends.max():.3f} s, "
                                            f"audio at {audio_end:.3f} s")
    # the last segment starting at or before each frame centre
    k = np.searchsorted(starts, centres, side="right") - 1
    kc = np.clip(k, 0, len(starts) - 1)
    inside = (k >= 0) & (centres < ends[kc])
    # distance to the previous segment's end and the next segment's start
    d_prev = np.where(k >= 0, centres - ends[kc], np.inf)
    nxt = np.clip(k + 1, 0, len(starts) - 1)
    d_next = np.where(k + 1 < len(starts), starts[nxt] - centres, np.inf)
    use_next = d_next < d_prev
    choice = np.where(inside, kc, np.where(use_next, nxt, kc))
    dist = np.where(inside, 0.0, np.minimum(d_prev, d_next))
    worst = float(dist.max())
    if worst > tol:
        t = int(np.argmax(dist))
        return None, "alignment_mismatch", (f"frame {t} ({centres[t]:.3f} s) is {worst:.3f} s "
                                            f"from any aligned phone (tolerance {tol} s)")
    return ids[choice].astype(np.int16), None, ""


def lfr_labels(frame_labels: np.ndarray, num_rows: int, stack: int,
               subsample: int | None = None) -> np.ndarray:
    step = subsample or stack
    idx = np.minimum(np.arange(num_rows) * step + stack // 2, len(frame_labels) - 1)
    return frame_labels[idx].astype(np.int16)


class AlignOutputsError(ValueError):
    pass


def read_align_labels(storage: Storage, align_dir: str
                      ) -> tuple[ContextTree, dict[str, np.ndarray]]:
    tree_uri = join(align_dir, "nn_tree.json")
    if not storage.exists(tree_uri):
        raise AlignOutputsError(f"{tree_uri} not found: features.labels=align needs "
                                "`amflow align` (this version) run first")
    tree = ContextTree.from_dict(storage.read_json(tree_uri))
    labels: dict[str, np.ndarray] = {}
    for uri in storage.list(join(align_dir, "alignments"), suffix=".parquet"):
        t = storage.read_parquet(uri, columns=["utt_id", "nn_senones"])
        for u, lab in zip(t.column("utt_id").to_pylist(), t.column("nn_senones").to_pylist()):
            labels[u] = np.asarray(lab, np.int16)
    return tree, labels
