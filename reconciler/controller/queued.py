"""The Queued step: admission and placement in one short transaction. A cheap read first
(`_look`) spares the write lock when the only possible decision is "wait"; otherwise the
job's queue row, its scopes (the global limit and its pool, each with its head of line) and
the nodes are read under the write lock, `admission.decide` and `placement.place` decide,
and the admission row and the status (Starting) are written together."""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Callable, Iterator
from typing import Any

from ..agent.local import LocalAgent
from ..api.meta import from_epoch
from ..api.status import Phase
from ..errors import Conflict
from ..store import Store, queuing
from ..store import repository as repo
from ..store import scheduling as sched
from ..store.transactions import Tx
from . import admission, deadlines
from .context import Ctx, commit
from .endings import Endings
from .placement import NodeView, place
from .runtime import AGAIN, Result, requeue_after

_NONE: frozenset[int] = frozenset()
PORT_POLL = 2.0  # a service that found its port taken everywhere looks again this often
SAFETY_POLL = 120.0  # a queued or waiting job looks again at least this often (jittered), whatever wakes it
MAX_SKIPPED = 64  # jobs held by their own full pool that an admission passes over in the global line


class QueuedSteps:
    """Admission of a queued job: `queued(ctx)` admits and places it (then AGAIN: Starting
    runs on what this step wrote) or says why it waits."""

    def __init__(
        self,
        store: Store,
        agent: LocalAgent,
        endings: Endings,
        *,
        wake: Callable[..., None],
        owner: str,
        rand: random.Random,
    ):
        self.store = store
        self.agent = agent
        self.endings = endings
        self.wake = wake
        self.owner = owner
        self.rand = rand

    def queued(self, ctx: Ctx) -> Result:
        spec = ctx.spec
        look = None if ctx.changed() else self._look(ctx)
        if look is not None and not look.might_admit:
            # no room in a finite scope: the decision can only be "wait", so spare the write
            # lock; a release of slots wakes the first in line
            return self._wait_in_line(ctx)
        with self.store.write(known=True) as tx:
            current = ctx.current(self.store)  # then so is what the look read, in this transaction
            if not current and repo.version(tx.session, kind="Job", name=ctx.name) != ctx.obj.resource_version:
                raise Conflict(f"job {ctx.name} changed since it was read")  # e.g. another controller admitted it
            seen = look if current else None
            known = seen.entry if seen is not None else None
            # idempotent: restores the row after a restart or a resume; the insert's answer is
            # read with the nodes' below (the lines asked after it see the row)
            asked_row = self.endings.enqueue_op(ctx)(tx) if known is None else None
            ports = self._ports_taken(tx, spec.port)
            # on a pipelined connection (PostgreSQL), the pools' facts not read yet and the
            # lines of the scopes that may be finite are asked before the nodes' answer is
            # read: one round trip for all (SQLite, with no round trips, reads them as needed)
            facts = dict(seen.facts) if seen is not None else {}
            names = (["global"] + ([spec.pool] if spec.pool else [])) if tx.session.pipelined else []
            asked = {s: sched.pool_facts_asked(tx.session, s) for s in names if s not in facts}
            lines = {
                s: queuing.in_line(tx.session, spec.pool, scope_is_pool=s != "global")
                for s in names
                if s not in facts or facts[s].capacity is not None
            }
            nodes = [_view(n, ports.get(n.name, _NONE)) for n in sched.node_facts(tx.session, ctx.now)]
            facts.update((s, read()) for s, read in asked.items())
            me = known if asked_row is None else asked_row()
            assert me is not None
            scopes, behind = self._scopes(tx.session, me, nodes, facts, lines)
            decision = admission.decide(admission.Request(me.uid, me.name, me.slots, me.bypass_count), scopes)
            placed = None
            if decision.admit:
                strategy = spec.placement.chosen_strategy
                round_robin = strategy == "round-robin"
                placed = place(
                    nodes,
                    slots=spec.slots,
                    node_name=spec.placement.node_name,
                    selector=spec.placement.node_selector,
                    strategy=strategy,
                    turn=sched.round_robin_next(tx.session) if round_robin else 0,
                    port=spec.port,
                    cpu=spec.resources.cpu or 0.0,
                    memory=spec.resources.memory or 0,
                )
                if round_robin and placed.node is not None:
                    sched.round_robin_turn(tx)  # taken only by a job placed: the rotation survives restarts
            woken: list[str] | None = None
            if placed is not None and placed.node is not None:
                self._admit(tx, ctx, me, placed.node, placed.message, decision.bypassed)
                # the next in a line this job headed may fit in what is left: it must not wait
                # for a timer (it may have looked first and waited behind this job)
                woken = [
                    after.name
                    for s in scopes
                    if s.name in behind and (s.free() or 0) > spec.slots and (after := behind[s.name]()) is not None
                ]
            else:
                self._hold(tx, ctx, placed.message if placed is not None else None, decision)
        if woken is not None:
            for name in woken:
                self.wake(name, urgent=True)
            return AGAIN
        for scope in scopes:  # a head that fits must not wait for a timer
            if scope.head is not None and scope.head_fits and scope.head.uid != ctx.uid:
                self.wake(scope.head.name, urgent=True)
        if spec.port is not None and placed is not None:
            # a port is freed by processes nothing here hears of: looked at again soon
            return requeue_after(deadlines.soonest(ctx.now, ctx.now + PORT_POLL, ctx.job_deadline()))
        return self._wait_in_line(ctx)

    def _admit(
        self, tx: Tx, ctx: Ctx, me: queuing.QueueEntry, node: str, placement: str, bypassed: list[admission.Request]
    ) -> None:
        """Write the admission (its row, the queue row gone, the heads passed counted) and
        the status, Starting, with its events."""
        spec, status = ctx.spec, ctx.status
        number = max((r["number"] for r in status.get("runs", [])), default=0) + 1
        owner = self.owner if node == self.agent.node else None
        admitted_at = sched.admit(
            tx,
            uid=ctx.uid,
            name=ctx.name,
            pool=spec.pool,
            slots=spec.slots,
            node=node,
            run_number=number,
            owner=owner,
            port=spec.port,
            cpu=spec.resources.cpu or 0.0,
            memory=spec.resources.memory or 0,
        )
        for passed in bypassed:
            queuing.count_bypass(tx, passed.uid)
        status["admission"] = {"pool": spec.pool, "slots": spec.slots, "admittedAt": from_epoch(admitted_at)}
        status["nodeName"] = node
        status["bypassCount"] = me.bypass_count
        in_pool = f" in pool {spec.pool}" if spec.pool else ""
        ctx.move(Phase.STARTING, "Admitted", f"run {number}: {spec.slots} slot(s) granted{in_pool}")
        ctx.note("Scheduled", placement)
        commit(tx, ctx)
        # what Starting would read back at once: it is what this transaction wrote
        self.endings.admitted[ctx.uid] = sched.Admission(node, number, owner)

    @staticmethod
    def _hold(tx: Tx, ctx: Ctx, unschedulable: str | None, decision: admission.Decision) -> None:
        """Not admitted: say why (no node could take it, or the admission's decision), unless
        only its place in line moved; written only if something changed."""
        status = ctx.status
        if unschedulable is not None:
            reason, message = "Unschedulable", unschedulable
        else:
            reason, message = decision.reason, decision.message
        said = (status.get("reason"), status.get("message"))
        # a move within the line alone is not written (see _IN_LINE); with another change it is
        moved_in_line_only = not ctx.changed() and _both_in_line(said[0], reason)
        if said != (reason, message) and not moved_in_line_only:
            status["reason"], status["message"] = reason, message
            if reason == "Unschedulable":
                ctx.note("FailedScheduling", message, warning=True)
        if ctx.changed() or ctx.ops:
            commit(tx, ctx)

    def _ports_taken(self, tx: Tx, port: int | None) -> dict[str, frozenset[int]]:
        """For a service with a port: the ports services hold on each node and, on this
        controller's own node, whether another process listens on it (a bind test)."""
        if port is None:
            return {}
        taken = {node: frozenset(held) for node, held in sched.ports_taken(tx.session).items()}
        mine = taken.get(self.agent.node, _NONE)
        if port not in mine and not self.agent.port_free(port):
            taken[self.agent.node] = mine | {port}
        return taken

    def _wait_in_line(self, ctx: Ctx) -> Result:
        """Until a release of slots wakes the job, or the jittered safety poll, or its deadline;
        the jitter keeps a deep queue from being re-checked in one burst."""
        safety = SAFETY_POLL * (0.5 + self.rand.random())
        return requeue_after(deadlines.soonest(ctx.now, ctx.now + safety, ctx.job_deadline()))

    def _look(self, ctx: Ctx) -> _Look:
        """A cheap read: might_admit is False when a finite scope has no room for this job,
        its queue row is in place and its status already says so; an admission attempt could
        then only repeat "wait", so the write lock is spared."""
        pools = ["global"] + ([ctx.spec.pool] if ctx.spec.pool else [])
        with self.store.read() as session:
            entry, facts = sched.queued_with_pools(session, ctx.uid, pools)
        if entry is None:
            return _Look(True, None, {})  # restore the row (after a restart) through the full step
        scopes = [admission.Scope(p, f.capacity, f.used, f.max_bypass, None) for p, f in facts.items()]
        verdict = admission.decide(admission.Request(ctx.uid, ctx.name, ctx.spec.slots), scopes)
        said = (ctx.status.get("reason"), ctx.status.get("message"))
        if verdict.admit:
            return _Look(True, entry, facts)
        might = said != (verdict.reason, verdict.message) and not _both_in_line(said[0], verdict.reason)
        return _Look(might, entry, facts)

    def _scopes(
        self,
        session: Any,
        me: queuing.QueueEntry,
        nodes: list[NodeView],
        facts_cache: dict[str, sched.PoolFacts],
        lines: dict[str, Iterator[queuing.QueueEntry]],
    ) -> tuple[list[admission.Scope], dict[str, Callable[[], queuing.QueueEntry | None]]]:
        """The finite scopes the job queues in, each with its head of line, and for those
        the job heads, what finds the next in line that a node could take (reading on from
        where the head was found, only if called); `facts_cache` holds the pools' facts
        already read in this transaction, `lines` the scopes' lines already asked for."""
        scopes = []
        behind: dict[str, Callable[[], queuing.QueueEntry | None]] = {}

        def facts(pool: str) -> sched.PoolFacts:
            if pool not in facts_cache:
                facts_cache[pool] = sched.pool_facts(session, pool)
            return facts_cache[pool]

        def fits_now(entry: queuing.QueueEntry) -> bool:
            own = [facts("global")] + ([facts(entry.pool)] if entry.pool else [])
            room = all(f.capacity is None or entry.slots <= f.capacity - f.used for f in own)
            placed = place(nodes, **_needs(entry))
            return room and placed.node is not None

        # A queued job that no node could take even empty (pinned to a missing, cordoned or
        # NotReady node, a selector nobody matches, more slots than any node has) is
        # Unschedulable, not short of slots: it does not hold its scope's line, or once passed
        # maxBypass times it would stop every younger job until a node for it turns up.
        empty = [dataclasses.replace(n, allocated=0, cpu_allocated=0.0, memory_allocated=0) for n in nodes]

        def could_place(entry: queuing.QueueEntry) -> bool:
            placed = place(empty, **_needs(entry))
            return placed.node is not None

        # Nor, in the global line, does one that global has room for but its own full pool
        # holds back: passing it there takes nothing it waits for, so it is no pass, and once
        # passed maxBypass times it would hold every job of the store behind one full pool.
        # Skipped cheaply (the pool's facts are read once) and at most MAX_SKIPPED of them, so
        # that an admission never walks a long line; past that, the next one heads as before.
        def heads(entry: queuing.QueueEntry, scope: str, free: int, skipped: list[int]) -> bool:
            if entry.uid == me.uid:
                return True
            if scope == "global" and entry.pool and entry.slots <= free and skipped[0] < MAX_SKIPPED:
                own = facts(entry.pool)
                if own.capacity is not None and entry.slots > own.capacity - own.used:
                    skipped[0] += 1
                    return False
            return could_place(entry)

        for scope_name in ["global"] + ([me.pool] if me.pool else []):
            f = facts(scope_name)
            if f.capacity is None:
                continue
            line = lines.get(scope_name) or queuing.in_line(session, me.pool, scope_is_pool=scope_name != "global")
            skipped = [0]
            head = next((e for e in line if heads(e, scope_name, f.capacity - f.used, skipped)), None)
            head_fits = head is not None and head.uid != me.uid and fits_now(head)
            scopes.append(admission.Scope(scope_name, f.capacity, f.used, f.max_bypass, _request(head), head_fits))
            if head is not None and head.uid == me.uid:
                behind[scope_name] = functools.partial(next, filter(could_place, line), None)
        return scopes, behind


