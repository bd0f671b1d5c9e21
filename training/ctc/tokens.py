"""The CTC student's output units: characters (DeepSpeech2) or sentencepiece BPE.

    train_tokenizer(texts, kind="char" | "bpe", vocab_size=...) -> Tokenizer
    Tokenizer.encode(text) -> [class id]      transcript -> targets (words_of first)
    Tokenizer.encode_word(word) -> [class id] one word's spelling (the lexicon's entry)
    Tokenizer.decode(ids) -> [word]           collapsed CTC output -> words
    Tokenizer.to_dict() / Tokenizer.from_dict(d)   plain JSON (kept in model.pt's info)

Class 0 is the CTC blank; the other classes are the tokens. Both kinds mark the start of
a word the sentencepiece way (the piece "▁"): a character tokenizer spells "the cat" as
▁ t h e ▁ c a t (DS2's space symbol, before each word), a BPE one as e.g. ▁the ▁c at.
So a transcript's targets are the concatenation of its words' spellings, which is what
makes the token-to-word lexicon FST (decoding/ctc_graph.py) one path per word.

Text normalisation is the lexicon's and the LM's (`tasks.speech.lexicon.words_of`: lower
case, punctuation dropped, apostrophes kept), so tokens, lexicon and LM spell words alike.
"""
from __future__ import annotations

import base64
import hashlib
import io
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from tasks.speech.lexicon import words_of

BLANK = "<blk>"
UNK = "<unk>"
WORD_START = "\u2581"  # sentencepiece's word-start mark
KINDS = ("char", "bpe")


class TokenizerError(ValueError):
    pass


@dataclass
class Tokenizer:
    kind: str  # char | bpe
    symbols: list[str]  # index = class id; 0 = blank
    sp_model: bytes = b""  # the sentencepiece model (bpe)
    _sp: Any = field(default=None, repr=False, compare=False)
    _index: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise TokenizerError(f"unknown tokenizer kind {self.kind!r} (char or bpe)")
        if not self.symbols or self.symbols[0] != BLANK:
            raise TokenizerError(f"class 0 must be the blank {BLANK!r}")
        self._index = {s: i for i, s in enumerate(self.symbols)}
        if self.kind == "bpe":
            import sentencepiece as spm

            self._sp = spm.SentencePieceProcessor(model_proto=self.sp_model)

    @property
    def num_classes(self) -> int:
        return len(self.symbols)

    @property
    def digest(self) -> str:
        """Names the tokenizer on the model card (same symbols and model = same digest)."""
        h = hashlib.sha256("\n".join([self.kind, *self.symbols]).encode())
        h.update(self.sp_model)
        return h.hexdigest()[:16]

    def encode_word(self, word: str) -> list[int]:
        if self.kind == "char":
            unk = self._index[UNK]
            return [self._index[WORD_START]] + [self._index.get(c, unk) for c in word]
        return [i + 1 for i in self._sp.encode(word)]  # sentencepiece id + 1: 0 is the blank

    def encode(self, text: str) -> list[int]:
        return [t for w in words_of(text) for t in self.encode_word(w)]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Token ids (blank and repeats already removed) -> words; <unk> pieces dropped."""
        pieces = [self.symbols[i] for i in ids if 0 < i < len(self.symbols)]
        text = "".join(p for p in pieces if p != UNK).replace(WORD_START, " ")
        return text.split()

    def spellable(self, word: str) -> bool:
        """Whether `word` is spelled without <unk> (a lexicon entry that can be output)."""
        unk = self._index.get(UNK)
        return bool(word) and unk not in self.encode_word(word)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "symbols": list(self.symbols), "digest": self.digest,
                "sp_model": base64.b64encode(self.sp_model).decode("ascii")}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Tokenizer":
        try:
            return cls(d["kind"], list(d["symbols"]), base64.b64decode(d.get("sp_model") or ""))
        except KeyError as exc:
            raise TokenizerError(f"tokenizer record lacks {exc}") from exc


def train_tokenizer(texts: Iterable[str], kind: str = "char", vocab_size: int = 64
                    ) -> Tokenizer:
    """A tokenizer from transcripts (the labeled split's): every character seen (char),
    or a sentencepiece BPE model of about `vocab_size` pieces (bpe; fewer when the text
    has fewer)."""
    sentences = [" ".join(w) for w in (words_of(t) for t in texts) if w]
    if not sentences:
        raise TokenizerError("no transcript with words to train the tokenizer on")
    if kind == "char":
        chars = sorted({c for s in sentences for c in s if c != " "})
        return Tokenizer("char", [BLANK, UNK, WORD_START] + chars)
    if kind == "bpe":
        return _train_bpe(sentences, vocab_size)
    raise TokenizerError(f"unknown tokenizer kind {kind!r} (char or bpe)")


def _train_bpe(sentences: Sequence[str], vocab_size: int) -> Tokenizer:
    import sentencepiece as spm

    chars = {c for s in sentences for c in s if c != " "}
    # sentencepiece needs room for every character, <unk> and the word-start piece
    size = max(int(vocab_size), len(chars) + 2)
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=buf, model_type="bpe",
        vocab_size=size, hard_vocab_limit=False, character_coverage=1.0, unk_id=0,
        bos_id=-1, eos_id=-1, pad_id=-1, num_threads=1, minloglevel=2)
    model = buf.getvalue()
    sp = spm.SentencePieceProcessor(model_proto=model)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    return Tokenizer("bpe", [BLANK] + pieces, model)


def ctc_min_frames(ids: Sequence[int]) -> int:
    """Output frames CTC needs for target `ids`: one per token, plus a blank between
    each pair of equal neighbours."""
    return len(ids) + sum(1 for a, b in zip(ids, ids[1:]) if a == b)
