"""`amflow bench`: the step's `run`, resolving inputs through the run layout and calling `bench.cli`."""
from __future__ import annotations

import importlib
import json
from typing import Any


def run(ctx, args) -> dict[str, Any]:
    module = importlib.import_module(f"bench.{args.what}")
    result = module.run(ctx, args)
    out = args.out or ctx.path(f"{args.what}.json")
    ctx.storage.write_json(out, result)
    print(json.dumps(result, indent=2, default=str))
    return {"bench": args.what, "out": out, **{k: v for k, v in result.items()
                                                if isinstance(v, (int, float, str))}}
