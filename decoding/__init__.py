"""From frame posteriors to words: lexicon, n-gram LM, decoding graph, search, WER.

    decoding.lexicon   word -> phone sequences (Kaldi lexicon.txt; the module lives in
                       tasks/speech/lexicon.py, which also builds it from espeak-ng)
    decoding.lm        word n-gram with interpolated Kneser-Ney smoothing, ARPA, perplexity
                       (the `amflow lm` step: amflow/steps/lm.py)
    decoding.assets    DecoderAssets: model + card, lexicon, LM, graph, priors; the acwt
                       rule (tuned_acwt) — shared by decode, serve and bench decode
    decoding.priors    class priors read from the model card (counted by training/priors.py)
    decoding.graph     the decoding graph H o L o G (kaldifst / kaldilm), cached per
                       (lexicon, LM, class set)
    decoding.search    acoustic scores (log posterior - log prior) x scale, beam search
                       with kaldi-decoder's FasterDecoder
    decoding.wer       word error rate (substitutions, deletions, insertions) per condition
    decoding.decode    the decode worker pool, tuning and scoring (step: amflow/steps/decode.py)
"""
