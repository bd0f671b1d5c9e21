"""The registry of steps: everything amflow knows about a step, declared once, here.

Each `Step` names its run function ("module:function", imported only when the step runs,
so `amflow --help` stays instant), its help, what it reads and writes, its CLI flags, the
config it implies, its resources class, its interval behaviour, where it is placed on a
cluster, where the report lists it and how the cost model scales it. Everything that
used to keep a list of steps reads this one instead:

    amflow.cli                      the parser, the help text, which context a step gets
    amflow.jobs                     the step a job runs (`python -m amflow.jobs run STEP`)
    amflow.placement                the Ray requests of the placed steps
    amflow.orchestration.pools      a step's pool slots (its resources class)
    amflow.orchestration.handback   a per-interval step's `unchanged` check
    amflow.orchestration.intervals  the steps of a daily_data interval
    amflow.steps.report             the report's step order (report_order)
    amflow.cost                     the steps the cost model prices
    dags/amflow_common.py           the steps a DAG task may run, and its pool slots

Adding a step is one module (amflow/steps/<name>.py with `run(ctx, args) -> dict`) and
one `Step` below. Every step has that one run shape: `ctx` is the run's `StepContext`
when the step runs in a run, else a `NoRunContext` (its config and --force, `run_id`
None): `amflow corpus` without --run-id, `amflow config show` always.
"""
from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from core.config import Config

# Resources classes: what a step holds on one machine (amflow.orchestration.pools).
LIGHT = "light"  # I/O and short scoring: a quarter core, beside steps that hold every core
HEAVY = "heavy"  # computes on one core (its shards or actors queue on Ray)
GPU = "gpu"  # a trainer: train.threads x train.workers cores here, GPUs on a cluster
RESOURCES = (LIGHT, HEAVY, GPU)

# Where the report's timings table lists a step's folders (report_order).
DATA = "data"  # the data steps, first, in registry order
MODEL = "model"  # a step that makes a model (train, then sequence training of it)
SCORE = "score"  # a step that scores each model (evaluate, decode)
AFTER = "after"  # after the models
REPORT_PLACES = ("", DATA, MODEL, SCORE, AFTER)
# The demo's models, in the report's order: a tagged step's folder per tag (train-teacher).
REPORT_TAGS = ("teacher", "baseline", "")

# How the cost model (amflow.cost) scales a step's measured rate to a target config.
AUDIO = "audio"  # by audio hours only
STUDENT = "student"  # also by the student model's size
TEACHER = "teacher"  # also by the teacher model's size
STUDENT_EPOCHS = "student_epochs"  # by the student's size and train.epochs
COSTS = ("", AUDIO, STUDENT, TEACHER, STUDENT_EPOCHS)


@dataclass(frozen=True)
class Step:
    entry: str  # "module:function": run(ctx, args) -> the step's summary
    help: str
    reads: str
    writes: str
    resources: str = HEAVY  # LIGHT | HEAVY | GPU
    needs_run: bool = True  # --run-id is required
    default_run_id: str = ""  # --run-id may be left out: this run then (bench)
    in_a_run: bool = True  # False: ctx is never a run's (config reads --run-id itself)
    sets: tuple[str, ...] = ()  # config overrides the step implies (they win over --set)
    add_args: Callable[[argparse.ArgumentParser], None] | None = None
    placed: bool = False  # a DAG's Ray job, placed by ray.step_resources on a cluster
    shard_tasks: bool = False  # runs core.raycluster.map_shards' shard tasks (1 CPU each)
    per_interval: bool = False  # daily_data runs it once per data interval, keyed by inputs
    unchanged: str = ""  # "module:function": finished summary when its inputs are unchanged
    report: str = ""  # REPORT_PLACES: where the report's timings table lists it
    cost: str = ""  # COSTS: how the cost model scales it ("": not priced)
    # config sections, beside its own, whose values its outputs depend on: a run refuses
    # a later change to them once it finished (amflow.run_settings)
    config_sections: tuple[str, ...] = ()
    per_condition: str = ""  # what its summary's bare `per_condition` holds (asset events)

    def __post_init__(self) -> None:
        for name, value, allowed in (("resources", self.resources, RESOURCES),
                                     ("report", self.report, REPORT_PLACES),
                                     ("cost", self.cost, COSTS)):
            if value not in allowed:
                raise ValueError(f"Step {self.entry}: {name}={value!r}, want one of {allowed}")


