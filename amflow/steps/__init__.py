"""The steps layer: one module per `amflow <step>`, each a thin, importable `run`.

    amflow/steps/<step>.py   def run(ctx: StepContext, args) -> dict  (the step's summary)

A step's `run` (with the services steps share, amflow/services/: a step never imports
another step) is the only place that knows the run layout: it resolves its inputs through
`ctx` (`ctx.require(step)`, `ctx.other(step, ...)`, `core.runs.step_dir_name` for tagged
folders), calls the libraries (`tasks/`, `training/`, `decoding/`, `serving/`, `alignment/`)
with typed objects (Config sections, `ModelCard`, arrays, URIs), and ends with
`ctx.finish(...)`. Libraries never import this package: arrows point down only

    amflow.cli -> amflow.steps -> tasks | training | decoding | serving -> amflow (plumbing)

`amflow.steps.registry.STEPS` declares each step once: its name, `amflow.steps.<module>:run`,
its flags, help, inputs and outputs, resources class and the rest; the CLI, the job
runners, placement, pools, the report, the cost model and the DAGs read it. A step run
outside a run (`amflow corpus` without --run-id) gets a `NoRunContext` (its config and
--force) as `ctx`: every step has the one shape `run(ctx, args)`.
"""
