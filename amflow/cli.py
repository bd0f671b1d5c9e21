"""`amflow <step> --config FILE --run-id ID [--set key=value ...]`

The exact command a container, a Ray job or an Airflow task runs. Step modules are
imported only when their step runs, so `--help` is instant. The last line a step
prints on stdout is `AMFLOW_SUMMARY <json>`: its metrics, which Airflow keeps as XCom;
the line before it says the same for people (amflow.summary_line).
"""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from core.config import ConfigError, resolve_config

SUMMARY_PREFIX = "AMFLOW_SUMMARY "
DEFAULT_CONFIG = "configs/local.yaml"


@dataclass
class Step:
    entry: str  # "module:function"
    help: str
    reads: str
    writes: str
    needs_run: bool = True
    add_args: Callable[[argparse.ArgumentParser], None] | None = None
    sets: tuple[str, ...] = ()  # config overrides the step implies (they win over --set)
    extra: dict = field(default_factory=dict)
    # run(ctx, args) when it has a run id; False: run(cfg, args) always (--run-id is read)
    takes_context: bool = True


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
    p.add_argument("--model", help="student model.pt URI (default: the run's train output)")
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
                   "(train.grow_recipe laid over the training's values)")
    p.add_argument("--all", action="store_true", help="every key, defaults included")


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="a train step of the run (e.g. train-baseline) or a model.pt "
                                    "URI (default: the model decode decodes)")
    p.add_argument("--format", default="onnx", choices=["onnx"], help="what to export to")
    p.add_argument("--quantize", choices=["int8"],
                   help="also write int8 dynamically quantized graphs (*.int8.onnx)")
    p.add_argument("--data", help="corpus with the check utterances (default: data.corpus)")


def _simulate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--measured", help="JSON with measured compute seconds and bytes per "
                   "minibatch per algorithm (default: from this run's train step, if any)")


