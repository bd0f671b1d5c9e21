"""The CTC family: the GRU CTC student (DeepSpeech2's shape, training/ctc/model.py) and,
with model.ctc.attention_weight > 0, the joint CTC/attention student (the same encoder and
CTC output with an attention decoder beside it, training/ctc/attention.py). Both store the
kind "ctc" (their checkpoints already do), train on whole transcripts and go with the CTC
decoder: T o L o G (or greedy) over the tokens, no class priors.
"""
from __future__ import annotations

from core.config import ModelConfig
from training.ctc.model import CtcModel, ctc_model_from_config
from training.families.base import ModelFamily, register_family


@register_family("ctc")
class CtcFamily(ModelFamily):
    decoder = "ctc"
    streams = True  # unidirectional; a bidirectional one is refused by its streaming step
    whole_utterances = True  # its targets are whole transcripts: no chunk passes
    grows = False  # it is over tokens, not phone classes
    regimes = ("labeled",)  # its pseudo-labels are transcripts (train.pseudolabels)

    def build(self, input_dim: int, num_classes: int, model_cfg: ModelConfig,
              stack: int = 3) -> CtcModel:
        return ctc_model_from_config(input_dim, num_classes, stack, model_cfg.ctc)

    def spec(self, model):
        return dict(model.config)

    def from_spec(self, spec):
        return CtcModel(**{k: v for k, v in spec.items() if k not in ("format", "kind")})

    def lookahead(self, model):
        return 0 if model.bidirectional else int(model.lookahead)

    def subsampling(self, model):
        return model.subsampling // model.stack  # 10 ms frames per output / rows' 10 ms frames

    def ctc_export_module(self, model):
        from training.families.ctc_onnx import CtcEncoderExport

        return CtcEncoderExport(model)

    def stream_model(self, model, dtype, device):
        from training.families.ctc_stream import CtcStreamModel

        return CtcStreamModel(model, dtype, device)

    def streaming_signature(self, model):
        from training.ctc.streaming import CtcStreamingStep

        step = CtcStreamingStep(model)
        axes = (1 if n.startswith("rnn_") else 0 for n in step.state_names)
        return (model.input_dim, model.num_classes, step.lookahead_rows, list(step.state_names),
                [tuple(t.shape[:a] + t.shape[a + 1:]) for t, a in zip(step.zero_state(1), axes)])

    def export_graphs(self, model, card):
        from training.families.ctc_onnx import streaming_graph, utterance_graph

        out = {"model.onnx": utterance_graph(model, card)}
        if not model.bidirectional:  # a bidirectional model reads whole utterances
            out["model.streaming.onnx"] = streaming_graph(model, card)
        return out
