"""admission.py: FIFO by scope with bounded bypass (API.md section 2, Admission)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.controller.admission import Request, Scope, decide, fits

ME = Request("uid-me", "me", slots=1)
BIG = Request("uid-big", "big", slots=3)
OLD = Request("uid-old", "old", slots=2)


def pool(
    head: Request | None,
    *,
    capacity: int | None = 4,
    used: int = 2,
    max_bypass: int = 3,
    head_fits: bool = False,
    name: str = "analysis",
) -> Scope:
    return Scope(name, capacity, used, max_bypass, head, head_fits)


def glob(head: Request | None, **kw) -> Scope:
    return pool(head, name="global", **kw)


@pytest.mark.parametrize(
    ("request_", "scopes", "admit", "reason", "bypassed"),
    [
        pytest.param(ME, [], True, "SlotsGranted", [], id="no-finite-scope-admits"),
        pytest.param(
            ME,
            [glob(BIG, capacity=None, head_fits=True)],
            True,
            "SlotsGranted",
            [],
            id="unlimited-scope-orders-nobody-even-if-head-fits",
        ),
        pytest.param(
            ME,
            [glob(replace(BIG, bypass_count=9), capacity=None, max_bypass=0)],
            True,
            "SlotsGranted",
            [],
            id="unlimited-scope-ignores-bypass-limit",
        ),
        pytest.param(ME, [pool(None)], True, "SlotsGranted", [], id="empty-queue-and-room"),
        pytest.param(ME, [pool(ME, used=3)], True, "SlotsGranted", [], id="head-itself-fits-exactly"),
        pytest.param(BIG, [pool(BIG, used=2)], False, "InsufficientSlots", [], id="head-itself-does-not-fit"),
        pytest.param(ME, [pool(OLD, head_fits=True)], False, "WaitingForTurn", [], id="head-fits-younger-waits"),
        pytest.param(
            ME,
            [pool(replace(OLD, bypass_count=3), head_fits=True)],
            False,
            "WaitingForTurn",
            [],
            id="head-fits-wins-over-bypass-check",
        ),
        pytest.param(ME, [pool(BIG, used=2)], True, "SlotsGranted", [BIG], id="younger-passes-non-fitting-head"),
        pytest.param(
            ME,
            [pool(replace(BIG, bypass_count=2), max_bypass=3)],
            True,
            "SlotsGranted",
            [replace(BIG, bypass_count=2)],
            id="last-allowed-pass",
        ),
        pytest.param(
            ME, [pool(replace(BIG, bypass_count=3), max_bypass=3)], False, "BypassLimit", [], id="bypass-limit-reached"
        ),
        pytest.param(
            ME,
            [pool(replace(BIG, bypass_count=5), max_bypass=3)],
            False,
            "BypassLimit",
            [],
            id="bypass-count-above-limit",
        ),
        pytest.param(ME, [pool(BIG, max_bypass=0)], False, "BypassLimit", [], id="max-bypass-0-strict-fifo"),
        pytest.param(
            replace(ME, slots=3),
            [pool(BIG, used=2)],
            False,
            "InsufficientSlots",
            [],
            id="younger-passing-but-not-fitting-either",
        ),
        pytest.param(ME, [pool(None, used=4)], False, "InsufficientSlots", [], id="pool-full-no-head"),
    ],
)
def test_decide_single_scope(request_, scopes, admit, reason, bypassed):
    d = decide(request_, scopes)
    assert (d.admit, d.reason) == (admit, reason)
    assert d.bypassed == bypassed


GLOBAL_HEAD = Request("uid-g", "global-head", slots=4)
POOL_HEAD = Request("uid-p", "pool-head", slots=3)


@pytest.mark.parametrize(
    ("scopes", "admit", "reason", "scope_named", "bypassed"),
    [
        pytest.param([glob(None, capacity=10, used=0), pool(None)], True, "SlotsGranted", None, [], id="room-in-both"),
        pytest.param(
            [glob(None, capacity=10, used=0), pool(None, used=4)],
            False,
            "InsufficientSlots",
            "analysis",
            [],
            id="global-room-pool-full",
        ),
        pytest.param(
            [glob(None, capacity=5, used=5), pool(None, used=0)],
            False,
            "InsufficientSlots",
            "global",
            [],
            id="pool-room-global-full",
        ),
        pytest.param(
            [glob(GLOBAL_HEAD, capacity=10, used=8), pool(POOL_HEAD, head_fits=True)],
            False,
            "WaitingForTurn",
            "analysis",
            [],
            id="pool-head-fits",
        ),
        pytest.param(
            [glob(GLOBAL_HEAD, capacity=10, used=0, head_fits=True), pool(None)],
            False,
            "WaitingForTurn",
            "global",
            [],
            id="global-head-fits",
        ),
        pytest.param(
            [glob(replace(GLOBAL_HEAD, bypass_count=3), capacity=10, used=8), pool(POOL_HEAD)],
            False,
            "BypassLimit",
            "global",
            [],
            id="global-head-at-limit",
        ),
        pytest.param(
            [glob(GLOBAL_HEAD, capacity=10, used=8), pool(replace(POOL_HEAD, bypass_count=1), max_bypass=1)],
            False,
            "BypassLimit",
            "analysis",
            [],
            id="pool-head-at-limit",
        ),
        pytest.param(
            [glob(GLOBAL_HEAD, capacity=10, used=8), pool(POOL_HEAD)],
            True,
            "SlotsGranted",
            None,
            [GLOBAL_HEAD, POOL_HEAD],
            id="passes-both-heads",
        ),
        pytest.param(
            [glob(GLOBAL_HEAD, capacity=10, used=8), pool(ME)],
            True,
            "SlotsGranted",
            None,
            [GLOBAL_HEAD],
            id="head-of-pool-passes-global-head",
        ),
        pytest.param(
            [glob(GLOBAL_HEAD, capacity=10, used=8), pool(ME, used=4)],
            False,
            "InsufficientSlots",
            "analysis",
            [],
            id="passes-global-head-but-pool-full",
        ),
    ],
)
def test_decide_checks_global_and_pool(scopes, admit, reason, scope_named, bypassed):
    d = decide(ME, scopes)
    assert (d.admit, d.reason) == (admit, reason)
    assert d.bypassed == bypassed
    if scope_named:
        assert d.message.startswith(f"{scope_named}:") or f" in {scope_named} " in d.message


def test_head_shared_by_global_and_pool_is_counted_once_per_pass():
    """The same head waiting first in the global scope and in its pool is passed once, so it
    appears once in `bypassed` (job.py calls count_bypass per entry; a duplicate would cost it
    two passes and let its counter overshoot maxBypass, 2 -> 4 with maxBypass 3)."""
    head = replace(BIG, bypass_count=2)
    d = decide(ME, [glob(head, capacity=10, used=8), pool(head, used=2)])
    assert d.admit
    assert d.bypassed == [head]


@pytest.mark.parametrize(
    ("request_", "scopes", "reason", "text"),
    [
        pytest.param(
            ME,
            [pool(OLD, head_fits=True)],
            "WaitingForTurn",
            "an older job in analysis fits first",
            id="waiting-for-turn",
        ),
        pytest.param(
            ME,
            [pool(replace(BIG, bypass_count=3))],
            "BypassLimit",
            "the oldest job in analysis was passed 3 times and goes first",
            id="bypass-limit",
        ),
        pytest.param(
            BIG,
            [pool(None, used=2)],
            "InsufficientSlots",
            "analysis: 2/4 slots in use, 3 needed",
            id="insufficient-slots",
        ),
        pytest.param(ME, [pool(None)], "SlotsGranted", "slots granted", id="granted"),
    ],
)
def test_decision_messages(request_, scopes, reason, text):
    d = decide(request_, scopes)
    assert (d.reason, d.message) == (reason, text)


@pytest.mark.parametrize(
    ("slots", "scopes", "expected"),
    [
        pytest.param(2, [], True, id="no-scopes"),
        pytest.param(2, [pool(None, capacity=None, used=99)], True, id="unlimited"),
        pytest.param(2, [pool(None, capacity=4, used=2)], True, id="exact-fit"),
        pytest.param(3, [pool(None, capacity=4, used=2)], False, id="one-short"),
        pytest.param(2, [glob(None, capacity=10, used=0), pool(None, capacity=4, used=3)], False, id="any-scope-short"),
    ],
)
def test_fits(slots, scopes, expected):
    assert fits(replace(ME, slots=slots), scopes) is expected


# --- property: a simulated pool never exceeds capacity, and starvation is bounded -----------


@dataclass
class Job:
    uid: str
    seq: int
    slots: int
    priority: int
    pool: str
    bypass_count: int = 0  # the store's durable counter: +1 per entry of Decision.bypassed

    def request(self) -> Request:
        return Request(self.uid, self.uid, self.slots, self.bypass_count)


@dataclass
class Sim:
    """The store's side of admission: capacities, queue order, usage; decide() is the policy."""

    capacity: dict[str, int | None]  # "global" and each pool
    max_bypass: dict[str, int]
    queue: list[Job] = field(default_factory=list)
    running: dict[str, Job] = field(default_factory=dict)
    admitted_order: list[str] = field(default_factory=list)
    passes: dict[tuple[str, str], int] = field(default_factory=dict)  # (scope, head uid) -> real passes
    total_passes: dict[str, int] = field(default_factory=dict)  # uid -> admissions that passed it

    def used(self, scope: str) -> int:
        return sum(j.slots for j in self.running.values() if scope == "global" or j.pool == scope)

    def ordered(self, scope: str) -> list[Job]:
        members = [j for j in self.queue if scope == "global" or j.pool == scope]
        return sorted(members, key=lambda j: (-j.priority, j.seq, j.uid))

    def room(self, job: Job) -> bool:
        return all(
            self.capacity[s] is None or job.slots <= self.capacity[s] - self.used(s) for s in ("global", job.pool)
        )

    def scopes_for(self, job: Job) -> list[Scope]:
        scopes = []
        for name in ("global", job.pool):
            order = self.ordered(name)
            head = order[0] if order else None
            scopes.append(
                Scope(
                    name,
                    self.capacity[name],
                    self.used(name),
                    self.max_bypass[name],
                    None if head is None else head.request(),
                    head is not None and head.uid != job.uid and self.room(head),
                )
            )
        return scopes

    def round(self) -> None:
        """Try every queued job once, in global queue order."""
        for job in self.ordered("global"):
            self.reconcile(job)

    def reconcile(self, job: Job) -> None:
        """One reconcile of one queued job: the store gathers the facts, decide() decides."""
        scopes = self.scopes_for(job)
        decision = decide(job.request(), scopes)
        if not decision.admit:
            return
        assert self.room(job), f"admitted {job.uid} without room"
        for scope in scopes:  # oracle: which heads did this admission really pass?
            head = scope.head
            if scope.capacity is None or head is None or head.uid == job.uid:
                continue
            assert head in decision.bypassed, f"{job.uid} passed {head.uid} in {scope.name} uncounted"
            assert not self.room(self._job(head.uid)), f"{job.uid} passed {head.uid}, which fits"
            key = (scope.name, head.uid)
            self.passes[key] = self.passes.get(key, 0) + 1
            assert self.passes[key] <= self.max_bypass[scope.name], (
                f"{head.uid} passed {self.passes[key]} times in {scope.name} (maxBypass {self.max_bypass[scope.name]})"
            )
        assert len({b.uid for b in decision.bypassed}) == len(decision.bypassed), "a head counted twice"
        for passed in decision.bypassed:  # as job.py does: count_bypass per entry
            self._job(passed.uid).bypass_count += 1
            self.total_passes[passed.uid] = self.total_passes.get(passed.uid, 0) + 1
        self.queue.remove(job)
        self.running[job.uid] = job
        self.admitted_order.append(job.uid)
        self.check_capacity()
        for waiting in self.queue:  # the durable counter is exactly the passes it suffered
            assert waiting.bypass_count == self.total_passes.get(waiting.uid, 0)

    def _job(self, uid: str) -> Job:
        return next(j for j in self.queue if j.uid == uid)

    def check_capacity(self) -> None:
        for name, cap in self.capacity.items():
            if cap is not None:
                assert self.used(name) <= cap, f"{name} over capacity: {self.used(name)}/{cap}"


