"""App services the steps share: each resolves the run layout (core.runs) into the plain
URIs and values a library takes. Steps import these, never each other.

    amflow.services.compared_runs    a run's decodes and dev curves for decoding.compare
    amflow.services.decoder_setup    a decode's model, LM, lexicon and graph cache, resolved
    amflow.services.train_plan       a training's inputs resolved into the worker plan
    amflow.services.training         `amflow train` / `amflow sequence`: the training itself
    amflow.services.ctc_export       the CTC student's export (amflow export)
    amflow.services.daily_window     the daily_data partitions a student's window learns from
"""
