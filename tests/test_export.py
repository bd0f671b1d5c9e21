"""`amflow export` (amflow/steps/export.py, serving/onnx_export.py): the student's ONNX
graphs give torch's log-posteriors (1e-4) and words on real utterances, the step keeps
them only when its checks pass, and the streaming graph serves in the recognizer."""
from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest

from core.config import FeaturesConfig


def _student(classes: list[str], seed: int) -> bytes:
    """A small random student's model.pt (peaky outputs: varied words)."""
    import torch

    from training.checkpoint import model_payload, to_bytes
    from training.models import StudentLSTM

    torch.manual_seed(seed)
    model = StudentLSTM(192, 32, 2, len(classes), lookahead=3)
    with torch.no_grad():
        model.output.weight.mul_(8.0)
    cmvn = {"count": 1, "sum": [0.0] * 64, "sumsq": [100.0] * 64}
    payload = model_payload(model, cmvn=cmvn, phones=classes,
                            features=dataclasses.asdict(FeaturesConfig()))
    payload["priors"] = {"counts": [1.0] * len(classes), "source": "test"}
    return to_bytes(payload)


def write_student_run(root, tiny_corpus):
    """runs/r under `root`: a small random student's train/model.pt (_student) and a word
    bigram LM over the tiny corpus's lexicon (lm/lm.arpa); the run's folder."""
    from decoding import lexicon as L
    from decoding import lm

    classes = [p.strip() for p in (tiny_corpus / "phones.txt").read_text().splitlines()]
    run = root / "runs" / "r"
    (run / "train").mkdir(parents=True)
    (run / "train" / "model.pt").write_bytes(_student(classes, seed=0))
    lex = L.read_lexicon((tiny_corpus / "lexicon.txt").read_text())
    (run / "lm").mkdir()
    (run / "lm" / "lm.arpa").write_text(
        lm.estimate(lm.generator_sentences(300, 5), 2, vocabulary=lex.prons).to_arpa())
    return run


@pytest.fixture(scope="module")
def tiny_run(tiny_corpus, tmp_path_factory):
    """A run with a small random student (peaky outputs: varied words), class priors, a
    CMVN, and a word bigram LM: what `amflow export` reads."""
    from core.config import load_config

    root = tmp_path_factory.mktemp("export_store")
    run = write_student_run(root, tiny_corpus)
    cfg = load_config(None, [f"storage.root={root}", f"data.corpus={tiny_corpus}",
                             "export.check_utterances=5", "decode.acwt=[1.0]"])
    return cfg, run


def _export(cfg, quantize=None, model=None, force=False):
    from amflow.steps import export
    from core.runs import StepContext

    ctx = StepContext(cfg, "r", "export", force=force)
    return export.run(ctx, SimpleNamespace(model=model, format="onnx", quantize=quantize,
                                           data=None))


def test_export_writes_both_graphs_and_what_a_deployment_needs_checked_against_torch(tiny_run):
    import onnx

    cfg, run = tiny_run
    summary = _export(cfg, quantize="int8")
    out = run / "export"
    for name in ("model.onnx", "model.streaming.onnx", "model.int8.onnx",
                 "model.streaming.int8.onnx", "card.json", "classes.txt", "features.json",
                 "decoding.json", "checks.json", "_SUCCESS.json"):
        assert (out / name).exists(), name
    checks = json.loads((out / "checks.json").read_text())
    assert checks["passed"] and checks["utterances"] == 5
    for name in ("model.onnx", "model.streaming.onnx"):
        g = checks["graphs"][name]
        assert g["checked"] and g["max_abs_diff"] <= 1e-4 and g["same_words"] == 5
        assert g["max_scaled_diff"] <= g["max_abs_diff"]  # divided by max(1, |log p|)
    assert checks["torch_hyp_words"] > 5  # words came out (a vacuous check would have none)
    int8 = checks["graphs"]["model.int8.onnx"]
    assert not int8["checked"] and "delta_ci95" in int8["wer_vs_torch"]
    assert summary["metrics"]["model.onnx.same_words"] == 5
    streaming = onnx.load(str(out / "model.streaming.onnx"))
    assert [i.name for i in streaming.graph.input] == ["x", "lengths", "h0", "c0"]
    meta = {p.key: p.value for p in streaming.metadata_props}
    assert meta["streaming"] == "1" and meta["lookahead"] == "3"
    classes = (out / "classes.txt").read_text().splitlines()
    assert classes == json.loads((out / "card.json").read_text())["phones"]
    assert len(json.loads((out / "decoding.json").read_text())["log_prior"]) == len(classes)


