"""`amflow lm`: estimate the run's word n-gram (decoding/lm.py), write runs/<R>/lm/lm.arpa,
report perplexity and OOVs on dev and test."""
from __future__ import annotations

import functools
import time
from typing import Any

from core.config import LmConfig
from core.runs import StepContext
from decoding.lm import dev_test_metrics, estimate, lexicon_vocabulary
from decoding.lm_sources import fit_warnings, lm_text
from tasks.select import read_records


def _already_done(ctx: StepContext) -> dict | None:
    """The earlier result when it was made with these lm.* settings (--force redoes it)."""
    lc, st = ctx.cfg.lm, ctx.storage
    if ctx.force or not st.exists(ctx.path("_SUCCESS.json")):
        return None
    done = st.read_json(ctx.path("_SUCCESS.json"))
    metrics = done.get("metrics", {})
    settings = {k: metrics.get(k) for k in ("order", "min_count")}
    if settings == {"order": lc.order, "min_count": lc.min_count} and \
            metrics.get("sentences_config") == _text_config(lc):
        print(f"lm: {ctx.step_uri} already finished with these settings; --force redoes it")
        return done
    return None


def _text_config(lc: LmConfig) -> list:
    """The lm.* keys that choose the text (a finished LM of other text is redone)."""
    return [lc.sentences, lc.seed, lc.text_split, lc.source, lc.text_file]


def run(ctx: StepContext, args: Any = None) -> dict:
    """`amflow lm`: estimate the word n-gram, write ARPA, report perplexity and OOVs."""
    done = _already_done(ctx)
    if done is not None:
        return done
    cfg, st, lc = ctx.cfg, ctx.storage, ctx.cfg.lm
    t0 = time.time()
    # the corpus's records, read once for every split that needs them (on S3 each read
    # is a round trip per metadata file)
    records = functools.cache(lambda: read_records(st, cfg.data.corpus)[0])
    text, made = lm_text(st, lc, cfg.data.corpus, records)
    lexicon_uri = cfg.data.lexicon_uri()
    model = estimate(text, lc.order, vocabulary=lexicon_vocabulary(st, lexicon_uri),
                     min_count=lc.min_count)
    arpa_uri = ctx.path("lm.arpa")
    st.write_text(arpa_uri, model.to_arpa())
    metrics: dict = {"order": lc.order, "min_count": lc.min_count,
                     "sentences_config": _text_config(lc), "text": made, "sentences": len(text),
                     "tokens": sum(len(s) for s in text), "vocabulary": len(model.vocabulary()),
                     "ngrams": model.num_ngrams()}
    metrics.update(dev_test_metrics(st, cfg.data.corpus, model, text, records))
    metrics["fit_warnings"] = fit_warnings(metrics, metrics["vocabulary"], made)
    print(f"lm: {lc.order}-gram, {metrics['sentences']} sentences ({made}), n-grams "
          f"{metrics['ngrams']}; " + "; ".join(
              f"{s} perplexity {metrics[s]['perplexity']:.2f} OOV {100 * metrics[s]['oov_rate']:.2f} %"
              for s in ("dev", "test") if s in metrics), flush=True)
    return ctx.finish(inputs={"corpus": cfg.data.corpus, "lexicon": lexicon_uri},
                      counts={"in": len(text), "out": len(text), "rejected": 0},
                      metrics=metrics, extra={"lm": arpa_uri, "wall_s_estimate": round(time.time() - t0, 2)})
