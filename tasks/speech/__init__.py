"""Speech synthesis for the embedded corpus.

    espeak  ctypes binding to libespeak-ng.so.1: speech to memory with phone alignments
    room    image-method room impulse responses, synthetic noise, mixing at a set SNR
    text    deterministic English sentences from an embedded vocabulary
"""