def test_an_export_whose_outputs_differ_from_torch_fails_its_step(tiny_run, monkeypatch):
    """Gates in PyTorch's order (i, f, g, o) instead of ONNX's (i, o, f, c): the checks see
    it and the step fails without a _SUCCESS.json."""
    from core.runs import StepError
    from training.families import lstm_onnx as onnx_export  # the family's export graphs

    cfg, run = tiny_run
    monkeypatch.setattr(onnx_export, "GATES_TORCH_TO_ONNX", (0, 1, 2, 3))
    cfg = dataclasses.replace(cfg, decode=dataclasses.replace(cfg.decode, tag="broken"))
    with pytest.raises(StepError, match="checks failed"):
        _export(cfg, model="train")
    checks = json.loads((run / "export-broken" / "checks.json").read_text())
    assert not checks["passed"] and checks["graphs"]["model.onnx"]["max_abs_diff"] > 1e-2
    assert checks["graphs"]["model.onnx"]["max_scaled_diff"] > 1e-3
    assert not (run / "export-broken" / "_SUCCESS.json").exists()


def test_the_tolerance_scales_with_the_log_posteriors_size():
    """float32 rounds relative to a number's size: 1.25e-4 off a log-posterior of -8.7
    (the demo CTC student's streaming graph, 2026-12-07) is 1.4e-5 of it and passes the
    1e-4 check; the same 1.25e-4 off a log-posterior near 0 (a class a search follows)
    does not; every class's difference counts, the largest decides."""
    from serving.export_checks import compare, scaled_diff

    ref = [np.array([[-0.05, -8.7, -30.0]], np.float32), np.array([[-2.0, -0.2]], np.float32)]
    far_class = [ref[0] + np.float32([0, 1.25e-4, 0]), ref[1]]
    near_class = [ref[0] + np.float32([1.25e-4, 0, 0]), ref[1]]
    assert compare(ref, far_class) == pytest.approx(1.25e-4, rel=1e-3)
    assert scaled_diff(ref, far_class) == pytest.approx(1.25e-4 / 8.7, rel=1e-2)
    assert scaled_diff(ref, near_class) == pytest.approx(1.25e-4, rel=1e-2)
    assert scaled_diff(ref, [ref[0], ref[1] + np.float32([[3e-4, 0]])]) == pytest.approx(
        1.5e-4, rel=1e-2)  # 3e-4 off -2.0
    assert scaled_diff(ref, ref) == 0.0
    with pytest.raises(ValueError, match="differ in shape"):
        scaled_diff(ref, ref[:1])


def test_the_recognizer_on_the_onnx_streaming_graph_gives_the_torch_recognizers_words(
        tiny_run, tiny_corpus):
    """serve.backend=onnxruntime: the same protocol-level finals as torch's recognizer."""
    from amflow.steps.serve import load_assets
    from core.runs import StepContext
    from serving.app import make_recognizer
    from serving.recognizer import transcribe
    from tests.test_serving import _speaker_waves

    cfg, run = tiny_run
    if not (run / "export" / "_SUCCESS.json").exists():  # run alone: export first
        _export(cfg)
    serve = dataclasses.replace(cfg.serve, device="cpu", dtype="fp32", backend="onnxruntime")
    ctx = StepContext(dataclasses.replace(cfg, serve=serve), "r", "serve")
    assets = load_assets(ctx, str(run / "train" / "model.pt"))  # finds export/'s graph
    assert assets["onnx_uri"].endswith("export/model.streaming.onnx")
    _, waves = _speaker_waves(tiny_corpus, split="test", limit=3)
    words = {}
    for backend in ("torch", "onnxruntime"):
        rec = make_recognizer(assets, dataclasses.replace(serve, backend=backend))
        words[backend] = [m["final"] for m in transcribe(rec, waves)]
    assert words["torch"] == words["onnxruntime"] and any(words["torch"])
    assert "onnxruntime" in str(rec.model.dtype)


