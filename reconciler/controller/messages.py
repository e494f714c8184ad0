"""A queue message's body as a Job (API.md 1.3, Source): a Job manifest (YAML or JSON) or the
seed's job request, with the Source's template merged under it, validated as `apply`
validates a manifest. Pure: no store, no queue; what needs the store (names, references)
is intake.py's, in the transaction that stores the job."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import orjson
import yaml
from pydantic import BaseModel, ValidationError

from ..api.annotations import user_annotations
from ..api.job import Job
from ..api.meta import API_VERSION, dump
from ..api.oneoff import JobRequest
from ..api.source import job_defaults
from ..manifests import resolve_working_dir
from ..problems import field_problems
from ..yamldoc import MAX_NODES, ManifestLoader, construct, expanded_size, surely_small

MAX_BODY = 1024 * 1024  # bytes: a job is a few hundred; a larger body is refused unread
PLACEHOLDER = "unnamed"  # validates a job that is named job-N once the store is asked
# spec fields the message replaces whole, not key by key: an artifact's sha256 is the digest
# of its url's zip, so the template's must not stay beside the message's url
WHOLE = frozenset({"artifact"})
M = TypeVar("M", bound=BaseModel)


@dataclass(slots=True)
class Draft:
    """A message read: the validated job (named, or to be named job-N), or why it is none."""

    job: Job | None = None
    named: bool = False  # the manifest named it; else intake names it job-N
    problem: str | None = None  # `field.path: message`, as apply names a field
    spec: dict[str, Any] | None = None  # the job's spec as stored (meta.dump), when made with it


class Drafter:
    """A Source's drafts: `draft` under its template, with a shortcut for the seed's plainest
    request. A request that gives a command and perhaps env_vars, and nothing else, differs
    from the template's own job only in spec.shell and spec.env; such a request takes that
    job, validated once, with its two fields checked by the rules JobSpec checks them by and
    set, instead of a validation of the whole merged document (a third of storing a message).
    Anything else, and any request those rules refuse (so the refusal names the field as
    apply does), is drafted the long way. tests/test_drafts.py holds the two ways equal."""

    def __init__(self, template: dict[str, Any], base_dir: Path):
        self.template = template
        self.base_dir = base_dir
        self._base = _base_job(template, base_dir)
        self._base_spec = None if self._base is None else dump(self._base.spec)
        self._base_env: dict[str, str] = {} if self._base is None else self._base.spec.env

    def draft(self, body: bytes) -> Draft:
        if len(body) <= MAX_BODY and self._base is not None:
            try:
                data = orjson.loads(body)
            except ValueError:  # not JSON, or not UTF-8: the long way says which
                data = None
            if isinstance(data, dict) and "kind" not in data and "apiVersion" not in data:
                quick = self.shortcut(data)
                if quick is not None:
                    return quick
        return draft(body, self.template, base_dir=self.base_dir)

    def shortcut(self, data: dict[str, Any]) -> Draft | None:
        """A request's draft by the shortcut, or None when it must go the long way."""
        base = self._base
        if base is None or self._base_spec is None:
            return None
        try:
            request = JobRequest.model_validate(data)
        except ValidationError:
            return None
        shell, env = request.command, request.env_vars
        if (
            not shell
            or "\0" in shell
            or request.deploy_url
            or request.port is not None
            or request.instance_id
            or "job_type" in request.model_fields_set
            or not all(_env_entry_ok(k, v) for k, v in env.items())
        ):
            return None
        merged = {**self._base_env, **env} if env else self._base_env
        fields_set = base.spec.model_fields_set | ({"env"} if env else set())
        spec = _replaced(base.spec, {"shell": shell, "env": merged}, fields_set)
        job = _replaced(base, {"spec": spec}, set(base.model_fields_set))
        return Draft(job=job, spec={**self._base_spec, "shell": shell, "env": dict(merged)})


def draft(body: bytes, template: dict[str, Any], *, base_dir: Path | None = None) -> Draft:
    """The job a message body asks for, with `template` under it; never raises for what the
    body says (every problem is a Draft's). A relative workingDir resolves against `base_dir`
    (default: the current directory, where the controller runs), as the seed's `POST /jobs` does."""
    if len(body) > MAX_BODY:
        return Draft(problem=f"body: {len(body)} bytes, more than the {MAX_BODY} a message may have")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Draft(problem=f"body: not UTF-8 text (byte {exc.start})")
    data, problem = _data(text)
    if problem is not None:
        return Draft(problem=problem)
    if not isinstance(data, dict):
        return Draft(problem="body: must be a Job manifest or a job request (a mapping), not " + _what(data))
    if "kind" in data or "apiVersion" in data:
        document, named, problem = _manifest(data)
    else:
        document, named, problem = _request(data)
    if problem is not None:
        return Draft(problem=problem)
    return _validated(_under(template, document), named, base_dir)


