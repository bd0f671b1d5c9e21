"""From frame posteriors to words: lexicon, n-gram LM, decoding graph, search, WER.

    decoding.lexicon   word -> phone sequences (Kaldi lexicon.txt), built from espeak-ng for
                       the embedded vocabulary, checked against the alignments
    decoding.lm        word n-gram with interpolated Kneser-Ney smoothing, ARPA, perplexity;
                       `amflow lm`
    decoding.graph     the decoding graph H o L o G (kaldifst / kaldilm), cached per
                       (lexicon, LM, class set)
    decoding.search    acoustic scores (log posterior - log prior) x scale, beam search
                       with kaldi-decoder's FasterDecoder
    decoding.wer       word error rate (substitutions, deletions, insertions) per condition
    decoding.decode    `amflow decode`: a model on a corpus split, WER per condition
"""