def test_the_export_folder_follows_the_model_so_exports_never_overwrite_each_other(tiny_run):
    """Untagged: train -> export, train-<t> -> export-<t>, another folder F -> export-F,
    a model outside the run -> export-model-<digest>; tagged: export-<decode.tag>."""
    from amflow.steps.export import export_dir_name
    from core.runs import StepContext
    from core.storage import digest_of

    cfg, run = tiny_run
    ctx = StepContext(cfg, "r", "export")
    name = {m: export_dir_name(ctx, m, b"bytes") for m in (
        str(run / "train" / "model.pt"), str(run / "train-ctc" / "model.pt"),
        str(run / "train-baseline" / "model.pt"), str(run / "sequence" / "model.pt"),
        str(run.parent / "other" / "train" / "model.pt"))}
    assert list(name.values()) == ["export", "export-ctc", "export-baseline", "export-sequence",
                                   f"export-model-{digest_of(b'bytes')}"]
    assert len(set(name.values())) == len(name)
    tagged = dataclasses.replace(cfg, decode=dataclasses.replace(cfg.decode, tag="ctc"))
    assert export_dir_name(StepContext(tagged, "r", "export"), str(run / "train" / "model.pt"),
                           b"") == "export-ctc"  # a tag names the folder, as documented
    s3 = StepContext(dataclasses.replace(cfg, storage=dataclasses.replace(
        cfg.storage, root="s3://b/root")), "r", "export")
    assert export_dir_name(s3, "s3://b/root/runs/r/train-ctc/model.pt", b"") == "export-ctc"
    chunked = dataclasses.replace(cfg, decode=dataclasses.replace(cfg.decode, chunking="4x8"))
    assert export_dir_name(StepContext(chunked, "r", "export"), str(
        run / "train-conformer" / "model.pt"), b"") == "export-conformer-4x8"


def test_a_graph_exported_from_another_model_is_refused_naming_both(tiny_run, tiny_corpus):
    """serve.backend=onnxruntime: a graph whose metadata names another model.pt's digest
    (same shape: the runtime's shape check cannot tell), or none, is refused at load."""
    import onnx

    from amflow.steps.serve import load_assets
    from core.runs import StepContext, StepError
    from core.storage import digest_of
    from serving.onnx_export import exported_from

    cfg, run = tiny_run
    if not (run / "export" / "_SUCCESS.json").exists():  # run alone: export first
        _export(cfg)
    graph = run / "export" / "model.streaming.onnx"
    model = run / "train" / "model.pt"
    assert exported_from(graph.read_bytes()) == (digest_of(model.read_bytes()), str(model))
    checks = json.loads((run / "export" / "checks.json").read_text())
    assert checks["model_digest"] == digest_of(model.read_bytes())
    classes = json.loads((run / "export" / "card.json").read_text())["phones"]
    other = run / "train-other" / "model.pt"
    other.parent.mkdir(exist_ok=True)
    other.write_bytes(_student(classes, seed=1))
    bare = run / "bare.streaming.onnx"  # the same graph without the model's digest
    m = onnx.load(str(graph))
    keep = [(p.key, p.value) for p in m.metadata_props if not p.key.startswith("amflow_model")]
    del m.metadata_props[:]
    onnx.helper.set_model_props(m, dict(keep))
    bare.write_bytes(m.SerializeToString())
    for onnx_model, model_uri, match in [
            (graph, other, rf"{graph}.*{model}.*{digest_of(model.read_bytes())}.*not from "
                           rf"{other} \(digest {digest_of(other.read_bytes())}\)"),
            (bare, model, "exported before amflow recorded"),
            (None, other, r"export-other/model.streaming.onnx not found")]:
        serve = dataclasses.replace(cfg.serve, backend="onnxruntime",
                                    onnx_model=str(onnx_model or ""))
        ctx = StepContext(dataclasses.replace(cfg, serve=serve), "r", "serve")
        with pytest.raises(StepError, match=match):
            load_assets(ctx, str(model_uri))
    serve = dataclasses.replace(cfg.serve, backend="onnxruntime", onnx_model=str(graph))
    ctx = StepContext(dataclasses.replace(cfg, serve=serve), "r", "serve")
    assert load_assets(ctx, str(model))["onnx_uri"] == str(graph)  # its own model: served


