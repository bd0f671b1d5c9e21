"""The CTC student's streaming step: now its family's (training/families/ctc_stream.py, the
family file's stream_model); the names stay importable from here."""
from training.families.ctc_stream import CtcState, CtcStreamModel, CtcStreams  # noqa: F401