@dataclasses.dataclass(frozen=True)
class _Look:
    """What the read before an admission attempt found: whether it might admit, and the
    job's queue row and its scopes' pool facts, which the attempt reuses when it runs in the
    same transaction."""

    might_admit: bool
    entry: queuing.QueueEntry | None
    facts: dict[str, sched.PoolFacts]


# Queued behind an older job that fits first, or short of slots: the one flips to the other
# each time a slot frees and the head of the line takes it. A job already queued for one is
# not rewritten for the other (a status write each, for nothing a user acts on); what holds
# it now is in the live view of the line that `get` and `describe` show (status.queue).
_IN_LINE = frozenset({"WaitingForTurn", "InsufficientSlots"})


def _both_in_line(said: str | None, now: str) -> bool:
    return said in _IN_LINE and now in _IN_LINE and said != now


def _view(n: sched.NodeFacts, ports: frozenset[int]) -> NodeView:
    return NodeView(
        n.name,
        n.ready,
        n.unschedulable,
        n.capacity,
        n.allocated,
        n.labels,
        ports,
        n.cpu,
        n.memory,
        n.cpu_allocated,
        n.memory_allocated,
    )


def _needs(entry: queuing.QueueEntry) -> dict[str, Any]:
    """What a queued job asks of a node, as `place` takes it."""
    return {
        "slots": entry.slots,
        "node_name": entry.node_name,
        "selector": entry.node_selector,
        "cpu": entry.cpu,
        "memory": entry.memory,
    }


def _request(entry: queuing.QueueEntry | None) -> admission.Request | None:
    return None if entry is None else admission.Request(entry.uid, entry.name, entry.slots, entry.bypass_count)
