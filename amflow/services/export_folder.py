"""Where `amflow export` writes a model's graphs, and where `amflow serve` finds them: the
folder follows the model, so exports of different models never overwrite each other."""
from __future__ import annotations

import os
import posixpath

from core.runs import StepContext, step_dir_name
from core.storage import digest_of


def run_folder(ctx: StepContext, uri: str) -> str | None:
    """The folder of this run that holds the model at `uri` (train, train-ctc, ...), None
    when it is not directly in one of the run's folders."""
    run = ctx.run_uri.rstrip("/")
    if "://" not in uri and "://" not in run:  # local paths: relative or absolute alike
        uri, run = os.path.abspath(uri), os.path.abspath(run)
    folder = posixpath.dirname(uri.replace("\\", "/"))
    return posixpath.basename(folder) if posixpath.dirname(folder) == run else None


def export_dir_name(ctx: StepContext, uri: str, data: bytes) -> str:
    """Where the export of the model at `uri` (bytes `data`) goes: export-<decode.tag>
    when tagged (as documented); untagged, the folder follows the model (train ->
    export, train-<t> -> export-<t>, any other run folder F -> export-F, outside the run
    -> export-model-<digest>), so an untagged CTC export (train-ctc) no longer overwrites
    the hybrid student's export/. An untagged export at another decode.chunking than the
    model's own gets the chunking as a suffix (export-conformer-4x8), so it does not
    overwrite the model's own either."""
    tag = ctx.cfg.decode.tag
    if tag:
        return step_dir_name("export", tag)
    folder = run_folder(ctx, uri)
    if folder is None:
        return f"export-model-{digest_of(data)}"
    name = "export" if folder == "train" else step_dir_name("export", folder.removeprefix("train-"))
    chunking = ctx.cfg.decode.chunking
    return f"{name}-{chunking}" if chunking else name
