"""`amflow import`: a Kaldi data directory or lhotse manifests -> a corpus in the input format.

    amflow import --from kaldi  --src DATA_DIR --out CORPUS_URI
    amflow import --from lhotse --src DIR | --recordings F --supervisions F --out CORPUS_URI

Config: `ingest.*` (split, locale, lexicon, created_at, condition, audio_root, copy_audio,
workers). No run: like `amflow corpus`, it writes a corpus root, not runs/<id>/. The
library is tasks.importers; this module only turns the flags into a `Source`.
"""
from __future__ import annotations

from typing import Any

from core.config import Config
from core.runs import StepError
from core.storage import Storage
from tasks.importers import find_lhotse, import_corpus, read_kaldi, read_lhotse


def run(cfg: Any, args: Any) -> dict:
    force = bool(getattr(args, "force", False))
    if not isinstance(cfg, Config):  # called with a StepContext when --run-id is given
        force = force or bool(getattr(cfg, "force", False))
        cfg = cfg.cfg
    storage = Storage(cfg.storage)
    fmt = getattr(args, "source_format", None)
    src = getattr(args, "src", None)
    recordings, supervisions = getattr(args, "recordings", None), getattr(args, "supervisions",
                                                                          None)
    root = cfg.ingest.audio_root
    if fmt == "kaldi":
        if not src:
            raise StepError("--from kaldi needs --src DATA_DIR (with wav.scp, utt2spk, ...)")
        source = read_kaldi(storage, src.rstrip("/"), root)
    elif fmt == "lhotse":
        if not (recordings and supervisions):
            if not src:
                raise StepError("--from lhotse needs --recordings F --supervisions F, or "
                                "--src DIR holding one of each")
            found = find_lhotse(storage, src.rstrip("/"))
            recordings, supervisions = recordings or found[0], supervisions or found[1]
        source = read_lhotse(storage, recordings, supervisions, root)
    else:
        raise StepError(f"--from must be kaldi or lhotse, got {fmt!r}")
    out = (getattr(args, "out", None) or cfg.data.corpus).rstrip("/")
    return import_corpus(storage, source, out, cfg.ingest, force=force)
