"""`amflow sequence`: `amflow train` with train.recipe=sequence (the CLI sets it): sMBR /
MMI training of a trained model into runs/<R>/sequence[-<train.tag>]/."""
from __future__ import annotations

from typing import Any

from core.config import ConfigError
from core.runs import StepContext
from amflow.services.training import run_training


def run(ctx: StepContext, args: Any = None) -> dict[str, Any]:
    if ctx.cfg.train.recipe != "sequence":
        raise ConfigError("train.regime", f"is {ctx.cfg.train.recipe}; `amflow sequence` "
                          "runs the sequence regime")
    return run_training(ctx, args)
