"""Job specs parsed once per process, by their stored text (canonical JSON). Shared: the
reconcile steps read them, and a Source's lane, which validated each job it stores, leaves
its model here so the job's first step does not validate it again (a fifth of that step)."""

from __future__ import annotations

import json

from pydantic import ValidationError

from ..api.job import JobSpec
from .runtime import TerminalError

LIMIT = 20_000  # distinct specs kept; past it the cache starts again (a DAG's jobs differ)

_SPECS: dict[str, JobSpec] = {}


def spec_of(name: str, text: str) -> JobSpec:
    """The model of a stored spec text; TerminalError when it does not validate."""
    spec = _SPECS.get(text)
    if spec is None:
        try:
            spec = JobSpec.model_validate(json.loads(text))
        except ValidationError as exc:  # stored by an older version with looser rules: retrying cannot help
            raise TerminalError(f"job {name}: its stored spec does not validate: {exc}") from None
        remember(text, spec)
    return spec


def remember(text: str, spec: JobSpec) -> None:
    """`spec` is the model of `text`, as validating the text would make it."""
    if len(_SPECS) >= LIMIT:
        _SPECS.clear()
    _SPECS[text] = spec
