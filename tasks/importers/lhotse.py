"""lhotse manifests -> entries (pure: JSONL text in, `Parsed` out; lhotse not imported).

    recordings   {"id", "sources": [{"type": "file", "channels": [0], "source": PATH}],
                  "sampling_rate", "num_samples", "duration", "channel_ids", "transforms"?}
    supervisions {"id", "recording_id", "start", "duration", "channel" (int, list or
                  absent), "text"?, "speaker"?, "language"?, ...}

One item per supervision line. Sources of another type (url, command, memory, shar) are
`unsupported_source` rejects; recording transforms other than `Resample` (the writer
resamples to 16 kHz anyway) are `unsupported_transform`. The manifest's recording
duration is checked against the audio header by the writer (`recording_s`).
"""
from __future__ import annotations

import json
import math
from typing import Any

from tasks.importers.entries import Entry, Parsed, resolve_audio

_Problem = tuple[str, str]  # (reason, detail) that every supervision of a recording gets


def _json_lines(text: str) -> list[tuple[int, Any, str]]:
    """(line number, parsed object or None, error) for each non-blank line."""
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((lineno, json.loads(line), ""))
        except json.JSONDecodeError as exc:
            out.append((lineno, None, f"not JSON: {exc.msg} at column {exc.colno}"))
    return out


def parse_recordings(text: str) -> tuple[dict[str, dict], dict[str, _Problem]]:
    """Recording id -> its JSON object; recording id -> problem (duplicate, malformed)."""
    recs: dict[str, dict] = {}
    problems: dict[str, _Problem] = {}
    for lineno, obj, err in _json_lines(text):
        rid = obj.get("id") if isinstance(obj, dict) else None
        if not isinstance(rid, str) or not rid:
            continue  # no id: no supervision can name it; theirs become missing_audio
        if rid in recs and obj != recs[rid]:
            problems.setdefault(rid, ("duplicate_utt_id", f"recordings line {lineno}: "
                                      f"recording {rid} again with other values"))
        recs.setdefault(rid, obj)
        if not isinstance(obj.get("sources"), list) or not obj["sources"]:
            problems.setdefault(rid, ("malformed_entry", f"recordings line {lineno}: "
                                      f"recording {rid} has no sources"))
    return recs, problems


def _source(rec: dict, channel: Any) -> tuple[str, tuple[int, ...] | None, _Problem | None]:
    """(path, channels of that file or None for all, None) for the file holding
    `channel`, or ("", None, problem)."""
    for t in rec.get("transforms") or []:
        name = t.get("name") if isinstance(t, dict) else t
        if name != "Resample":
            return "", None, ("unsupported_transform",
                              f"recording {rec['id']}: transform {name!r:.40}")
    all_ids = [c for s in rec["sources"] if isinstance(s, dict) for c in s.get("channels", [])]
    wanted = all_ids if channel is None else (channel if isinstance(channel, list) else [channel])
    for src in rec["sources"]:
        chans = src.get("channels", []) if isinstance(src, dict) else []
        if not wanted or not set(wanted) <= set(chans):
            continue
        if src.get("type") != "file" or not isinstance(src.get("source"), str):
            return "", None, ("unsupported_source", f"recording {rec['id']}: source type "
                                                    f"{src.get('type')!r:.20}; only files are read")
        idx = tuple(chans.index(c) for c in wanted)
        return src["source"], (None if sorted(idx) == list(range(len(chans))) else idx), None
    return "", None, ("unsupported_source", f"recording {rec['id']}: channels {wanted} are "
                                            f"not all in one source file")


def _number(v: Any) -> float | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


def parse_lhotse(recordings: str, supervisions: str, base: str) -> Parsed:
    """Recordings and supervisions JSONL text -> Parsed; `base` resolves relative paths."""
    recs, problems = parse_recordings(recordings)
    out = Parsed()
    seen: set[str] = set()
    for lineno, sup, err in _json_lines(supervisions):
        out.items_in += 1
        sid = sup.get("id") if isinstance(sup, dict) else None
        if not isinstance(sid, str) or not sid:
            out.reject(f"supervisions:{lineno}", "malformed_entry",
                       err or f"supervisions line {lineno}: no string `id`")
            continue
        if sid in seen:
            out.reject(sid, "duplicate_utt_id", f"supervisions line {lineno} repeats {sid}")
            continue
        seen.add(sid)
        entry = _lhotse_entry(sid, sup, recs, problems, base, out)
        if entry is not None:
            entry.where = f"supervisions:{lineno}"
            out.entries.append(entry)
    return out


def _lhotse_entry(sid: str, sup: dict, recs: dict[str, dict], problems: dict[str, _Problem],
                  base: str, out: Parsed) -> Entry | None:
    rid = sup.get("recording_id")
    if rid not in recs:
        return out.reject(sid, "missing_audio", f"recording {rid!r:.80} is not in the "
                          f"recordings manifest")
    if rid in problems:
        return out.reject(sid, *problems[rid])
    rec = recs[rid]
    path, channels, problem = _source(rec, sup.get("channel"))
    if problem is not None:
        return out.reject(sid, *problem)
    start, dur = _number(sup.get("start", 0.0)), _number(sup.get("duration"))
    if start is None or dur is None or start < 0 or dur <= 0:
        return out.reject(sid, "bad_segment", f"start {sup.get('start')!r:.20} duration "
                          f"{sup.get('duration')!r:.20}: need start >= 0, duration > 0")
    speaker = sup.get("speaker")
    if not isinstance(speaker, str) or not speaker.strip():
        return out.reject(sid, "no_speaker", "supervision has no speaker")
    text = sup.get("text")
    if text is not None and (not isinstance(text, str) or not text.strip()):
        return out.reject(sid, "empty_text", f"supervision text {text!r:.40}")
    rec_s = _number(rec.get("duration"))
    # A supervision spanning the whole recording needs no cut (lhotse rounds durations).
    whole = start == 0 and rec_s is not None and abs(dur - rec_s) < 1e-3
    return Entry(sid, speaker.strip(), text, resolve_audio(base, path), rid, start,
                 None if whole else start + dur, channels, recording_s=rec_s)