class UnknownStepError(ValueError):
    """A name that is not a registered step (the message lists the known ones)."""


@dataclass(frozen=True)
class NoRunContext:
    """A step's `ctx` outside a run: its config and --force; no run folder to write."""
    cfg: Any
    step: str
    force: bool = False
    run_id: None = None


def _corpus_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", help="corpus root URI to write (default: data.corpus)")


def _import_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--from", dest="source_format", required=True, choices=["kaldi", "lhotse"],
                   help="input format: a Kaldi data dir, or lhotse recordings + supervisions")
    p.add_argument("--src", action="append", metavar="[SPLIT=]DIR",
                   help="kaldi: the data dir (wav.scp, utt2spk, text, segments, ...); "
                        "lhotse: a folder with one *recordings* and one *supervisions* "
                        ".jsonl[.gz]. SPLIT= (labeled or train, unlabeled, dev, test; "
                        "default ingest.split) names its split; repeat for several splits "
                        "(--src train=D1 --src dev=D2 --src test=D3). Splits already under "
                        "--out stay; one imported there before from other inputs is "
                        "replaced only with --force")
    p.add_argument("--recordings", help="lhotse: the recordings manifest (.jsonl or .jsonl.gz)")
    p.add_argument("--supervisions", help="lhotse: the supervisions manifest")
    p.add_argument("--out", help="corpus root URI to write (default: data.corpus)")


def _evaluate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="model checkpoint URI (default: this run's train output)")
    p.add_argument("--data", help="corpus root URI with alignments.ctm (default: data.corpus)")
    p.add_argument("--split", default="test", help="corpus split to score (default: test)")
    p.add_argument("--out", help="JSON file/URI to write (default: <run>/evaluate/result.json)")


def _decode_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="model checkpoint URI (default: this run's train output)")
    p.add_argument("--data", help="corpus root URI with transcripts (default: data.corpus)")
    p.add_argument("--split", default="test",
                   help="corpus split to decode (default: test; a record without `split` "
                        "is labeled when aligned, else unlabeled)")
    p.add_argument("--out", help="JSON file/URI to write (default: <run>/decode/result.json)")


def _pseudolabel_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="teacher checkpoint URI (default: targets.teacher, else "
                                   "this run's train/model.pt)")


def _compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="run ids; the first is the base the others are tested against")
    p.add_argument("--out", help="also write the comparison as JSON (file or storage URI)")
    p.add_argument("--pair", action="append", metavar="DECODE=BASE_DECODE",
                   help="test each other run's DECODE dir against the base run's BASE_DECODE "
                        "(e.g. decode-student=decode-baseline); without it a decode meets "
                        "the base's of the same name, else the one of the same model kind "
                        "and split")


