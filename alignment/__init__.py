"""GMM-HMM forced alignment: transcripts -> per-frame phones and senones (`amflow align`).

    features.py        MFCC 13 + deltas + delta-deltas, per-speaker CMVN (10 ms frames)
    lexicon_graphs.py  phone/word tables, HMM topology, the lexicon FST, training graphs
    gmm.py             GMM accumulate / update / mix-up, equal and Viterbi alignment
    jobs.py            one shard's utterances as a job (Kaldi's JOB): accumulate, align, stats;
                       run locally or as Ray actors, statistics summed on the driver
    tree.py            the phonetic decision tree, written by hand (kaldi-hmm-gmm has none)
    lda_mllt.py        splicing, LDA and MLLT feature transforms, written by hand
    fmllr.py           per-speaker fMLLR transforms (speaker-adaptive training), by hand
    nnet.py            a full-rate alignment network (hybrid realignment), optional
    guide.py           alignment kept to a reference CTM (align.guide=ctm): training from
                       it, and the bound on how close this model class can come to it
    train.py           the recipe: flat start, monophone rounds, tree, triphone rounds,
                       optionally LDA + MLLT and a third tree and model, and SAT
    ctm.py             frames -> phone CTM; closures folded back; scoring against a reference
    model_io.py        Kaldi files: binary tree, text final.mdl; pickles for Python reuse

README.md says what is written by hand here and why, and what was measured.

kaldi_hmm_gmm is imported first wherever it is used (an import-order trap with other
OpenFST builds, see pyproject.toml).
"""
