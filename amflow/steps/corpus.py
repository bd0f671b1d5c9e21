"""`amflow corpus`: synthesise the embedded espeak-ng corpus (`tasks.corpus.build_corpus`)."""
from __future__ import annotations

from typing import Any

from core.config import Config
from core.runs import StepContext
from tasks.corpus import build_corpus


def run(cfg: Config | StepContext, args: Any) -> dict:
    """CLI entry: `amflow corpus --config C --out URI [--force]`."""
    force = bool(getattr(args, "force", False))
    if not isinstance(cfg, Config):  # called with a StepContext when --run-id is given
        force = force or bool(getattr(cfg, "force", False))
        cfg = cfg.cfg
    out = getattr(args, "out", None) or cfg.data.corpus
    return build_corpus(cfg, out, force=force, use_ray=True)
