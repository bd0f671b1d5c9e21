"""The trigger form's checks: the override format Airflow validates with, and the plain
words a refused trigger is explained in.

Airflow checks a DAG's params with jsonschema (and `FormatChecker()`) when a run is
triggered, from the form or the REST API, before any task runs. A format whose checker
raises FormatError itself puts that message in the refusal, so the user reads
"unknown key train.foo" instead of a regular expression over every key. Registered by the
DAG files (parse time, in-process checks) and the amflow plugin (the API server, where
the trigger is checked).

Airflow's own refusal names the first bad param only, as jsonschema's dump of the
failing schema ("Failed validating 'exclusiveMinimum' in schema: {...}"), and of several
bad override lines only one. `param_problems` says what is wrong with every param and
every line, one plain line each, with the limit a number must keep
(amflow.trigger_refusal puts it in the refusal the UI shows).
"""
from __future__ import annotations

from typing import Any

from jsonschema import FormatChecker
from jsonschema.exceptions import FormatError

from core.config import check_override

OVERRIDE_FORMAT = "amflow-override"


def _check(instance: object) -> bool:
    if not isinstance(instance, str):
        return True  # the schema's "type" refuses non-strings with its own message
    message = check_override(instance)
    if message:
        raise FormatError(message)
    return True


def register() -> None:
    """Make every later FormatChecker() know the format (idempotent)."""
    FormatChecker.checkers[OVERRIDE_FORMAT] = (_check, ())


# ------------------------------------------------------------------ plain words
TYPE_WORDS = {"number": "a number", "integer": "a whole number", "string": "text",
              "boolean": "true or false", "array": "a list", "object": "a mapping"}


def _num(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() else f"{v:,}"


def limits_text(schema: dict[str, Any]) -> str:
    """The range a number param takes, in words: "from 1 to 1,024" (a whole number's
    exclusive bounds as the inclusive ones the user types), "more than 0 and less than
    10,000,000" (a number's)."""
    whole = "integer" in _types(schema)
    lo = schema.get("minimum")
    hi = schema.get("maximum")
    lo_x, hi_x = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if whole:
        lo = lo if lo is not None else (None if lo_x is None else int(lo_x) + 1)
        hi = hi if hi is not None else (None if hi_x is None else -int(-hi_x) - 1)
        lo_x = hi_x = None
    parts = []
    if lo is not None:
        parts.append(f"at least {_num(lo)}")
    if lo_x is not None:
        parts.append(f"more than {_num(lo_x)}")
    if hi is not None:
        parts.append(f"at most {_num(hi)}")
    if hi_x is not None:
        parts.append(f"less than {_num(hi_x)}")
    if whole and lo is not None and hi is not None:
        return f"a whole number from {_num(lo)} to {_num(hi)}"
    return " and ".join(parts)


def _types(schema: dict[str, Any]) -> list[str]:
    t = schema.get("type", [])
    return [t] if isinstance(t, str) else list(t)


def _shown(value: Any) -> str:
    return "nothing" if value is None else repr(value)


def _plain(err, schema: dict[str, Any]) -> str:
    """One jsonschema error as words (the format checker's own message kept)."""
    v, got = err.validator, err.instance
    if v == "format":
        return err.message
    if v in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return f"{_shown(got)} is out of range: it must be {limits_text(err.schema)}"
    if v == "type":
        wanted = " or ".join(TYPE_WORDS.get(t, t) for t in _types(err.schema) if t != "null")
        return f"expected {wanted}, got {_shown(got)}"
    if v == "enum":
        allowed = ", ".join(repr(x) for x in err.validator_value if x is not None)
        return f"{_shown(got)} is not one of {allowed}"
    if v == "minLength":
        return "must not be empty"
    if v == "pattern":
        return f"{_shown(got)} is not in the form the field's description gives"
    return err.message.split("\n")[0]


def param_problems(params: dict[str, dict[str, Any]], conf: dict[str, Any]) -> list[str]:
    """Every problem of a trigger's `conf` against a DAG's params (`name: {"schema":
    {...}, "value": default}`), one line each: `<title> (<name>): <what is wrong>`, or
    `<title> (<name>), line <n>: ...` for an item of a list (an override line)."""
    from jsonschema import Draft202012Validator

    register()
    out = []
    for name, spec in params.items():
        schema = dict(spec.get("schema") or {})
        value = conf[name] if name in conf else spec.get("value")
        title = f"{schema.get('title') or name} ({name})"
        validator = Draft202012Validator(schema, format_checker=FormatChecker())
        for err in sorted(validator.iter_errors(value), key=lambda e: list(e.path)):
            where = title
            if err.path and isinstance(err.path[0], int):
                where = f"{title}, line {err.path[0] + 1}"
            out.append(f"{where}: {_plain(err, schema)}")
    return out
