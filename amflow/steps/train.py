"""`amflow train`: train the teacher or the student of a run (amflow/services/training.py;
amflow/services/train_plan.py resolves its inputs into the worker plan; training/launch.py
trains it: Ray Train, priors)."""
from __future__ import annotations

from typing import Any

from core.runs import StepContext
from amflow.services.training import run_training


def run(ctx: StepContext, args: Any = None) -> dict[str, Any]:
    return run_training(ctx, args)
