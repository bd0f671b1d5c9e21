"""`amflow import`: Kaldi data directories or lhotse manifests -> a corpus in the input format.

    amflow import --from kaldi  --src [SPLIT=]DATA_DIR [--src SPLIT=DATA_DIR ...] --out CORPUS
    amflow import --from lhotse --src [SPLIT=]DIR ... | --recordings F --supervisions F --out C

SPLIT is labeled (or train, Kaldi's name for it), unlabeled, dev or test; without it, the
source's split is `ingest.split`. Each split is its own import under the corpus root: a
later import adds splits beside the ones there, and replaces one only with --force.

Config: `ingest.*` (split, locale, lexicon, created_at, condition, clean, audio_root,
copy_audio, workers). No run: like `amflow corpus`, it writes a corpus root, not
runs/<id>/. The library is tasks.importers; this module only turns the flags into
`Source`s.
"""
from __future__ import annotations

from typing import Any

from core.config import Config
from core.runs import StepContext, StepError
from core.storage import Storage
from tasks.importers import find_lhotse, import_sources, read_kaldi, read_lhotse

SPLITS = ("labeled", "unlabeled", "dev", "test")
ALIASES = {"train": "labeled"}  # Kaldi recipes' data/train


def split_source(value: str, default: str) -> tuple[str, str]:
    """`SPLIT=DIR` -> (split, DIR); a plain DIR (also one with '=' in it that does not
    start with a split's name) -> (default, DIR)."""
    head, sep, tail = value.partition("=")
    if sep and (head in SPLITS or head in ALIASES):
        if not tail.strip():
            raise StepError(f"--src {value}: no directory after '{head}='")
        return ALIASES.get(head, head), tail
    return default, value


def _sources(cfg: Config, storage: Storage, args: Any) -> dict[str, Any]:
    fmt = getattr(args, "source_format", None)
    srcs = getattr(args, "src", None) or []
    if isinstance(srcs, str):
        srcs = [srcs]
    recordings, supervisions = getattr(args, "recordings", None), getattr(args, "supervisions",
                                                                          None)
    root = cfg.ingest.audio_root
    if fmt not in ("kaldi", "lhotse"):
        raise StepError(f"--from must be kaldi or lhotse, got {fmt!r}")
    if fmt == "kaldi" and not srcs:
        raise StepError("--from kaldi needs --src DATA_DIR (with wav.scp, utt2spk, ...), or "
                        "several: --src labeled=DIR --src dev=DIR --src test=DIR")
    if fmt == "lhotse" and (recordings or supervisions):
        if not (recordings and supervisions) and len(srcs) != 1:
            raise StepError("--from lhotse needs --recordings F --supervisions F, or "
                            "--src DIR holding one of each")
        if len(srcs) > 1:
            raise StepError("--recordings/--supervisions name one source: with several "
                            "--src, give each a folder of manifests")
    if fmt == "lhotse" and not srcs and not (recordings and supervisions):
        raise StepError("--from lhotse needs --recordings F --supervisions F, or "
                        "--src DIR holding one of each")
    sources: dict[str, Any] = {}
    for value in srcs or [""]:
        split, src = split_source(value, cfg.ingest.split) if value else (cfg.ingest.split, "")
        if split in sources:
            raise StepError(f"two sources for split {split} (--src): one import reads one "
                            f"source per split; merge them into one directory")
        src = src.rstrip("/")
        if fmt == "kaldi":
            sources[split] = read_kaldi(storage, src, root)
            continue
        recs, sups = recordings, supervisions
        if not (recs and sups):
            found = find_lhotse(storage, src)
            recs, sups = recs or found[0], sups or found[1]
        sources[split] = read_lhotse(storage, recs, sups, root)
    return sources


def run(cfg: Config | StepContext, args: Any) -> dict:
    force = bool(getattr(args, "force", False))
    if not isinstance(cfg, Config):  # called with a StepContext when --run-id is given
        force = force or bool(getattr(cfg, "force", False))
        cfg = cfg.cfg
    storage = Storage(cfg.storage)
    sources = _sources(cfg, storage, args)
    out = (getattr(args, "out", None) or cfg.data.corpus).rstrip("/")
    return import_sources(storage, sources, out, cfg.ingest, force=force)