def fault_waves(seconds: float = 2.0) -> list[np.ndarray]:
    """No speech: digital silence, a constant full-scale signal, white noise at -40 dBFS."""
    n = int(16000 * seconds)
    noise = 0.01 * np.random.default_rng(7).standard_normal(n)
    return [x.astype(np.float32) for x in (np.zeros(n), np.full(n, 32767 / 32768), noise)]


def gated_finals(assets: dict, serve, export_dir) -> dict[bool, list[str]]:
    """The finals of fault_waves on the exported streaming graph (onnxruntime) with the
    export's gate.json applied, and without a gate."""
    from serving.app import make_recognizer, speech_gate
    from serving.onnx_export import gate_from_json
    from serving.recognizer import transcribe

    doc = json.loads((export_dir / "gate.json").read_text())
    gate = gate_from_json(doc)
    # the gate amflow serves with (serve.speech_*)
    assert doc["enabled"] and gate == speech_gate(dataclasses.replace(serve, speech_gate=True))
    out = {}
    for on in (True, False):
        rec = make_recognizer(assets, dataclasses.replace(serve, backend="onnxruntime",
                                                          speech_gate=False))
        rec.gate = gate if on else None
        out[on] = [m["final"] for m in transcribe(rec, fault_waves())]
    return out


def test_the_exported_gate_gives_no_words_from_silence_constant_or_quiet_noise(tiny_run):
    """gate.json beside the graphs: the serve.speech_* gate, applied to the exported
    streaming graph in onnxruntime, makes no words of digital silence, a constant signal
    or -40 dBFS white noise (which the same graph without it makes words of)."""
    from amflow.steps.serve import load_assets
    from core.runs import StepContext

    cfg, run = tiny_run
    if not (run / "export" / "_SUCCESS.json").exists():  # run alone: export first
        _export(cfg)
    doc = json.loads((run / "export" / "gate.json").read_text())
    assert doc["frames"]["pad_frames"] == 15 and doc["frames"]["floor_frames"] == 300
    serve = dataclasses.replace(cfg.serve, device="cpu", dtype="fp32", backend="onnxruntime")
    ctx = StepContext(dataclasses.replace(cfg, serve=serve), "r", "serve")
    finals = gated_finals(load_assets(ctx, str(run / "train" / "model.pt")), serve,
                          run / "export")
    assert finals[True] == ["", "", ""]
    assert any(finals[False]), finals  # what the gate is for


def test_bench_serve_compares_backends_level_by_level():
    """bench serve --backends: base / other per level (> 1: the other is faster or cheaper);
    a level one backend could not measure has no ratio."""
    from bench.serve import backend_ratios

    base = [{"streams": 1, "p50_ms": 20.0, "p98_ms": 40.0, "replica_core_s_per_audio_s": 0.02},
            {"streams": 40, "p50_ms": 60.0, "p98_ms": None, "replica_core_s_per_audio_s": 0.01}]
    other = [{"streams": 1, "p50_ms": 10.0, "p98_ms": 16.0, "replica_core_s_per_audio_s": 0.008},
             {"streams": 40, "p50_ms": 30.0, "p98_ms": 50.0, "replica_core_s_per_audio_s": None}]
    assert backend_ratios(base, other) == [
        {"streams": 1, "p50_ms": 2.0, "p98_ms": 2.5, "replica_core_s_per_audio_s": 2.5},
        {"streams": 40, "p50_ms": 2.0, "p98_ms": None, "replica_core_s_per_audio_s": None}]
