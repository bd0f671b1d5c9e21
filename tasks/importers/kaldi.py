"""A Kaldi data directory -> entries (pure: the files' text in, `Parsed` out).

    wav.scp    <rec_id> <path>            (required; without `segments` rec_id = utt_id)
    utt2spk    <utt_id> <speaker_id>      (required)
    text       <utt_id> <words...>        (optional; an utterance without a line is
                                            untranscribed, one with no words is empty_text)
    segments   <utt_id> <rec_id> <start_s> <end_s>   (optional; end -1 = to the end)
    reco2dur   <rec_id> <seconds>         (optional; checked against the audio header)
    utt2dur    <utt_id> <seconds>         (optional; checked against the cut length)

wav.scp commands (`... |`) are not run: `flac -c -d -s FILE |` (the LibriSpeech recipes'
form) is read as FILE, any other command is a `wav_scp_pipe_unsupported` reject.

Items in: one per line of the file that lists utterances (`segments`, else `wav.scp`),
plus utterance ids that only `utt2spk` or `text` name (rejects: missing_audio).
"""
from __future__ import annotations

import math
import posixpath
import shlex
from dataclasses import dataclass, field

from tasks.importers.entries import Entry, Parsed, resolve_audio

REQUIRED = ("wav.scp", "utt2spk")
OPTIONAL = ("text", "segments", "reco2dur", "utt2dur")
# flac options that only make it decode one file to stdout quietly: safe to skip the process.
_FLAC_LONG = {"--decode", "--stdout", "--silent", "--force"}
_FLAC_SHORT = set("cdsf")


@dataclass
class Table:
    """One Kaldi `key value` file: first value per key, in order, with its repeats."""

    name: str
    values: dict[str, str] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    repeats: list[tuple[str, int]] = field(default_factory=list)  # (key, line number)
    conflicts: dict[str, str] = field(default_factory=dict)  # key -> why (a differing repeat)

    def get(self, key: str) -> str | None:
        return self.values.get(key)


def parse_table(text: str, name: str) -> Table:
    table = Table(name)
    for lineno, line in enumerate(text.splitlines(), 1):
        parts = line.strip().split(None, 1)
        if not parts:
            continue
        key, value = parts[0], (parts[1].strip() if len(parts) > 1 else "")
        if key not in table.values:
            table.values[key] = value
            table.order.append(key)
            continue
        table.repeats.append((key, lineno))
        if value != table.values[key] and key not in table.conflicts:
            table.conflicts[key] = (f"{name} line {lineno}: {key} again with another value "
                                    f"({value!r:.80} vs {table.values[key]!r:.80})")
    return table


def wav_path(value: str) -> tuple[str | None, str, str]:
    """A wav.scp value -> (path, "", "") or (None, reason, detail)."""
    value = value.strip()
    if not value:
        return None, "missing_audio", "empty wav.scp entry"
    if not value.endswith("|"):
        return value, "", ""
    try:
        argv = shlex.split(value[:-1])
    except ValueError as exc:
        return None, "wav_scp_pipe_unsupported", f"{value!r:.120}: {exc}"
    if argv and posixpath.basename(argv[0]) == "flac":
        files = [a for a in argv[1:] if not _flac_flag(a)]
        if len(files) == 1 and files[0] != "-" and not files[0].startswith("-"):
            return files[0], "", ""
    return None, "wav_scp_pipe_unsupported", (
        f"{value!r:.160}: only `flac -c -d -s FILE |` is read (as FILE); convert the audio "
        f"to files and list their paths")


def _flac_flag(arg: str) -> bool:
    if arg in _FLAC_LONG:
        return True
    return len(arg) > 1 and arg[0] == "-" and arg[1] != "-" and set(arg[1:]) <= _FLAC_SHORT


def _seconds(value: str | None) -> float | None:
    try:
        v = float(value) if value is not None else None
    except ValueError:
        return None
    return v if v is not None and math.isfinite(v) else None


