"""The table of kinds: model classes and the names the CLI accepts for each."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from ..errors import InvalidInput
from .job import Job
from .node import Node
from .notifier import Notifier
from .pool import Pool
from .source import Source


@dataclass(frozen=True)
class KindInfo:
    kind: str
    plural: str
    model: type[BaseModel]
    aliases: tuple[str, ...]

    @property
    def qualified(self) -> str:
        return qualified(self.kind)


def qualified(kind: str) -> str:
    """`job.reconciler.dev`, as kubectl prints it; also for kinds that are only read
    (Service, the registry's entries)."""
    return f"{kind.lower()}.reconciler.dev"


KINDS: dict[str, KindInfo] = {
    info.kind: info
    for info in (
        KindInfo("Job", "jobs", Job, ("job", "jobs", "jb")),
        KindInfo("Pool", "pools", Pool, ("pool", "pools", "pl")),
        KindInfo("Node", "nodes", Node, ("node", "nodes", "no")),
        KindInfo("Notifier", "notifiers", Notifier, ("notifier", "notifiers", "nf")),
        KindInfo("Source", "sources", Source, ("source", "sources", "src")),
    )
}
_BY_ALIAS = {
    alias: info for info in KINDS.values() for alias in (*info.aliases, info.qualified, f"{info.plural}.reconciler.dev")
}


def resolve_kind(word: str, also: tuple[str, ...] = ()) -> KindInfo:
    """The kind a word names; an unknown word is refused listing the kinds known, with `also`
    (what the asking verb takes besides: `get` lists services and events)."""
    info = _BY_ALIAS.get(word.lower())
    if info is None:
        names = ", ".join([*(i.plural for i in KINDS.values()), *also])
        raise InvalidInput(f"unknown resource type {word!r}; known: {names}")
    return info


def split_ref(ref: str, default_kind: str | None = None) -> tuple[KindInfo, str]:
    """`job/analyze-1` -> (Job, analyze-1)."""
    kind, sep, name = ref.partition("/")
    if sep:
        return resolve_kind(kind), name
    if default_kind is None:
        raise InvalidInput(f"{ref!r}: expected KIND/NAME, e.g. job/{ref}")
    return KINDS[default_kind], ref