def _bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("what", choices=["features", "targets", "trainers", "train", "gtc", "decode",
                                    "sequence", "serve", "serve_faults"],
                   help="which benchmark to run")
    p.add_argument("--out", help="where to write the benchmark JSON (default: under the run)")
    p.add_argument("--model", help="decode, serve_faults: model checkpoint URI (default: the run's train/model.pt)")
    p.add_argument("--data", help="decode: corpus root URI (default: data.corpus)")
    p.add_argument("--url", help="serve: the running service (default: http://serve.host:serve.port/)")
    p.add_argument("--streams", help="serve: concurrent stream counts (default 1,5,10,20,40,80)")
    p.add_argument("--seconds", type=float, help="serve: audio seconds per stream (default 20)")
    p.add_argument("--speed", type=float, help="serve: x real time (default 1; 0 = as fast as possible)")
    p.add_argument("--chunk-ms", dest="chunk_ms", type=float, help="serve: chunk size (default 100 ms)")
    p.add_argument("--backends", help="serve: deploy the run's recognizer once per serve.backend "
                                      "listed (torch,onnxruntime) and measure each, side by side "
                                      "(instead of --url)")
    p.add_argument("--models", help="serve: deploy each model.pt listed (e.g. the hybrid student's "
                                    "and the CTC student's) in turn and measure each, side by "
                                    "side (instead of --url)")
    p.add_argument("--knee", action="store_true",
                   help="serve: search the most concurrent streams at p98 <= --bound-ms "
                        "(doubling from the first --streams level, default 10, then bisection)")
    p.add_argument("--bound-ms", dest="bound_ms", type=float,
                   help="serve --knee: the p98 latency bound (default 70 ms)")
    p.add_argument("--repeats", type=int,
                   help="serve --knee: runs per level; a level passes on the median p98 (default 3)")


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="student model.pt URI, or a train step of --run-id "
                   "(train-conformer) (default: the run's train output)")
    p.add_argument("--detach", action="store_true",
                   help="return once deployed: with ray.address set, the app lives on in that "
                        "cluster (a local Ray started here ends with this process)")


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["show"], help="show: each key's value and its source")
    p.add_argument("--step", dest="show_step", default="",
                   help="resolve as `amflow STEP` does (its implied settings included); with "
                        "--run-id: the step folder (e.g. train-teacher) whose recorded config "
                        "to show")
    p.add_argument("--stage", choices=["grown"], help="grown: train.grow's second stage "
                   "(train.grow_preset laid over the training's values)")
    p.add_argument("--all", action="store_true", help="every key, defaults included")


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="a train step of the run (e.g. train-baseline) or a model.pt "
                                    "URI (default: the model decode decodes)")
    p.add_argument("--format", default="onnx", choices=["onnx"], help="what to export to")
    p.add_argument("--quantize", choices=["int8"],
                   help="also write int8 dynamically quantized graphs (*.int8.onnx)")
    p.add_argument("--data", help="corpus with the check utterances (default: data.corpus)")


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="a shipped recipe (supervised, ssl, ssl-from-teacher: "
                                  "configs/recipes/<name>.yaml) or a recipe file's path")
    p.add_argument("--from", dest="from_step", metavar="STEP",
                   help="start at this step of the recipe (its id, e.g. ssl.train, or "
                        "train-ctc); finished steps before it are not looked at")
    p.add_argument("--to", dest="to_step", metavar="STEP", help="stop after this step")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run none")
    p.add_argument("--jobs", type=int, default=2, metavar="N",
                   help="run up to N steps at once where the recipe allows (a step starts "
                        "once its upstream steps are done; 1: one after another, in the "
                        "recipe's order)")
    p.add_argument("--logs", help="the folder for the steps' logs "
                                  "(default: <storage.root>/logs/<run-id>/)")


def _simulate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--measured", help="JSON with measured compute seconds and bytes per "
                   "minibatch per algorithm (default: from this run's train step, if any)")


