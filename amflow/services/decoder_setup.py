"""A decode's inputs resolved through the run layout, shared by `amflow decode`,
`pseudolabel`, `export`, `serve` and the decode benchmark: the step folder of a tagged
decode or export, the model (train[-<tag>] or --model), the run's LM (lm/lm.arpa or
decode.lm) and lexicon, the graph cache runs/<R>/graph/, what a decode's words depend on
(`decode_inputs`), and the decoder assembled from them (`decoding.assets.DecoderAssets`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from core.runs import StepContext, StepError, step_dir_name
from core.storage import digest_of
from decoding import decode as D
from decoding.assets import DecoderAssets
from tasks.select import corpus_fingerprint
from amflow.services.train_plan import model_dir_name


def tagged_context(ctx: StepContext, step: str = "decode", name: str = "") -> StepContext:
    """The context of <step>[-<decode.tag>] (the CLI gives the plain step name): decode's
    and export's, which resolve their inputs alike (`resolve_inputs`); `name`: that
    folder instead (export's follows its model)."""
    name = name or step_dir_name(step, ctx.cfg.decode.tag)
    if ctx.step == name:
        return ctx
    new = StepContext(ctx.cfg, ctx.run_id, name, force=ctx.force)
    new.started = ctx.started
    return new


def model_uri(ctx: StepContext, model: str | None) -> str:
    """--model: a train step of this run (its model.pt: `train-baseline`) or a model URI;
    by default train[-<decode.tag>]/model.pt."""
    uri = step_or_uri(ctx, model) if model else ctx.other(model_dir_name(ctx.cfg.decode.tag),
                                                          "model.pt")
    if not ctx.storage.exists(uri):
        raise StepError(f"model {uri} not found: train one with `amflow train`, or pass "
                        f"--model a train step of run {ctx.run_id} (e.g. train-baseline) or "
                        "a model.pt URI")
    return uri


def step_or_uri(ctx: StepContext, model: str) -> str:
    """--model as given: a model URI (a path, or a name ending in .pt) as it is, a bare name
    as that train step of the run (`train-baseline` -> its model.pt)."""
    if "/" in model or "://" in model or model.endswith(".pt"):
        return model
    return ctx.other(model, "model.pt")


def resolve_inputs(ctx: StepContext, args: Any) -> tuple[str, str]:
    """(the model's URI, the corpus) of --model and --data (default data.corpus)."""
    corpus = getattr(args, "data", None) or ctx.cfg.data.corpus
    return model_uri(ctx, getattr(args, "model", None)), corpus


def lm_uri(ctx: StepContext) -> tuple[str, str]:
    """(the LM's URI, how to make it when missing): decode.lm, else this run's lm step."""
    if ctx.cfg.decode.lm:
        return ctx.cfg.decode.lm, "decode.lm does not exist"
    return ctx.other("lm", "lm.arpa"), (f"run `amflow lm --run-id {ctx.run_id}` first "
                                        "(or set decode.lm to an ARPA file)")


def load_assets(ctx: StepContext, model: str, corpus: str,
                read: dict[str, bytes] | None = None) -> DecoderAssets:
    """The decoder for `model` with this run's lexicon, LM and graph cache (`read`: those
    objects' bytes, read once by `read_inputs`)."""
    lm, hint = lm_uri(ctx)
    return DecoderAssets.load(
        ctx.storage, ctx.cfg.decode, model_uri=model,
        lexicon_uri=ctx.cfg.data.lexicon_uri(corpus), lm_uri=lm,
        graph_root=ctx.other("graph"), lm_hint=hint, require=("cmvn", "phones"), read=read)


def read_inputs(ctx: StepContext, model: str, corpus: str) -> dict[str, bytes]:
    """The model's, LM's and lexicon's bytes (those that exist), read once: the digests
    decode_inputs keeps are those of the bytes the decoder then loads, and a multi-GB LM
    on S3 is fetched once, not twice."""
    st = ctx.storage
    uris = (model, lm_uri(ctx)[0], ctx.cfg.data.lexicon_uri(corpus))
    read = {u: st.read_bytes(u) for u in uris if st.exists(u)}
    if model in read:
        read[model] = chunked(ctx, read[model], model)
    return read


def chunked(ctx: StepContext, data: bytes, model: str) -> bytes:
    """The model's bytes with decode.chunking's attention chunks (a Conformer; "": as they
    are). Their digest is the decode's model_digest, so another chunking decodes anew."""
    from core.config.decode import chunking_of
    from training.checkpoint import with_chunking

    try:
        return with_chunking(data, chunking_of(ctx.cfg.decode.chunking))
    except ValueError as exc:
        raise StepError(f"decode.chunking={ctx.cfg.decode.chunking}: {model}: {exc}") from None


# decode.* keys that place or pace the decode, or name where it goes: the words are the
# same whatever they are (decode.lm is an input, compared by its digest).
OPERATIONAL_KEYS = {"tag", "workers", "batch_frames", "lm"}


def decode_inputs(ctx: StepContext, model: str, corpus: str, split: str,
                  read: dict[str, bytes] | None = None) -> dict[str, Any]:
    """What a decode's words depend on: the model, LM and lexicon (their URIs and their
    bytes' digests: one trained or made again at the same URI decodes differently), the
    corpus (made from other inputs: `corpus_fingerprint`) and split, and the decode keys
    that shape the search. `read`: `read_inputs`' bytes (else each is read here)."""
    st = ctx.storage
    read = read if read is not None else read_inputs(ctx, model, corpus)
    lm, lexicon = lm_uri(ctx)[0], ctx.cfg.data.lexicon_uri(corpus)
    keys = {k: v for k, v in dataclasses.asdict(ctx.cfg.decode).items()
            if k not in OPERATIONAL_KEYS}
    gate = D.decode_gate(ctx.cfg)  # off: absent, so decodes recorded before it stay done
    keys.pop("speech_gate")
    if not keys["chunking"]:  # the model's own: absent, so decodes recorded before it stay done
        keys.pop("chunking")
    if gate is not None:
        keys["speech_gate"] = dataclasses.asdict(gate)

    def digest(uri: str) -> str | None:
        return digest_of(read[uri]) if uri in read else None

    return {"model": model, "model_digest": digest(model), "data": corpus,
            "data_fingerprint": corpus_fingerprint(st, corpus), "split": split,
            "lm": lm, "lm_digest": digest(lm), "lexicon": lexicon,
            "lexicon_digest": digest(lexicon), "decode": keys}


def ctc_graph(ctx: StepContext, card, read: dict[str, bytes]) -> tuple[str, dict, set]:
    """A CTC model's T o L o G over the LM's words (cached in runs/<R>/graph/<key>/):
    (local dir, info, vocabulary)."""
    from decoding.assets import ensure_graph, load_lm
    from decoding.ctc_graph import build_tlg, lm_words
    from training.ctc.tokens import Tokenizer

    lm, hint = lm_uri(ctx)
    arpa = load_lm(ctx.storage, lm, hint, read)
    tok = Tokenizer.from_dict(card.tokenizer)
    topology = ctx.cfg.decode.ctc_topology
    repeats = "blank" if topology == "standard" else "compact"
    key = ["ctc-tlg"] if topology == "compact" else ["ctc-tlg", f"repeats={repeats}"]
    graph_dir, info = ensure_graph(ctx.storage, ctx.other("graph"), None, "", arpa,
                                   [*tok.symbols, tok.digest, *key], 0.0,
                                   builder=lambda: build_tlg(tok, arpa, repeats=repeats))
    return graph_dir, info, set(lm_words(arpa))
