"""Pronunciation lexicon: built and read in `tasks.speech.lexicon` (the corpus generator
needs it too, and tasks/ must not import decoding/); re-exported here for the decoder."""
from tasks.speech.lexicon import (LEXICON_SENTENCES, LEXICON_VERSION, SIL, Lexicon,  # noqa: F401
                                  LexiconError, add_linking_variants, can_produce, coverage,
                                  espeak_lexicon, espeak_requests, linking_rules, read_lexicon,
                                  said_groups, said_groups_many, words_of)