def _data(text: str) -> tuple[Any, str | None]:
    """JSON first (what producers mostly send, and fastest: orjson reads a request in a
    fifth of json's time), else one YAML document (also what orjson refuses and json would
    read, such as NaN). An integer past 64 bits orjson reads as a float, which a Job's
    integer fields refuse, so such a message is rejected naming the field."""
    if not text.strip():
        return None, "body: empty"
    try:
        return orjson.loads(text), None
    except ValueError:  # orjson.JSONDecodeError is one
        pass
    loader = ManifestLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, "body: empty"
        if not surely_small(node, "*" in text) and expanded_size(node) > MAX_NODES:
            return None, f"body: more than {MAX_NODES} YAML nodes (aliases expanded)"
        data, dupes = construct(loader, node, "body")
    except yaml.composer.ComposerError as exc:
        if exc.context == "expected a single document in the stream":
            return None, "body: a message holds one Job; this holds several YAML documents"
        mark = exc.problem_mark or exc.context_mark
        line = f" (line {mark.line + 1})" if mark else ""
        return None, f"body: neither JSON nor YAML{line}: {exc.problem or exc.context}"
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f" (line {mark.line + 1})" if mark else ""
        return None, f"body: neither JSON nor YAML{line}: {exc.problem or exc.context}"
    except yaml.YAMLError as exc:
        return None, f"body: neither JSON nor YAML: {exc}"
    except RecursionError:
        return None, "body: nested too deeply"
    finally:
        loader.dispose()
    if dupes:
        return None, "; ".join(dupes)
    return data, None


def _base_job(template: dict[str, Any], base_dir: Path) -> Job | None:
    """The job a template makes with a placeholder command (the request's replaces it), or
    None when the shortcut cannot stand for the long way: the template's own job does not
    validate, or its workingDir depends on the environment (`~`), read again per message."""
    working_dir = template.get("workingDir")
    if isinstance(working_dir, str) and working_dir.startswith("~"):
        return None
    document = {"apiVersion": API_VERSION, "kind": "Job", "metadata": {"name": PLACEHOLDER}, "spec": {"shell": "true"}}
    return _validated(_under(template, document), False, base_dir).job


def _env_entry_ok(key: str, value: str) -> bool:
    """What JobSpec's env check accepts (the long way names what it refuses)."""
    return bool(key) and "=" not in key and "\0" not in key and "\0" not in value


def _replaced(model: M, changes: dict[str, Any], fields_set: set[str]) -> M:
    """A shallow copy of a validated model with `changes`, checked by the caller, set: as
    pydantic's model_construct builds one (model_copy's generic copies take three times as
    long). The nested models stay shared, as the spec cache shares a spec between jobs: a
    validated spec is never changed."""
    copy = type(model).__new__(type(model))
    object.__setattr__(copy, "__dict__", {**model.__dict__, **changes})
    object.__setattr__(copy, "__pydantic_fields_set__", fields_set)
    object.__setattr__(copy, "__pydantic_extra__", None)
    object.__setattr__(copy, "__pydantic_private__", None)
    return copy


def _what(data: Any) -> str:
    return {list: "a list", str: "a string", type(None): "null"}.get(type(data), type(data).__name__)


def _manifest(data: dict[str, Any]) -> tuple[dict[str, Any], bool, str | None]:
    if data.get("apiVersion") != API_VERSION:
        return data, False, f"apiVersion: must be {API_VERSION}"
    if data.get("kind") != "Job":
        return data, False, f"kind: a message makes a Job, not {data.get('kind')!r}"
    document = {k: v for k, v in data.items() if k != "status"}  # ignored, as apply ignores it
    metadata = document.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        return data, False, "metadata: must be a mapping"
    named = "name" in metadata
    document["metadata"] = {"name": PLACEHOLDER, **metadata}
    return document, named, None


def _request(data: dict[str, Any]) -> tuple[dict[str, Any], bool, str | None]:
    """The seed's job request, as `POST /jobs` reads it; always named job-N."""
    try:
        request = JobRequest.model_validate(data)
    except ValidationError as exc:  # named as the request spells its fields (job_type, not jobType)
        named = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        return data, False, "; ".join(named)
    if (problem := request.problem()) is not None:
        return data, False, problem
    document = {"apiVersion": API_VERSION, "kind": "Job", "metadata": {"name": PLACEHOLDER}, "spec": request.spec()}
    return document, False, None


def _under(template: dict[str, Any], document: dict[str, Any]) -> dict[str, Any]:
    """The template's defaults under the document: labels, annotations and spec fields, the
    document's winning (mappings merged key by key, anything else replaced)."""
    metadata = dict(document["metadata"])
    for field in ("labels", "annotations"):
        given = metadata.get(field)
        if isinstance(given, dict) or (given is None and template.get(field)):
            metadata[field] = {**template.get(field, {}), **(given or {})}
    merged = {**document, "metadata": metadata}
    if (spec := document.get("spec")) is not None:
        merged["spec"] = _merged(job_defaults(template), spec, WHOLE)
    return merged


def _merged(under: dict[str, Any], over: Any, whole: frozenset[str] = frozenset()) -> Any:
    if not isinstance(over, dict):
        return over
    merged = dict(under)
    for key, value in over.items():
        merged[key] = _merged(under[key], value) if isinstance(under.get(key), dict) and key not in whole else value
    return merged


def _validated(document: dict[str, Any], named: bool, base_dir: Path | None) -> Draft:
    try:
        job = Job.model_validate(document)
    except ValidationError as exc:
        return Draft(problem="; ".join(field_problems(exc)))
    if (problem := resolve_working_dir(job.spec, base_dir or Path.cwd())) is not None:
        return Draft(problem=f"spec.workingDir: {problem}")
    kept = user_annotations(job.metadata.annotations)  # the system's are the system's
    if len(kept) != len(job.metadata.annotations):  # (a model's attribute set costs more than this)
        job.metadata.annotations = kept
    return Draft(job=job, named=named)
