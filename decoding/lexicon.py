"""The pronunciation lexicon, as the decoder uses it.

The lexicon itself (reading Kaldi lexicon.txt, and building one from espeak-ng for the
embedded corpus) lives in tasks/speech/lexicon.py, below both `tasks.corpus` (which
writes it) and `decoding` (which reads it), so tasks/ never imports decoding/. These are
its names the decoder and its users import from here.
"""
from tasks.speech.lexicon import (  # noqa: F401  (re-exported)
    LEXICON_SENTENCES, LEXICON_VERSION, SIL, Lexicon, LexiconError, add_linking_variants,
    can_produce, coverage, espeak_lexicon, espeak_requests, linking_rules, read_lexicon,
    said_groups, said_groups_many, words_of)

__all__ = ["LEXICON_SENTENCES", "LEXICON_VERSION", "SIL", "Lexicon", "LexiconError",
           "add_linking_variants", "can_produce", "coverage", "espeak_lexicon", "espeak_requests",
           "linking_rules", "read_lexicon", "said_groups", "said_groups_many", "words_of"]
