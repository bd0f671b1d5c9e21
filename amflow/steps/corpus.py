"""`amflow corpus`: synthesise the embedded espeak-ng corpus (`tasks.corpus.build_corpus`)."""
from __future__ import annotations

from typing import Any

from tasks.corpus import build_corpus


def run(ctx: Any, args: Any) -> dict:
    """CLI entry: `amflow corpus --config C --out URI [--force]` (a run's context with
    --run-id, else one without a run: the corpus root is its output either way)."""
    cfg, force = ctx.cfg, bool(getattr(args, "force", False) or ctx.force)
    out = getattr(args, "out", None) or cfg.data.corpus
    return build_corpus(cfg, out, force=force, use_ray=True)