# The registry: every `amflow <step>`, in the order the CLI's help lists them.
STEPS: dict[str, Step] = {
    "corpus": Step(
        "amflow.steps.corpus:run", "synthesise the embedded espeak-ng speech corpus",
        reads="nothing but config (corpus.*)",
        writes="--out URI: audio/<split>/*.wav, metadata/date=*/bucket=*/part.jsonl, "
               "alignments.ctm, phones.txt, _SUCCESS.json",
        needs_run=False, add_args=_corpus_args, shard_tasks=True, report=DATA),
    "import": Step(
        "amflow.steps.import_corpus:run",
        "bring a Kaldi data dir or lhotse manifests into the input corpus format",
        reads="--src [SPLIT=]DIR (repeatable): Kaldi data dirs (wav.scp, utt2spk, text, "
              "segments, reco2dur, utt2dur) or lhotse manifests (or --recordings/"
              "--supervisions JSONL(.gz)), the audio they name; ingest.* (split, locale, "
              "lexicon, clean)",
        writes="--out URI: metadata/split=*/<source>-part-*.jsonl, audio/<split>/ (cut or "
               "converted audio), _imports/<source>.json (one per split), rejects.parquet, "
               "lexicon.txt (with ingest.lexicon), _SUCCESS.json",
        needs_run=False, add_args=_import_args),
    "select": Step(
        "amflow.steps.select:run", "sample select.hours of audio and shard it by speaker",
        reads="data.corpus metadata/**.jsonl; with select.interval_start/_end only the "
              "metadata/date=* partitions of that data interval (daily_data's runs "
              "<daily.dataset>-YYYY-MM-DD)",
        writes="runs/<id>/select/shards/*.parquet (manifests), rejects/, _SUCCESS.json",
        resources=LIGHT, placed=True, shard_tasks=True, per_interval=True,
        unchanged="amflow.steps.select:unchanged", report=DATA, cost=AUDIO,
        config_sections=("data",)),
    "align": Step(
        "amflow.steps.align:run", "GMM-HMM forced alignment: monophone, tree, triphone senones",
        reads="runs/<id>/select shard manifests (align.splits), the audio, data.lexicon or "
              "<corpus>/lexicon.txt, <corpus>/alignments.ctm (scoring, when present; "
              "training too with align.guide=ctm)",
        writes="runs/<id>/align/alignments/*.parquet (phones, senones per 10 ms frame), "
               "alignments.ctm, tree, final.mdl, mono.mdl, phones.txt, rejects/, _SUCCESS.json",
        placed=True, config_sections=("data",)),
    "features": Step(
        "amflow.steps.features:run", "log-mel fbank, causal CMN, global CMVN, low frame rate",
        reads="runs/<id>/select shard manifests, the audio they point at, alignments.ctm",
        writes="runs/<id>/features/shards/*.parquet, cmvn.json, phones.json, rejects/, "
               "_SUCCESS.json",
        placed=True, shard_tasks=True, per_interval=True,
        unchanged="amflow.steps.features:unchanged", report=DATA, cost=AUDIO),
    "targets": Step(
        "amflow.steps.targets:run", "teacher inference on a Ray actor pool, top-k soft targets",
        reads="runs/<id>/features shards, teacher checkpoint (targets.teacher)",
        writes="runs/<id>/targets/shards/*.parquet (topk_idx int16, topk_logit fp16, topk_len uint8 "
               "with targets.mass < 1; one byte each under targets.codec=sqrt<L>), "
               "_SUCCESS.json with the top-k fidelity report",
        placed=True, per_interval=True, unchanged="amflow.steps.targets:unchanged",
        report=DATA, cost=TEACHER),
    "repartition": Step(
        "amflow.steps.repartition:run", "join features and targets into equal training partitions",
        reads="runs/<id>/features (and targets, when present); with repartition.days or "
              "from_date/to_date also daily_data's partitions runs/<daily.dataset>-YYYY-MM-DD/",
        writes="runs/<id>/repartition/<split>/part-*.parquet, _SUCCESS.json; with a window "
               "window.json (the intervals and their digests) and cmvn.json (the union's)",
        resources=LIGHT, placed=True, shard_tasks=True, report=DATA, cost=AUDIO),
    "train": Step(
        "amflow.steps.train:run", "train the teacher or the student (train.algorithm on Ray Train)",
        reads="runs/<id>/repartition partitions, train.init_model when set (a phone-class "
              "model is grown into the run's leaves); train.model=ctc: the corpus's labeled "
              "and dev transcripts and train.pseudolabels' kept labels",
        writes="runs/<id>/train/ (train-<train.tag> when tagged): checkpoints/, model.pt, "
               "metrics.jsonl, learning_curve.png, _SUCCESS.json; ctc: tokens/ (tokenizer, "
               "tokenised transcripts)",
        resources=GPU, placed=True, report=MODEL, cost=STUDENT_EPOCHS,
        config_sections=("model",)),
    "sequence": Step(
        "amflow.steps.sequence:run", "sequence training (sMBR / MMI) of a trained model",
        reads="runs/<id>/repartition labeled partitions, train.init_model (default: the "
              "run's train[-<train.tag>]/model.pt)",
        writes="runs/<id>/sequence[-<train.tag>]/: checkpoints/, model.pt, metrics.jsonl, "
               "learning_curve.png, _SUCCESS.json (denominator graph size)",
        sets=("train.regime=sequence",), resources=GPU, placed=True, report=MODEL,
        config_sections=("train", "model")),
    "evaluate": Step(
        "amflow.steps.evaluate:run", "frame accuracy and phone error rate per condition",
        reads="--model checkpoint, --data corpus with alignments.ctm, the run's cmvn.json",
        writes="--out JSON (frame_accuracy, per_condition, num_frames, per), _SUCCESS.json",
        add_args=_evaluate_args, resources=LIGHT, placed=True, report=SCORE, cost=STUDENT,
        per_condition="frame_accuracy"),
    "lm": Step(
        "amflow.steps.lm:run", "estimate a word n-gram LM (interpolated Kneser-Ney), ARPA",
        reads="lm.* (lm.source: the text generator for the embedded corpus, the corpus's "
              "labeled transcripts for any other, plus lm.text_file), data.lexicon or "
              "<corpus>/lexicon.txt (vocabulary), the corpus's dev/test transcripts "
              "(perplexity, OOV rate: a WARNING when the LM does not fit them)",
        writes="runs/<id>/lm/lm.arpa, _SUCCESS.json (perplexity, OOV rate)",
        resources=LIGHT, placed=True, report=DATA),
    "decode": Step(
        "amflow.steps.decode:run", "decode a model to words with H o L o G (a CTC model: "
        "T o L o G or greedy); WER per condition",
        reads="--model checkpoint (priors, CMVN, phones; ctc: its tokenizer), --data corpus "
              "(transcripts, audio), data.lexicon or <corpus>/lexicon.txt (hybrid), decode.lm "
              "or runs/<id>/lm/lm.arpa",
        writes="--out JSON (wer, per_condition, ser, acwt, rtf), runs/<id>/decode[-<tag>]/"
               "hyps.jsonl, hyps.parquet, tuning.json, _SUCCESS.json; runs/<id>/graph/<key>/",
        add_args=_decode_args, resources=LIGHT, placed=True, report=SCORE,
        per_condition="wer", config_sections=("lm",)),
    "pseudolabel": Step(
        "amflow.steps.pseudolabel:run",
        "the teacher's words for the unlabeled selection, with confidences; keep the confident",
        reads="--model teacher (default targets.teacher, else runs/<id>/train/model.pt), the "
              "decoder as `amflow decode` builds it (lexicon, decode.lm or runs/<id>/lm/"
              "lm.arpa, graph), runs/<id>/select shards of pseudolabel.split, the transcripts "
              "of pseudolabel.dev_split (acwt and the confidence threshold are chosen there)",
        writes="runs/<id>/pseudolabel/labels/*.parquet (utt_id, text, confidence, am_score, "
               "lm_score, kept, reason), calibration/*.parquet, dev.json, rejects/, "
               "_SUCCESS.json (WER of kept vs dropped vs all, kept share of audio, x real time)",
        add_args=_pseudolabel_args, placed=True, config_sections=("decode", "lm")),
    "serve": Step(
        "amflow.steps.serve:run", "serve a student as a streaming recognizer (Ray Serve, WebSocket)",
        reads="--model student model.pt (CMVN, phones, priors; or a CTC student: its tokenizer), "
              "its run's decoding graph, lexicon and LM (as `amflow decode`), the acwt (a CTC "
              "student's LM weight and blank penalty) decode tuned (decode/result.json)",
        writes="nothing: serves the page at http://<serve.host>:<serve.port>/, the stream "
               "API at ws://.../ws and /stats, until interrupted",
        needs_run=False, add_args=_serve_args),
    "export": Step(
        "amflow.steps.export:run", "export a student to ONNX (the hybrid student: streaming "
        "and whole-utterance graphs; the CTC student: a whole-utterance graph, one "
        "sherpa-onnx loads and (unidirectional) a streaming graph; optional int8), checked "
        "against torch",
        reads="--model a train step or model.pt URI, the run's lexicon, LM and graph (hybrid; "
              "CTC: the LM, when there is one), the acwt (hybrid) or LM weight and blank "
              "penalty (CTC) decode tuned on dev, export.check_split's utterances of "
              "data.corpus",
        writes="runs/<id>/export[-<decode.tag>]/ (untagged: export-<t> for train-<t>): "
               "model.onnx, model.streaming.onnx (hybrid; "
               "CTC: unidirectional, with streaming.json), model.sherpa.onnx + tokens.txt "
               "+ sherpa.json (+ TLG.fst, words.txt with an LM) (CTC) (+ *.int8.onnx), card.json, "
               "classes.txt (hybrid), features.json, decoding.json, checks.json, "
               "_SUCCESS.json (only when the checks pass)",
        add_args=_export_args),
    "simulate": Step(
        "amflow.steps.simulate:run", "project trainer throughput to 16-128 workers",
        reads="measured compute time and bytes per minibatch (train step or --measured)",
        writes="runs/<id>/simulate/table.md, table.json, _SUCCESS.json",
        add_args=_simulate_args, resources=LIGHT, report=AFTER),
    "report": Step(
        "amflow.steps.report:run", "the demo report: Table II per condition, curves, timings",
        reads="evaluate results of teacher, baseline and SSL runs, every step's _SUCCESS.json",
        writes="runs/<id>/report/report.md, report.json, accuracy.png, learning_curves.png",
        resources=LIGHT),
    "compare": Step(
        "amflow.steps.compare:run", "runs side by side: WER with its CI95, deltas with significance",
        reads="runs/<RUN>/decode*/result.json and hyps.jsonl, train*/sequence* metrics.jsonl",
        writes="the table on stdout; --out JSON", needs_run=False, add_args=_compare_args),
    "config": Step(
        "amflow.steps.config_show:run",
        "show the resolved config: each key's value and where it came from",
        reads="--config and --set (presets included), or with --run-id the step's recorded "
              "<run>/<step>/_config.json",
        writes="the table on stdout", needs_run=False, in_a_run=False,
        add_args=_config_args),
    "run": Step(
        "amflow.recipes.executor:run",
        "run a recipe top to bottom (its runs and steps, in one process; resumable)",
        reads="configs/recipes/<recipe>.yaml (or the recipe file given), --config, --set "
              "(each applies to every step)",
        writes="runs/<run-id>-<run>/<step>/ for each run of the recipe, the compare table on "
               "stdout, each step's log in <storage.root>/logs/<run-id>/",
        needs_run=False, in_a_run=False, add_args=_run_args),
    "bench": Step(
        "amflow.steps.bench:run", "benchmarks measured side by side, printed as ratios",
        reads="the run's data (or the embedded corpus)",
        writes="runs/<id>/bench/<what>.json", default_run_id="bench", add_args=_bench_args),
}