def parse_segment(value: str) -> tuple[tuple[str, float, float | None] | None, str]:
    """`rec start end` -> ((rec, start, end or None for -1), "") or (None, why)."""
    parts = value.split()
    if len(parts) != 3:
        return None, f"want `<utt> <rec> <start> <end>`, got {value!r:.80}"
    start, end = _seconds(parts[1]), _seconds(parts[2])
    if start is None or end is None:
        return None, f"start/end are not numbers: {value!r:.80}"
    if start < 0:
        return None, f"start {start} < 0"
    if end == -1:
        return (parts[0], start, None), ""
    if end <= start:
        return None, f"start {start} end {end}: need 0 <= start < end"
    return (parts[0], start, end), ""


def parse_kaldi_dir(texts: dict[str, str], base: str) -> Parsed:
    """Kaldi files' text (name -> text; `wav.scp` and `utt2spk` required) -> Parsed.
    `base` resolves relative audio paths (the data dir, or ingest.audio_root)."""
    for name in REQUIRED:
        if name not in texts:
            raise ValueError(f"a Kaldi data directory needs {name}")
    tables = {name: parse_table(text, name) for name, text in texts.items()}
    primary = tables.get("segments") or tables["wav.scp"]
    out = Parsed()
    order = list(primary.order)
    seen = set(order)
    for name in ("utt2spk", "text"):
        for utt in tables[name].order if name in tables else []:
            if utt not in seen:
                seen.add(utt)
                order.append(utt)
    out.items_in = len(order) + len(primary.repeats)
    for utt, lineno in primary.repeats:
        out.reject(utt, "duplicate_utt_id", f"{primary.name} line {lineno} repeats {utt}")
    for utt in order:
        entry = _kaldi_entry(utt, tables, base, out)
        if entry is not None:
            out.entries.append(entry)
    return out


def _kaldi_entry(utt: str, tables: dict[str, Table], base: str, out: Parsed) -> Entry | None:
    """One utterance's entry, or None after recording its reject in `out`."""
    segments, wavs = tables.get("segments"), tables["wav.scp"]
    rec, start, end, where = utt, 0.0, None, f"wav.scp:{utt}"
    for t in (segments or wavs, tables["utt2spk"], tables.get("text"), tables.get("utt2dur")):
        if t is not None and utt in t.conflicts:
            return out.reject(utt, "duplicate_utt_id", t.conflicts[utt])
    if segments is not None:
        if utt not in segments.values:
            return out.reject(utt, "missing_audio", "no line in segments")
        seg, why = parse_segment(segments.values[utt])
        if seg is None:
            return out.reject(utt, "bad_segment", f"segments: {why}")
        rec, start, end = seg
        where = f"segments:{utt}"
    if rec in wavs.conflicts:
        return out.reject(utt, "duplicate_utt_id", wavs.conflicts[rec])
    if rec not in wavs.values:
        return out.reject(utt, "missing_audio", f"recording {rec} has no line in wav.scp")
    path, reason, detail = wav_path(wavs.values[rec])
    if path is None:
        return out.reject(utt, reason, detail)
    speaker = tables["utt2spk"].get(utt)
    if not speaker:
        return out.reject(utt, "no_speaker", "no speaker in utt2spk")
    text = tables["text"].get(utt) if "text" in tables else None
    if text is not None and not text.strip():
        return out.reject(utt, "empty_text", "the line in text has no words")
    durs = [tables[n].get(k) if n in tables else None
            for n, k in (("utt2dur", utt), ("reco2dur", rec))]
    for name, value in zip(("utt2dur", "reco2dur"), durs):
        if value is not None and (_seconds(value) is None or _seconds(value) <= 0):
            return out.reject(utt, "malformed_entry", f"{name}: {value!r:.40} is not seconds")
    return Entry(utt, speaker, text, resolve_audio(base, path), rec, start, end,
                 expected_s=_seconds(durs[0]), recording_s=_seconds(durs[1]), where=where)
