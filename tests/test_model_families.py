"""A model family is an interface (training/families/): a toy family registered here, in one
class and one registration, is trained by `amflow train`, exported by `amflow export` and
served by the recognizer through the same steps and functions as the built-in families;
the built-in ones keep their names, specs and checkpoints."""
from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from core.config import load_config
from core.runs import StepContext
from core.storage import Storage, join
from training.families import (ModelFamily, TorchStream, family_names, family_of, get_family,
                               register_family)

TOY = "toy_frames"


class ToyFrames(nn.Module):
    """A per-frame linear classifier: no state, no look-ahead."""

    kind = TOY

    def __init__(self, input_dim: int, num_classes: int):
        super().__init__()
        self.linear = nn.Linear(input_dim, num_classes)

    @property
    def input_dim(self) -> int:
        return self.linear.in_features

    @property
    def num_classes(self) -> int:
        return self.linear.out_features

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        return self.linear(x)


class ToyFamily(ModelFamily):
    decoder = "hybrid"
    streams = True

    def build(self, input_dim, num_classes, model_cfg, stack=3):
        return ToyFrames(input_dim, num_classes)

    def spec(self, model):
        return {"input_dim": model.input_dim, "num_classes": model.num_classes}

    def from_spec(self, spec):
        return ToyFrames(spec["input_dim"], spec["num_classes"])

    def stream_model(self, model, dtype, device):
        return TorchStream(model, lambda m, x, state: (m(x), state), lambda: [], dtype, device)

    def export_graphs(self, model, card):
        """x [B, T, D] -> log_probs [B, T, C], built node by node."""
        import onnx
        from onnx import TensorProto, helper, numpy_helper

        w = model.linear.weight.detach().numpy().T.copy()
        b = model.linear.bias.detach().numpy()
        nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]),
                 helper.make_node("Add", ["xw", "b"], ["logits"]),
                 helper.make_node("LogSoftmax", ["logits"], ["log_probs"], axis=-1)]
        f32 = TensorProto.FLOAT
        graph = helper.make_graph(
            nodes, "toy", [helper.make_tensor_value_info("x", f32, ["B", "T", w.shape[0]])],
            [helper.make_tensor_value_info("log_probs", f32, ["B", "T", w.shape[1]])],
            [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        onnx.checker.check_model(m)
        return {"model.onnx": m.SerializeToString()}


register_family(TOY)(ToyFamily)  # the one registration


def test_the_built_in_families_keep_the_names_their_checkpoints_store():
    from core.config import ModelConfig
    from training.models import build_model, model_from_spec, model_spec

    assert {"student", "teacher", "ctc"} <= set(family_names())
    mc = ModelConfig()
    for kind, decoder in (("student", "hybrid"), ("teacher", "hybrid"), ("ctc", "ctc")):
        torch.manual_seed(0)
        model = build_model(kind, 192, 40, mc, stack=3)
        spec = model_spec(model)
        assert spec["kind"] == kind and family_of(model).decoder == decoder
        again = model_from_spec(json.loads(json.dumps(spec)))
        again.load_state_dict(model.state_dict())
        x = torch.randn(2, 9, 192)
        model.eval(), again.eval()
        assert torch.equal(model(x), again(x))
    joint = dataclasses.replace(mc, ctc=dataclasses.replace(mc.ctc, attention_weight=0.3))
    model = build_model("ctc", 192, 40, joint)  # the joint CTC/attention student
    assert model.decoder is not None and model_spec(model)["attention_weight"] == 0.3
    assert get_family("ctc").whole_utterances and not get_family("ctc").grows
    assert get_family("student").streams and not get_family("teacher").streams


def test_the_families_say_their_rate_look_ahead_and_cost():
    from core.config import ModelConfig
    from training.models import build_model, lstm_parameter_count

    mc = ModelConfig()
    built = {k: build_model(k, 192, 40, mc, stack=3) for k in ("student", "teacher", "ctc")}
    fam = {k: family_of(m) for k, m in built.items()}
    assert [fam[k].lookahead(built[k]) for k in built] == [mc.student.lookahead, 0,
                                                           mc.ctc.lookahead]
    assert [fam[k].subsampling(built[k]) for k in built] == [1, 1, 1]  # 33 Hz outputs
    s = mc.student
    assert fam["student"].num_parameters(built["student"]) == lstm_parameter_count(
        192, s.hidden, s.layers, 40)
    for k, m in built.items():  # two operations per weight; the biases are not weights
        n = fam[k].num_parameters(m)
        assert n < fam[k].flops_per_frame(m) < 2 * n
    chunks = SimpleNamespace(chunk_left_context=7)
    assert fam["student"].chunk_right_context(built["student"], chunks) == s.lookahead
    assert fam["teacher"].chunk_right_context(built["teacher"], chunks) == 7


def test_an_unknown_or_twice_registered_family_is_refused():
    from core.config import ConfigError

    with pytest.raises(ValueError, match="unknown model kind 'nope'"):
        get_family("nope")
    with pytest.raises(ValueError, match="registered twice"):
        register_family("student")(ToyFamily)
    with pytest.raises(ConfigError, match="train.model"):
        load_config(None, ["train.model=nope"])


@pytest.fixture(scope="module")
def toy_run(tiny_corpus, tmp_path_factory):
    """`amflow train` of the toy family on synthetic rows with the tiny corpus's classes
    and feature size, and a word bigram LM: what export and serve read."""
    from decoding import lexicon as L
    from decoding import lm
    from amflow.services.synthetic_run import make_synthetic_run
    from amflow.steps import train as train_step

    root = tmp_path_factory.mktemp("families_store")
    phones = [p.strip() for p in (tiny_corpus / "phones.txt").read_text().splitlines()]
    run = join(str(root), "runs", "r")
    make_synthetic_run(Storage(), run, num_classes=len(phones), base_dim=64, noise=1.5,
                       splits={"labeled": {"utts": 40, "parts": 2}, "dev": {"utts": 8}})
    Storage().write_json(join(run, "features", "phones.json"), phones)
    lex = L.read_lexicon((tiny_corpus / "lexicon.txt").read_text())
    Storage().write_text(join(run, "lm", "lm.arpa"), lm.estimate(
        lm.generator_sentences(300, 5), 2, vocabulary=lex.prons).to_arpa())
    cfg = load_config(None, [
        f"storage.root={root}", f"data.corpus={tiny_corpus}", f"train.model={TOY}",
        "train.regime=labeled", "train.epochs=2", "train.finetune_epochs=1", "train.threads=1",
        "train.minibatch_frames=256", "train.chunk_frames=16", "train.chunk_left_context=4",
        "train.optimizer=adam", "train.lr=0.01", "train.final_lr=0.002", "train.grow=false",
        "train.augment.enabled=false", "export.check_utterances=5", "decode.acwt=[1.0]"])
    summary = train_step.run(StepContext(cfg, "r", "train"), None)
    return cfg, root / "runs" / "r", summary


def test_a_toy_family_trains_exports_and_serves_through_the_normal_steps(toy_run, tiny_corpus):
    from amflow.steps import export
    from amflow.steps.serve import load_assets
    from decoding.decode import featurize, log_posteriors
    from decoding.search import Searcher, acoustic_scores
    from serving.app import make_recognizer
    from serving.recognizer import transcribe
    from tests.test_serving import _speaker_waves
    from core.model_card import ModelCard
    from training.checkpoint import load_model

    cfg, run, summary = toy_run
    model, meta = load_model(Storage(), str(run / "train" / "model.pt"))
    assert isinstance(model, ToyFrames) and meta["spec"]["kind"] == TOY
    assert summary["metrics"]["steps"] > 0

    ctx = StepContext(cfg, "r", "export")
    done = export.run(ctx, SimpleNamespace(model="train", format="onnx", quantize=None,
                                           data=None))
    checks = json.loads((run / "export" / "checks.json").read_text())
    g = checks["graphs"]["model.onnx"]
    assert done["metrics"]["passed"] and g["checked"] and g["max_abs_diff"] <= 1e-4
    assert sorted(checks["graphs"]) == ["model.onnx"]  # the toy exports no streaming graph

    serve = dataclasses.replace(cfg.serve, device="cpu", dtype="fp32", backend="torch",
                                speech_gate=False)
    sctx = StepContext(dataclasses.replace(cfg, serve=serve), "r", "serve")
    assets = load_assets(sctx, str(run / "train" / "model.pt"))
    assert assets["kind"] == TOY
    recs, waves = _speaker_waves(tiny_corpus, split="test", limit=3)
    rec = make_recognizer(assets, serve)
    assert isinstance(rec.model, TorchStream)
    served = [m["final"] for m in transcribe(rec, waves)]
    # the offline decode of the same utterances (the served words must equal it)
    feats, _, _ = featurize(Storage(), str(tiny_corpus), recs, ModelCard.from_meta(meta))
    search = Searcher(rec.graph, assets["beam"], assets["max_active"])  # the replica's graph
    offline = [" ".join(search.best_words(acoustic_scores(lp, assets["log_prior"],
                                                          assets["acwt"]))[0])
               for lp in log_posteriors(model.eval(), [x for _, x in feats])]
    assert served == offline and any(served)