def step(name: str) -> Step:
    """The registered step `name`; a clear error naming the known ones otherwise."""
    try:
        return STEPS[name]
    except KeyError:
        raise UnknownStepError(f"{name!r} is not an amflow step (known: "
                               f"{', '.join(STEPS)})") from None


def load_entry(entry: str) -> Callable[..., Any]:
    """The function a "module:function" entry names (its module imported now)."""
    module, func = entry.split(":")
    return getattr(importlib.import_module(module), func)


def step_context(name: str, cfg: Config, run_id: str | None, force: bool = False) -> Any:
    """What `run(ctx, args)` gets: the run's StepContext when the step runs in a run
    (--run-id, or its default run), else a NoRunContext."""
    from core.runs import StepContext  # pyarrow: not at import (`amflow --help`)

    spec = step(name)
    run_id = run_id or spec.default_run_id
    if spec.in_a_run and run_id:
        return StepContext(cfg, run_id, name, force=force)
    return NoRunContext(cfg, name, force=force)


def names(**where: Any) -> tuple[str, ...]:
    """The registered steps whose fields have these values, in registry order:
    names(placed=True), names(resources=LIGHT), names(per_interval=True)."""
    return tuple(n for n, s in STEPS.items()
                 if all(getattr(s, k) == v for k, v in where.items()))


def report_order() -> tuple[str, ...]:
    """Step folders in the order the report's timings table lists them: the data steps;
    then each model step's folder and each scoring step's of its model, per demo model
    (teacher, baseline, student); a scoring step of a later model step's model writes
    `<score>-<model step>` (evaluate-sequence); then the steps after."""
    from core.runs import step_dir_name

    models, scores = names(report=MODEL), names(report=SCORE)
    folders = []
    for i, model in enumerate(models):
        folders += [model, *(f"{s}-{model}" if i else s for s in scores)]
    return (*names(report=DATA), *(step_dir_name(f, tag) for f in folders for tag in REPORT_TAGS),
            *names(report=AFTER))