KINDS = ("arrive",) * 4 + ("finish",) * 2 + ("reconcile",) * 2 + ("round",)  # contended on purpose


def _steps(max_slots: int, pools: list[str]):
    """Arrivals, finishes, and reconciles: the work queue hands out keys in any order, so after
    slots are released any queued job (not necessarily the head) may be reconciled first."""
    step = st.tuples(
        st.sampled_from(KINDS),
        st.integers(1, max_slots),
        st.integers(0, 1),
        st.sampled_from(pools),
        st.integers(0, 1_000),
    )
    return st.lists(step, min_size=10, max_size=80)


def _run(sim: Sim, steps) -> None:
    seq = 0
    for kind, slots, priority, pool_name, pick in steps:
        if kind == "arrive":  # a newly eligible job tries admission at once
            job = Job(f"j{seq:03d}", seq, slots, priority, pool_name)
            sim.queue.append(job)
            sim.reconcile(job)
            seq += 1
        elif kind == "finish" and sim.running:  # wake-ups race with other keys: no round here
            del sim.running[sorted(sim.running)[pick % len(sim.running)]]
        elif kind == "reconcile" and sim.queue:
            sim.reconcile(sim.queue[pick % len(sim.queue)])
        elif kind == "round":
            sim.round()
    # drain: bounded starvation means everyone eventually gets in once running jobs finish
    for _ in range(len(sim.queue) + 1):
        if not sim.queue:
            break
        sim.running.clear()
        sim.round()
    assert not sim.queue, f"jobs never admitted: {[j.uid for j in sim.queue]}"
    assert len(sim.admitted_order) == len(set(sim.admitted_order)) == seq


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), capacity=st.integers(2, 6), max_bypass=st.integers(0, 3))
def test_property_pool_capacity_and_bounded_bypass(data, capacity, max_bypass):
    """One finite pool under an unlimited global limit."""
    steps = data.draw(_steps(capacity, ["p"]))
    sim = Sim(capacity={"global": None, "p": capacity}, max_bypass={"global": 3, "p": max_bypass})
    _run(sim, steps)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    g=st.integers(1, 6),
    a=st.integers(1, 4),
    b=st.integers(1, 4),
    mb=st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
)
def test_property_global_and_two_pools_capacity_and_bounded_bypass(data, g, a, b, mb):
    """A finite global limit and two finite pools: every scope stays within capacity and no
    head is really passed more than its scope's maxBypass times."""
    max_slots = min(g, a, b)
    steps = data.draw(_steps(max_slots, ["a", "b"]))
    sim = Sim(capacity={"global": g, "a": a, "b": b}, max_bypass={"global": mb[0], "a": mb[1], "b": mb[2]})
    _run(sim, steps)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=25),
    capacity=st.integers(4, 6),
    finish_every=st.integers(1, 3),
    picks=st.lists(st.integers(0, 1_000), min_size=25, max_size=25),
)
def test_property_max_bypass_zero_is_strict_fifo(sizes, capacity, finish_every, picks):
    """With maxBypass 0 nobody is ever passed: admission order is arrival order, whichever
    queued job happens to be reconciled first."""
    sim = Sim(capacity={"global": None, "p": capacity}, max_bypass={"global": 0, "p": 0})
    for i, slots in enumerate(sizes):
        sim.queue.append(Job(f"j{i:03d}", i, slots, 0, "p"))
        if i % finish_every == 0 and sim.running:
            del sim.running[sorted(sim.running)[0]]
        sim.reconcile(sim.queue[picks[i] % len(sim.queue)])
        sim.round()
    for _ in range(len(sizes) + 1):
        if not sim.queue:
            break
        sim.running.clear()
        sim.round()
    assert sim.admitted_order == [f"j{i:03d}" for i in range(len(sizes))]
