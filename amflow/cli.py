"""`amflow <step> --config FILE --run-id ID [--set key=value ...]`

The exact command a container, a Ray job or an Airflow task runs. Step modules are
imported only when their step runs, so `--help` is instant. The last line a step
prints on stdout is `AMFLOW_SUMMARY <json>`: its metrics, which Airflow keeps as XCom;
the line before it says the same for people (amflow.summary_line).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

# STEPS and Step live in the registry; amflow.cli.STEPS / .Step stay importable from here
from amflow.steps.registry import STEPS, Step, load_entry, step_context  # noqa: F401
from core.config import ConfigError

SUMMARY_PREFIX = "AMFLOW_SUMMARY "
# The config a command without --config reads: AMFLOW_CONFIG (the DAGs' default too), else
# configs/local.yaml when present. With it set, `amflow <step> --run-id R` finds run R under
# that config's storage.root and runs with what the run remembers (amflow.run_settings).
DEFAULT_CONFIG = "configs/local.yaml"
CONFIG_ENV = "AMFLOW_CONFIG"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="amflow",
        description="amflow: a semi-supervised teacher/student acoustic-model factory.\n"
                    "Every step reads and writes under <storage.root>/runs/<run-id>/<step>/.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(f"  {name:<12} {s.help}\n  {'':<12}   reads:  {s.reads}\n"
                         f"  {'':<12}   writes: {s.writes}" for name, s in STEPS.items()))
    sub = parser.add_subparsers(dest="step", metavar="<step>", required=True)
    for name, step in STEPS.items():
        p = sub.add_parser(name, help=step.help,
                           description=f"{step.help}.\n\nreads:  {step.reads}\n"
                                       f"writes: {step.writes}",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--config", default=None,
                       help=f"YAML config (default: ${CONFIG_ENV}, else {DEFAULT_CONFIG} if "
                            "present; a run's later steps: the config its first step had)")
        p.add_argument("--run-id", required=step.needs_run and not step.default_run_id,
                       default=None, help="run name; outputs go under runs/<run-id>/")
        p.add_argument("--set", dest="overrides", action="append", default=[],
                       metavar="KEY=VALUE", help="override a config key, e.g. select.hours=2")
        p.add_argument("--force", action="store_true",
                       help="redo shards whose outputs already exist")
        p.add_argument("--log-level", default=os.environ.get("AMFLOW_LOG_LEVEL", "INFO"))
        if step.add_args:
            step.add_args(p)
    return parser


def _step_name(args: argparse.Namespace) -> str:
    """`amflow config show --step S`: the step S names (a folder like train-teacher too)."""
    name = args.show_step or ""
    while name and name not in STEPS:
        name = name.rpartition("-")[0]
    if args.show_step and not name:
        raise SystemExit(f"amflow config: --step {args.show_step!r} names no step "
                         f"(known: {', '.join(STEPS)})")
    return name or "config"


def _record_config(ctx: Any, resolved: Any, argv: list[str] | None, summary: Any = None) -> None:
    """A finished step keeps the config it ran with, each set key's source beside it
    (`amflow config show --run-id R --step S` prints it); in the folder its summary names
    when that is one of this step's (export's follows its model), else its tag's."""
    from core.config.explain import CONFIG_RECORD, record
    from core.runs import SUCCESS, step_dir_of

    named = summary.get("step", "") if isinstance(summary, dict) else ""
    mine = named == ctx.step or named.startswith(ctx.step + "-")
    folder = named if mine else step_dir_of(ctx.step, resolved.config)
    if ctx.storage.exists(ctx.other(folder, SUCCESS)):
        ctx.storage.write_json(ctx.other(folder, CONFIG_RECORD),
                               record(resolved, sys.argv[1:] if argv is None else argv))


def _absolute(path: str | None) -> str | None:
    return str(Path(path).resolve()) if path else None


def _settle(args: argparse.Namespace, step: Step) -> tuple[Any, Any, list, str | None]:
    """The resolved config and its path, and for a step of a run the run's remembered
    settings (amflow.run_settings: `--run-id` alone finds the run's config and sets)."""
    default = os.environ.get(CONFIG_ENV) or (
        DEFAULT_CONFIG if Path(DEFAULT_CONFIG).exists() else None)
    if not (step.needs_run and step.in_a_run):
        from amflow.model_size import resolve_sized

        path = args.config or default
        return resolve_sized(path, [*(args.overrides or []), *step.sets]), None, [], path
    from amflow.run_settings import settle

    return settle(args.config, default, args.overrides or [], list(step.sets), args.run_id,
                  args.step, args.force, names_model=bool(getattr(args, "model", None)))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    step = STEPS[args.step]
    args.step_sets = list(STEPS[_step_name(args)].sets) if args.step == "config" else []
    try:
        resolved, settings, forced, args.config_path = _settle(args, step)
    except ConfigError as exc:
        print(f"amflow {args.step}: {exc}", file=sys.stderr)
        return 2
    from core.runs import StepError, step_dir_of

    try:
        ctx = step_context(args.step, resolved.config, args.run_id, force=args.force)
        if settings is not None and ctx.run_id:  # the run remembers what it was given
            settings.remember(_absolute(args.config_path), args.overrides or [], args.step,
                              forced, step_dir_of(args.step, resolved.config))
            from amflow.model_size import remember_size  # and the size it chose

            remember_size(ctx.storage, resolved.config, ctx.run_id, resolved)
        summary = load_entry(step.entry)(ctx, args)
        if ctx.run_id:  # a step of a run keeps the config it ran with
            _record_config(ctx, resolved, argv, summary)
    except ConfigError as exc:
        print(f"amflow {args.step}: {exc}", file=sys.stderr)
        return 2
    except StepError as exc:
        print(f"amflow {args.step}: error: {exc}", file=sys.stderr)
        return 1
    from amflow.summary_line import human_summary

    if isinstance(summary, dict):  # for people; the JSON line after it stays the last
        print(human_summary(args.step, summary), flush=True)
    print(SUMMARY_PREFIX + json.dumps(summary, sort_keys=True, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
