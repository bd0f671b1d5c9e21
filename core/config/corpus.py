"""The embedded corpus (`corpus.*`) and imported ones (`ingest.*`)."""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field

from core.config.errors import ConfigError, check

@dataclass
class CorpusConfig:
    """`amflow corpus`: the synthetic espeak-ng corpus (see tasks/corpus.py)."""

    hours: float = 0.3  # hours of speech to synthesise, all splits together
    seed: int = 0  # draws voices, sentences, rooms and noise: another seed, another corpus
    # Shares of the corpus duration per split; unlabeled gets the rest, which must be
    # larger than the labeled share (several times larger, as in the paper).
    labeled_share: float = 0.12
    dev_share: float = 0.08  # share of the duration in the dev split
    test_share: float = 0.12  # share of the duration in the test split
    # Speakers; `test_speakers` of them speak only the test split (unseen elsewhere).
    speakers: int = 24
    test_speakers: int = 4  # of `speakers`, those heard only in the test split
    # Far-field conditions drawn per utterance, DP1 (close) .. DP5 (far, noisy).
    conditions: list[str] = field(default_factory=lambda: ["DP1", "DP2", "DP3", "DP4", "DP5"])
    sample_rate: int = 16000  # Hz (only 16000)
    # Ray tasks in flight at once (each synthesises one batch of one speaker's utterances).
    workers: int = 2
    batch_utts: int = 16  # utterances one Ray task synthesises (one speaker's)
    language: str = "en-us"  # espeak-ng voice language
    locale: str = "en-US"  # written to the metadata
    # Utterance durations (seconds, padding included) and recording dates.
    min_duration: float = 1.5
    max_duration: float = 5.0  # longest utterance, seconds
    start_date: str = "2026-03-01"  # first recording date (created_at), YYYY-MM-DD
    days: int = 21  # recording dates spread over this many days from start_date
    # Metadata partitions: metadata/date=YYYY-MM-DD/bucket=NN/part-*.jsonl.
    buckets: int = 16
    # Background talkers for babble noise: banks of sentences by voices outside the corpus.
    babble_banks: int = 4
    # Splits whose dry (close-talk) rendering is kept beside the far-field one
    # (audio_clean/, `clean_audio_uri`): labeled for the example servers; add test for a
    # close-talk test set (`amflow evaluate --set evaluate.audio=clean`).
    clean_splits: list[str] = field(default_factory=lambda: ["labeled"])

    def validate(self, key: str) -> None:
        check(self.hours > 0, f"{key}.hours", "must be > 0")
        for name in ("labeled_share", "dev_share", "test_share"):
            v = getattr(self, name)
            check(0 <= v < 1, f"{key}.{name}", "must be in [0, 1)")
        check(self.labeled_share > 0 and self.test_share > 0, f"{key}.labeled_share",
               "labeled_share and test_share must be > 0")
        unlabeled = 1.0 - self.labeled_share - self.dev_share - self.test_share
        check(unlabeled > self.labeled_share, f"{key}.labeled_share",
               f"the unlabeled share (1 - labeled - dev - test = {unlabeled:.3f}) must be "
               f"larger than the labeled share")
        check(self.speakers >= 4, f"{key}.speakers", "must be >= 4")
        check(0 < self.test_speakers < self.speakers, f"{key}.test_speakers",
               "must be in (0, corpus.speakers)")
        check(self.workers >= 1, f"{key}.workers", "must be >= 1")
        check(self.batch_utts >= 1, f"{key}.batch_utts", "must be >= 1")
        check(self.sample_rate == 16000, f"{key}.sample_rate", "only 16000 is supported")
        bad = [c for c in self.conditions if c not in ("DP1", "DP2", "DP3", "DP4", "DP5")]
        check(not bad and self.conditions, f"{key}.conditions", f"must be among DP1..DP5, got {bad}")
        check(0.5 <= self.min_duration < self.max_duration, f"{key}.min_duration",
               "must be >= 0.5 and < corpus.max_duration")
        check(self.max_duration >= 3.0, f"{key}.max_duration", "must be >= 3.0")
        try:
            _dt.date.fromisoformat(self.start_date)
        except ValueError:
            raise ConfigError(f"{key}.start_date", "must be a date YYYY-MM-DD") from None
        check(self.days >= 1, f"{key}.days", "must be >= 1")
        check(1 <= self.buckets <= 100, f"{key}.buckets", "must be in [1, 100]")
        check(self.babble_banks >= 1, f"{key}.babble_banks", "must be >= 1")
        bad = [x for x in self.clean_splits if x not in ("labeled", "unlabeled", "dev", "test")]
        check(not bad, f"{key}.clean_splits",
               f"must be among labeled, unlabeled, dev, test, got {bad}")


