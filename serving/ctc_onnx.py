"""The CTC student's ONNX graphs: now its family's (training/families/ctc_onnx.py, the family
file's export_graphs); the names stay importable from here."""
from training.families.ctc_onnx import (INPUTS, OPSET, OUTPUTS, SHERPA_FIXED,  # noqa: F401
                                        STREAM_INPUTS, STREAM_OUTPUTS, CtcEncoderExport,
                                        SherpaCtc, UtteranceFrontEnd, features_config,
                                        metadata, output_frame_shift, sherpa_features,
                                        sherpa_graph, streaming_graph, streaming_json,
                                        streaming_state, tokens_txt, utterance_graph)
