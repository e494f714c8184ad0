"""Admission with bounded bypass (API.md section 2, Admission). Pure: the store gathers the
facts of each finite scope the request competes in; this decides.

A request competes in the global scope (if the global limit is finite) and in its named
pool (if finite). In each scope the head is the first queued request by (priority desc,
eligibleAt, uid). A younger request may pass a head only while the head does not fit now
and its bypass count is below the scope's maxBypass; each pass is counted."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Request:
    uid: str
    name: str
    slots: int
    bypass_count: int = 0


@dataclass(frozen=True)
class Scope:
    name: str  # "global" or the pool's name
    capacity: int | None  # None = unlimited: such a scope orders nobody
    used: int
    max_bypass: int
    head: Request | None  # first queued request in this scope (may be the request itself)
    head_fits: bool = False  # does the head fit right now (all its own scopes and a node)

    def free(self) -> int | None:
        return None if self.capacity is None else self.capacity - self.used


@dataclass(frozen=True)
class Decision:
    admit: bool
    reason: str = ""
    message: str = ""
    bypassed: list[Request] = field(default_factory=list)  # heads passed; their counters go up by one


def fits(request: Request, scopes: list[Scope]) -> bool:
    return all(s.capacity is None or request.slots <= s.capacity - s.used for s in scopes)


def decide(request: Request, scopes: list[Scope]) -> Decision:
    bypassed: list[Request] = []
    for scope in scopes:
        head = scope.head
        if scope.capacity is None or head is None or head.uid == request.uid:
            continue
        if scope.head_fits:
            # messages name no other job: they stay stable while the line moves, so a waiting
            # job's status is not rewritten each time it is looked at
            return Decision(False, "WaitingForTurn", f"an older job in {scope.name} fits first")
        if head.bypass_count >= scope.max_bypass:
            return Decision(
                False,
                "BypassLimit",
                f"the oldest job in {scope.name} was passed {scope.max_bypass} times and goes first",
            )
        if all(b.uid != head.uid for b in bypassed):  # one pass counts once, however many scopes it shares
            bypassed.append(head)
    for scope in scopes:
        if scope.capacity is not None and request.slots > scope.capacity - scope.used:
            return Decision(
                False,
                "InsufficientSlots",
                f"{scope.name}: {scope.used}/{scope.capacity} slots in use, {request.slots} needed",
            )
    return Decision(True, "SlotsGranted", "slots granted", bypassed)
