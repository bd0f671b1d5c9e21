"""`amflow config show`: every key's effective value and where it came from.

    amflow config show [--config F] [--set k=v ...] [--step S] [--stage grown] [--all]
    amflow config show --run-id R                   the settings run R remembers
    amflow config show --run-id R --step S          what step S of run R ran with

Without --run-id it resolves the config as `amflow S` would (the step's implied settings,
e.g. sequence's train.regime=sequence, included), with `--stage grown` as train.grow's
grown stage trains. With --run-id it prints what that step recorded when it finished
(`<run>/<step>/_config.json`). Only keys not at the schema's default unless --all.
"""
from __future__ import annotations

from typing import Any

from amflow.model_size import resolve_sized
from core.config import Config, grown_stage
from core.config.explain import CONFIG_RECORD, render, rows, rows_of_record
from core.config.sizes import AUTO
from core.runs import SUCCESS, StepError, run_uri
from core.storage import Storage, join


def run(ctx: Any, args: Any) -> dict[str, Any]:
    cfg: Config = ctx.cfg  # never a run's context: --run-id names the run to read
    note = ""
    if args.run_id:
        table, where = _recorded(cfg, args)
    else:
        resolved = resolve_sized(args.config_path, [*args.overrides, *args.step_sets])
        if args.stage == "grown":
            resolved = grown_stage(resolved)
        table, where = rows(resolved, args.all), args.config_path or "defaults"
        if resolved.config.model.size == AUTO:
            note = (f"# model.size auto: the corpus's hours are not known yet (no "
                    f"{join(cfg.data.corpus, SUCCESS)}): no size is laid until they are\n")
    print(f"# amflow config of {where}{'' if args.all else ' (keys set away from defaults)'}")
    print(note + render(table), flush=True)
    return {"keys": len(table), "from": where}


def _recorded(cfg: Config, args: Any) -> tuple[list, str]:
    if not args.show_step:
        return _run_settings(cfg, args)
    uri = join(run_uri(cfg, args.run_id), args.show_step, CONFIG_RECORD)
    st = Storage(cfg.storage)
    if not st.exists(uri):
        raise StepError(f"{uri} not found: step {args.show_step!r} of run {args.run_id!r} "
                        "has not finished with this version of amflow (it records its "
                        "config when it finishes)")
    return rows_of_record(st.read_json(uri), args.all), uri


def _run_settings(cfg: Config, args: Any) -> tuple[list, str]:
    """The run's remembered settings (`<run>/_run.json`): its config file and run-wide
    sets resolved, each key with its source, then the changes forced into it."""
    from amflow.run_settings import RUN_RECORD, RunSettings

    settings = RunSettings.open(cfg, args.run_id)
    uri = join(settings.uri, RUN_RECORD)
    if not settings.known:
        raise StepError(f"{uri} not found: run {args.run_id!r} has no remembered settings "
                        "(its first step ran with an older amflow, or it has not started); "
                        "--step S shows what a finished step ran with")
    resolved = resolve_sized(settings.config_path, [*settings.sets, *args.overrides],
                             args.run_id)
    for entry in settings.record.get("history", []):
        changed = ", ".join(f"{k}: {v[0]!r} -> {v[1]!r}" for k, v in entry["changed"].items())
        print(f"# {entry['time']} {entry['step']} --force: {changed}")
    return rows(resolved, args.all), f"{uri} (config {settings.config_path or 'defaults'})"
