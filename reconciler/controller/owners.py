"""Who owns a spawn or a notifier's deliveries: a process (`host:pid:start`, agent.local),
and for a controller elected through the lease (`serve`) also its term: `host:pid:start/termN`.
A process that leads, steps down (paused, cut off) and lives on must not keep what it claimed
as leader: a controller of a later term takes it over, as it would from a dead process."""

from __future__ import annotations

from ..agent.local import owner_gone, process_owner

_TERM = "/term"


def controller_owner(term: int | None) -> str:
    """This process as an owner; in `term` when it leads through the lease."""
    return process_owner() if term is None else f"{process_owner()}{_TERM}{term}"


def process_of(owner: str) -> str:
    """The process part of an owner (`host:pid:start`), without the term it led in."""
    return owner.partition(_TERM)[0]


def term_of(owner: str) -> int | None:
    _, sep, term = owner.rpartition(_TERM)
    return int(term) if sep and term.isdigit() else None


def released(owner: str, me: str) -> bool:
    """Whether `owner` (not `me`) can hold nothing any more: its process is proven gone on
    this host, or it led in a term before mine."""
    if owner_gone(process_of(owner)):
        return True
    theirs, mine = term_of(owner), term_of(me)
    return theirs is not None and mine is not None and theirs < mine
