"""The trigger form's override check, as a JSON-schema `format` Airflow validates with.

Airflow checks a DAG's params with jsonschema (and `FormatChecker()`) when a run is
triggered, from the form or the REST API, before any task runs. A format whose checker
raises FormatError itself puts that message in the refusal, so the user reads
"unknown key train.foo" instead of a regular expression over every key. Registered by the
DAG files (parse time, in-process checks) and the amflow plugin (the API server, where
the trigger is checked).
"""
from __future__ import annotations

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
