"""`align.*`: GMM-HMM alignment and the context-dependent tree."""
from __future__ import annotations

from dataclasses import dataclass, field

from core.config.errors import check

@dataclass
class AlignConfig:
    """`amflow align`: GMM-HMM forced alignment to senones (alignment/)."""

    # Corpus splits (of the select manifests) to align; they need transcripts.
    splits: list[str] = field(default_factory=lambda: ["labeled"])
    num_senones: int = 500          # decision-tree leaves of the context-dependent model
    # Leaves of the network's tree (one HMM state per phone, for the low-frame-rate network's
    # targets with features.labels=align); 0: num_senones.
    nn_senones: int = 0
    # The network's tree taken instead of grown: a model.pt whose card carries one, or an
    # nn_tree.json. "": the teacher's (targets.teacher) in a student's run, so that the
    # student's classes are the teacher's by construction; else grown from this alignment.
    network_tree: str = ""
    mono_iters: int = 25  # monophone training passes
    tri_iters: int = 15  # triphone training passes (per stage)
    realign_every: int = 2          # realign before every n-th accumulation pass
    mono_gauss: int = 1000          # Gaussians in total, reached by mixing up
    tri_gauss: int = 4000  # Gaussians in total of the triphone model
    beam: float = 10.0  # Viterbi alignment beam
    retry_beam: float = 40.0  # beam of a second try when an utterance fails at beam
    sil_prob: float = 0.5           # optional silence between words in the training graphs
    min_leaf_count: float = 50.0    # frames a tree leaf needs
    # Which rendering to align: stored (the record's audio_uri) or clean (its dry
    # `clean_audio_uri`, same length and timing: alignments of the dry rendering label the
    # stored far-field audio frame for frame; records without one are rejects). On the
    # embedded corpus reverberation costs ~25 points of frame accuracy (see alignment/).
    audio: str = "stored"
    # Unvoiced stops whose silent closure gets its own one-state phone (TIMIT's tcl/kcl/pcl);
    # the outputs give closure frames to the preceding phone, as espeak-ng's phone events
    # do. Empty: none.
    closure_stops: list[str] = field(default_factory=lambda: ["p", "t", "k"])
    # One closure phone shared by all of align.closure_stops (as TIMIT's 39-phone set folds
    # pcl/tcl/kcl) instead of one each: +2.6 points of boundaries within 20 ms on two
    # corpora (k and p had started ~25 ms early; alignment/README.md). false: one each.
    shared_closure: bool = True
    # Silence's likelihood times this when aligning (Kaldi's --boost-silence; 1: none).
    boost_silence: float = 1.0
    # The flat start's equal alignment gives an utterance's leading and trailing frames
    # more than this many dB below its loudest frame to silence and spreads the phones
    # over the rest (an utterance with no frame that quiet: Kaldi's plain equal alignment).
    # Plain equal alignment taught the phone models the first frames of silence: the
    # demo's last phones ended 35 ms after espeak-ng's (alignment/README.md). 0: off.
    flat_start_silence_db: float = 30.0
    # The monophone passes after the flat start's first accumulate Baum-Welch statistics
    # (every frame shared among the states by its forward-backward posterior, as HTK's
    # HERest trains a flat start) instead of one Viterbi alignment's, at this acoustic
    # scale (alignment/forward_backward.py); the passes after them realign as before.
    # Viterbi training from the equal alignment locks boundaries in early
    # (alignment/README.md). 0: Viterbi only (Kaldi's train_mono.sh). On the far-field
    # rendering 10 passes at 0.3 add 3-8 points of frames, on the dry one none: on in
    # configs/aws.yaml (stored recordings), off in configs/local.yaml's dry alignment.
    baum_welch_passes: int = 0
    baum_welch_scale: float = 1.0  # acoustic scale of the Baum-Welch passes
    # The monophone stage trains on this many of the shortest utterances (Kaldi's recipes
    # train mono on `subset_data_dir.sh --shortest`: an equal alignment is least wrong on
    # few words, and the stage's passes then cost a fraction), and its model aligns every
    # utterance for the tree and the triphone stage. 0: all of them.
    mono_subset: int = 0
    # A third stage on LDA + MLLT features (Kaldi's train_lda_mllt.sh): static MFCCs spliced
    # over +-splice_context frames, projected to lda_dim (alignment/lda_mllt.py).
    lda_mllt: bool = False
    splice_context: int = 3  # frames spliced each side before LDA
    lda_dim: int = 40  # dimensions after LDA
    # Speaker-adaptive training after the last GMM stage (Kaldi's train_sat.sh):
    # per-speaker fMLLR transforms (alignment/fmllr.py), a new tree and model on the
    # transformed features, the transforms re-estimated at the passes listed (those past
    # align.tri_iters never come: the first estimate, from the stage before, always does).
    sat: bool = False
    # Passes at which the transforms are re-estimated.
    fmllr_iters: list[int] = field(default_factory=lambda: [2, 4, 8])
    fmllr_min_frames: float = 200.0  # a speaker with fewer speech frames keeps no transform
    # Rounds of realignment by a full-rate alignment network (alignment/nnet.py: an MLP on
    # +-nnet_context frames of the final features, trained on the current alignments,
    # nnet_epochs each; its scaled likelihoods replace the GMMs'); 0: off.
    nnet_rounds: int = 0
    nnet_context: int = 5  # frames each side the alignment network reads
    nnet_epochs: int = 4  # epochs per round
    nnet_acoustic_scale: float = 0.1  # scale of its likelihoods when realigning (Kaldi: 0.1)
    # none: a flat start from the transcripts. ctm: train from the corpus's reference CTM
    # (<corpus>/alignments.ctm): every realignment while training keeps to its phones
    # (alignment/guide.py), the flat start included; each stage's final alignment and the
    # outputs are free. The stages' scores then bound what this model class can reach
    # against that CTM (`score_<stage>`: the model trained on it, aligning freely;
    # `score_<stage>_guided`: the path kept to it).
    guide: str = "none"
    # One Ray actor per select shard (Kaldi's JOBs); false: every shard in this process.
    use_ray: bool = True
    # Alignments taken from an earlier `amflow align` instead of trained again (as a Kaldi
    # recipe points a later stage at exp/tri*_ali): "teacher" (a student's run takes its
    # teacher run's, when that run aligned every utterance here with the same settings,
    # lexicon, corpus and network tree; else it trains, and its log says why), "never", or
    # the URI of an align output (runs/<R>/align), which must match.
    reuse: str = "teacher"

    def validate(self, key: str) -> None:
        check(bool(self.reuse), f"{key}.reuse",
               "must be teacher, never or the URI of an align output (runs/<R>/align)")
        check(bool(self.splits) and all(s in ("labeled", "unlabeled", "dev", "test")
                                         for s in self.splits), f"{key}.splits",
               "must be a non-empty list of labeled, unlabeled, dev, test")
        check(self.num_senones >= 1, f"{key}.num_senones", "must be >= 1")
        check(self.nn_senones >= 0, f"{key}.nn_senones", "must be >= 0 (0: align.num_senones)")
        check(self.mono_iters >= 1, f"{key}.mono_iters", "must be >= 1")
        check(self.tri_iters >= 1, f"{key}.tri_iters", "must be >= 1")
        check(self.realign_every >= 1, f"{key}.realign_every", "must be >= 1")
        check(self.mono_gauss >= 1, f"{key}.mono_gauss", "must be >= 1")
        check(self.tri_gauss >= self.num_senones, f"{key}.tri_gauss",
               "must be >= align.num_senones (one Gaussian per senone at least)")
        check(self.beam > 0, f"{key}.beam", "must be > 0")
        check(self.retry_beam >= self.beam, f"{key}.retry_beam", "must be >= align.beam")
        check(0 < self.sil_prob < 1, f"{key}.sil_prob", "must be in (0, 1)")
        check(self.min_leaf_count > 0, f"{key}.min_leaf_count", "must be > 0")
        check(self.audio in ("stored", "clean"), f"{key}.audio", "must be stored or clean")
        check(0 <= self.splice_context <= 10, f"{key}.splice_context", "must be in [0, 10]")
        check(1 <= self.lda_dim <= 13 * (2 * self.splice_context + 1), f"{key}.lda_dim",
               "must be in [1, 13 x (2 align.splice_context + 1)]")
        check(all(i >= 0 for i in self.fmllr_iters), f"{key}.fmllr_iters",
               "must be pass numbers (>= 0) of the triphone rounds")
        check(self.fmllr_min_frames > 0, f"{key}.fmllr_min_frames", "must be > 0")
        check(self.nnet_rounds >= 0, f"{key}.nnet_rounds", "must be >= 0")
        check(0 <= self.nnet_context <= 20, f"{key}.nnet_context", "must be in [0, 20]")
        check(self.nnet_epochs >= 1, f"{key}.nnet_epochs", "must be >= 1")
        check(self.nnet_acoustic_scale > 0, f"{key}.nnet_acoustic_scale", "must be > 0")
        check(self.guide in ("none", "ctm"), f"{key}.guide", "must be none or ctm")
        check(self.boost_silence > 0, f"{key}.boost_silence", "must be > 0")
        check(self.flat_start_silence_db >= 0, f"{key}.flat_start_silence_db",
               "must be >= 0 (0: off)")
        check(0 <= self.baum_welch_passes < self.mono_iters, f"{key}.baum_welch_passes",
               "must be in [0, align.mono_iters - 1] (the first pass accumulates from the "
               "equal alignment)")
        check(0 < self.baum_welch_scale <= 1, f"{key}.baum_welch_scale", "must be in (0, 1]")
        check(self.mono_subset >= 0, f"{key}.mono_subset",
               "must be >= 0 (shortest utterances the monophone stage trains on; 0: all)")
        check(self.guide == "none" or self.nnet_rounds == 0, f"{key}.guide",
               "ctm trains the GMMs from the reference; align.nnet_rounds must then be 0")