@dataclass
class IngestConfig:
    """`amflow import` (keys `ingest.*`; `import` is a Python keyword): bring a Kaldi data
    directory or lhotse manifests into the input corpus format."""

    # Split of the records with a transcript; a record without one is unlabeled (with
    # dev/test, which need transcripts, it is an empty_text reject).
    split: str = "labeled"
    locale: str = "en-US"  # written to the metadata; its language picks the transcript rule (en, fr, de, es, it, pt: how-to/import)
    # Kaldi lexicon.txt URI: transcripts with a word not in it are oov_words rejects, and
    # it is copied to <out>/lexicon.txt (what `amflow decode` reads). Empty: no check.
    lexicon: str = ""
    # ISO 8601 time for every record; empty = the audio file's modification time (YAML
    # reads an unquoted timestamp as a datetime: loading turns it into its ISO string).
    created_at: str = ""
    condition: str = ""  # written as `condition` when set (e.g. the recording setup)
    clean: bool = False  # mark the records `clean: true` (close-talk, dry audio): clean sources for align.audio/evaluate.audio=clean and the example servers
    # Base of relative audio paths; empty = the Kaldi data dir / the recordings
    # manifest's folder.
    audio_root: str = ""
    # Copy audio that is already 16 kHz mono 16-bit WAV/FLAC into <out>/audio/ too, so the
    # corpus stands alone; off = such files are referenced where they are (absolute URI).
    # Segments and audio in any other format are always written to <out>/audio/.
    copy_audio: bool = False
    workers: int = 4  # recordings read at once (threads: the work is mostly I/O on S3)
    sample_rate: int = 16000  # Hz of the audio written (mono 16-bit); audio at another rate is resampled. 8000 keeps 8 kHz telephone audio native (with features.sample_rate=8000)
    g2p: str = "off"  # off (words not in ingest.lexicon are oov_words rejects) | espeak (espeak-ng pronounces them in the lexicon's phone set, or every word without ingest.lexicon; listed in <out>/lexicon_g2p.txt)
    g2p_language: str = "en-us"  # the espeak-ng voice language ingest.g2p speaks the words with

    def validate(self, key: str) -> None:
        import datetime as _dt

        check(self.split in ("labeled", "unlabeled", "dev", "test"), f"{key}.split",
               f"must be labeled, unlabeled, dev or test, got {self.split!r}")
        check(bool(self.locale.strip()), f"{key}.locale", "must be a non-empty locale")
        check(self.workers >= 1, f"{key}.workers", "must be >= 1")
        check(4000 <= self.sample_rate <= 96000, f"{key}.sample_rate",
              f"must be in [4000, 96000] Hz, got {self.sample_rate}")
        check(self.g2p in ("off", "espeak"), f"{key}.g2p", f"must be off or espeak, got "
              f"{self.g2p!r}")
        if isinstance(self.created_at, (_dt.date, _dt.datetime)):
            self.created_at = self.created_at.isoformat()
        check(isinstance(self.created_at, str), f"{key}.created_at",
               f"must be an ISO 8601 time, got {self.created_at!r}")
        if self.created_at.strip():
            try:
                _dt.datetime.fromisoformat(self.created_at.strip())
            except ValueError:
                raise ConfigError(f"{key}.created_at",
                                  f"must be ISO 8601, got {self.created_at!r}") from None