STEPS: dict[str, Step] = {
    "corpus": Step(
        "amflow.steps.corpus:run", "synthesise the embedded espeak-ng speech corpus",
        reads="nothing but config (corpus.*)",
        writes="--out URI: audio/<split>/*.wav, metadata/date=*/bucket=*/part.jsonl, "
               "alignments.ctm, phones.txt, _SUCCESS.json",
        needs_run=False, add_args=_corpus_args),
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
        writes="runs/<id>/select/shards/*.parquet (manifests), rejects/, _SUCCESS.json"),
    "align": Step(
        "amflow.steps.align:run", "GMM-HMM forced alignment: monophone, tree, triphone senones",
        reads="runs/<id>/select shard manifests (align.splits), the audio, data.lexicon or "
              "<corpus>/lexicon.txt, <corpus>/alignments.ctm (scoring, when present; "
              "training too with align.guide=ctm)",
        writes="runs/<id>/align/alignments/*.parquet (phones, senones per 10 ms frame), "
               "alignments.ctm, tree, final.mdl, mono.mdl, phones.txt, rejects/, _SUCCESS.json"),
    "features": Step(
        "amflow.steps.features:run", "log-mel fbank, causal CMN, global CMVN, low frame rate",
        reads="runs/<id>/select shard manifests, the audio they point at, alignments.ctm",
        writes="runs/<id>/features/shards/*.parquet, cmvn.json, phones.json, rejects/, "
               "_SUCCESS.json"),
    "targets": Step(
        "amflow.steps.targets:run", "teacher inference on a Ray actor pool, top-k soft targets",
        reads="runs/<id>/features shards, teacher checkpoint (targets.teacher)",
        writes="runs/<id>/targets/shards/*.parquet (topk_idx int16, topk_logit fp16, topk_len uint8 "
               "with targets.mass < 1; one byte each under targets.codec=sqrt<L>), "
               "_SUCCESS.json with the top-k fidelity report"),
    "repartition": Step(
        "amflow.steps.repartition:run", "join features and targets into equal training partitions",
        reads="runs/<id>/features (and targets, when present); with repartition.days or "
              "from_date/to_date also daily_data's partitions runs/<daily.dataset>-YYYY-MM-DD/",
        writes="runs/<id>/repartition/<split>/part-*.parquet, _SUCCESS.json; with a window "
               "window.json (the intervals and their digests) and cmvn.json (the union's)"),
    "train": Step(
        "amflow.steps.train:run", "train the teacher or the student (train.algorithm on Ray Train)",
        reads="runs/<id>/repartition partitions, train.init_model when set (a phone-class "
              "model is grown into the run's leaves); train.model=ctc: the corpus's labeled "
              "and dev transcripts and train.pseudolabels' kept labels",
        writes="runs/<id>/train/ (train-<train.tag> when tagged): checkpoints/, model.pt, "
               "metrics.jsonl, learning_curve.png, _SUCCESS.json; ctc: tokens/ (tokenizer, "
               "tokenised transcripts)"),
    "sequence": Step(
        "amflow.steps.sequence:run", "sequence training (sMBR / MMI) of a trained model",
        reads="runs/<id>/repartition labeled partitions, train.init_model (default: the "
              "run's train[-<train.tag>]/model.pt)",
        writes="runs/<id>/sequence[-<train.tag>]/: checkpoints/, model.pt, metrics.jsonl, "
               "learning_curve.png, _SUCCESS.json (denominator graph size)",
        sets=("train.recipe=sequence",)),
    "evaluate": Step(
        "amflow.steps.evaluate:run", "frame accuracy and phone error rate per condition",
        reads="--model checkpoint, --data corpus with alignments.ctm, the run's cmvn.json",
        writes="--out JSON (frame_accuracy, per_condition, num_frames, per), _SUCCESS.json",
        add_args=_evaluate_args),
    "lm": Step(
        "amflow.steps.lm:run", "estimate a word n-gram LM (interpolated Kneser-Ney), ARPA",
        reads="lm.* (lm.source: the text generator for the embedded corpus, the corpus's "
              "labeled transcripts for any other, plus lm.text_file), data.lexicon or "
              "<corpus>/lexicon.txt (vocabulary), the corpus's dev/test transcripts "
              "(perplexity, OOV rate: a WARNING when the LM does not fit them)",
        writes="runs/<id>/lm/lm.arpa, _SUCCESS.json (perplexity, OOV rate)"),
    "decode": Step(
        "amflow.steps.decode:run", "decode a model to words with H o L o G (a CTC model: "
        "T o L o G or greedy); WER per condition",
        reads="--model checkpoint (priors, CMVN, phones; ctc: its tokenizer), --data corpus "
              "(transcripts, audio), data.lexicon or <corpus>/lexicon.txt (hybrid), decode.lm "
              "or runs/<id>/lm/lm.arpa",
        writes="--out JSON (wer, per_condition, ser, acwt, rtf), runs/<id>/decode[-<tag>]/"
               "hyps.jsonl, hyps.parquet, tuning.json, _SUCCESS.json; runs/<id>/graph/<key>/",
        add_args=_decode_args),
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
        add_args=_pseudolabel_args),
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
        reads="--model a train step or model.pt URI, the run's lexicon, LM and graph (hybrid), "
              "the acwt or greedy blank penalty decode tuned, export.check_split's "
              "utterances of data.corpus",
        writes="runs/<id>/export[-<decode.tag>]/ (untagged: export-<t> for train-<t>): "
               "model.onnx, model.streaming.onnx (hybrid; "
               "CTC: unidirectional, with streaming.json), model.sherpa.onnx + tokens.txt "
               "(CTC) (+ *.int8.onnx), card.json, "
               "classes.txt (hybrid), features.json, decoding.json, checks.json, "
               "_SUCCESS.json (only when the checks pass)",
        add_args=_export_args),
    "simulate": Step(
        "amflow.steps.simulate:run", "project trainer throughput to 16-128 workers",
        reads="measured compute time and bytes per minibatch (train step or --measured)",
        writes="runs/<id>/simulate/table.md, table.json, _SUCCESS.json",
        add_args=_simulate_args),
    "report": Step(
        "amflow.steps.report:run", "the demo report: Table II per condition, curves, timings",
        reads="evaluate results of teacher, baseline and SSL runs, every step's _SUCCESS.json",
        writes="runs/<id>/report/report.md, report.json, accuracy.png, learning_curves.png"),
    "compare": Step(
        "amflow.steps.compare:run", "runs side by side: WER with its CI95, deltas with significance",
        reads="runs/<RUN>/decode*/result.json and hyps.jsonl, train*/sequence* metrics.jsonl",
        writes="the table on stdout; --out JSON", needs_run=False, add_args=_compare_args),
    "config": Step(
        "amflow.steps.config_show:run",
        "show the resolved config: each key's value and where it came from",
        reads="--config and --set (recipes included), or with --run-id the step's recorded "
              "<run>/<step>/_config.json",
        writes="the table on stdout", needs_run=False, takes_context=False,
        add_args=_config_args),
    "bench": Step(
        "amflow.steps.bench:run", "benchmarks measured side by side, printed as ratios",
        reads="the run's data (or the embedded corpus)",
        writes="runs/<id>/bench/<what>.json", add_args=_bench_args),
}


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
                       help=f"YAML config (default: {DEFAULT_CONFIG} if present)")
        p.add_argument("--run-id", required=step.needs_run and name != "bench",
                       default=None, help="run name; outputs go under runs/<run-id>/")
        p.add_argument("--set", dest="overrides", action="append", default=[],
                       metavar="KEY=VALUE", help="override a config key, e.g. select.hours=2")
        p.add_argument("--force", action="store_true",
                       help="redo shards whose outputs already exist")
        p.add_argument("--log-level", default=os.environ.get("AMFLOW_LOG_LEVEL", "INFO"))
        if step.add_args:
            step.add_args(p)
    return parser


def _load_entry(entry: str) -> Callable[..., dict]:
    module, func = entry.split(":")
    return getattr(importlib.import_module(module), func)


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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    config_path = args.config
    if config_path is None and Path(DEFAULT_CONFIG).exists():
        config_path = DEFAULT_CONFIG
    step = STEPS[args.step]
    args.config_path = config_path
    args.step_sets = list(STEPS[_step_name(args)].sets) if args.step == "config" else []
    try:
        resolved = resolve_config(config_path, [*(args.overrides or []), *step.sets])
    except ConfigError as exc:
        print(f"amflow {args.step}: {exc}", file=sys.stderr)
        return 2
    from core.runs import StepContext, StepError

    cfg = resolved.config
    try:
        fn = _load_entry(step.entry)
        if step.takes_context and (step.needs_run or args.run_id):
            ctx = StepContext(cfg, args.run_id or "bench", args.step, force=args.force)
            summary = fn(ctx, args)
            _record_config(ctx, resolved, argv, summary)
        else:
            summary = fn(cfg, args)
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
