"""Driving jobs to convergence in this process: a controller runs here while `JobWatch`
follows the named jobs through the change feed until they settle (`up`, `run --wait`), or
until stopped (`controller`). Each look reads only the jobs written since the last one, so
`up` on thousands of jobs stays cheap while the controller does the work."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from .api.quantity import parse_duration
from .api.revisions import stale_completions
from .api.status import JobStatusDict, Outcome, Phase
from .commands import cancel
from .errors import InvalidInput, NotFound
from .selectors import Requirement, matches
from .store import Store, StoredObject
from .store import repository as repo
from .store.feed import ChangeFeed

if TYPE_CHECKING:
    from .controller.leader import Leadership
    from .controller.manager import Controller

LOOK_INTERVAL = 0.05  # how often `up` looks at the change feed when nothing announces a change
# looks woken by announced changes: a few at once (a job's admission, start and end, each seen
# as written), then no more often than the poll, however fast the controller writes (a DAG of
# thousands): each look takes the interpreter's lock and the store from the reconcile loop
LOOK_GAP = LOOK_INTERVAL
LOOK_BURST = 4


@dataclass(frozen=True)
class Watched:
    """What a follower knows of one job."""

    status: JobStatusDict
    service: bool = False
    deleted: bool = False  # deleted while followed

    @property
    def settled(self) -> bool:
        """A run job is settled when Completed; a service once it is Running (it never ends);
        a job deleted meanwhile is settled too."""
        phase = self.status.get("phase")
        return self.deleted or phase == Phase.COMPLETED or (self.service and phase == Phase.RUNNING)

    @property
    def succeeded(self) -> bool:
        if self.service:
            return self.status.get("phase") == Phase.RUNNING
        return self.status.get("outcome") == Outcome.SUCCEEDED


class JobWatch:
    def __init__(self, store: Store, names: list[str]):
        self.store = store
        self.names = set(names)
        self.jobs: dict[str, Watched] = {}
        self._unsettled: set[str] = set()  # kept up to date per change: a look costs the changes, not the jobs
        # name -> (spec text, is a service): a job is written three or four times on its way,
        # its spec seldom; decoding it per write took the interpreter's lock from the loop
        self._types: dict[str, tuple[str, bool]] = {}
        # woken by this process's commits (the controller's) and PostgreSQL's notifications
        self._feed = ChangeFeed(store, listen=True)
        self._load(self.names)

    def _load(self, names: set[str]) -> None:
        with self.store.read() as session:
            found = repo.statuses(session, kind="Job", names=names)
        for name in names:
            o = found.get(name)
            if o is None:
                watched = Watched({}, deleted=True)
            else:
                status = cast(JobStatusDict, o.status)
                watched = Watched(status, service=self._service(name, o.spec_text))
            self.jobs[name] = watched
            if watched.settled:
                self._unsettled.discard(name)
            else:
                self._unsettled.add(name)

    def _service(self, name: str, spec_text: str) -> bool:
        known = self._types.get(name)
        if known is None or known[0] != spec_text:
            known = self._types[name] = (spec_text, json.loads(spec_text).get("type") == "service")
        return known[1]

    def poll(self) -> set[str]:
        """Names of watched jobs written since the last poll (their statuses are refreshed)."""
        changed = {c.name for c in self._feed.poll() if c.kind == "Job" and c.name in self.names}
        if changed:
            self._load(changed)
        return changed

    def wait(self, timeout: float) -> None:
        """Until the store announces a change or `timeout` passes (then `poll`)."""
        self._feed.wait(timeout)

    def all_settled(self) -> bool:
        """Every job settled, and no completion is about an older version of its job (a spec
        change or rerun the controller has not picked up yet)."""
        if self._unsettled:
            return False
        with self.store.read() as session:
            objs = repo.list_objects(session, kind="Job", names=sorted(self.names))
            return not stale_completions(objs, _loader(session, objs))

    def unsettled(self) -> list[str]:
        return sorted(self._unsettled)

    def failures(self) -> list[str]:
        """Followed jobs that ended other than Succeeded at their current version."""
        failed = sorted(n for n, w in self.jobs.items() if did_not_succeed(w))
        if not failed:
            return []
        with self.store.read() as session:
            objs = repo.list_objects(session, kind="Job", names=failed)
            stale = stale_completions(objs, _loader(session, objs))
        return [n for n in failed if n not in stale]


def _loader(session: Any, known: list[StoredObject]) -> Callable[[str], StoredObject | None]:
    """Jobs by name, read once each within one snapshot."""
    cache: dict[str, StoredObject | None] = {o.name: o for o in known}

    def load(name: str) -> StoredObject | None:
        if name not in cache:
            cache[name] = repo.get(session, kind="Job", name=name)
        return cache[name]

    return load


@dataclass
class Converged:
    """How `converge` ended, and what it stopped on its way out."""

    jobs: dict[str, Watched]
    ending: str = "settled"  # settled | timed out | stopped | interrupted | failed fast
    failed: str | None = None  # with fail_fast: the job whose failure ended it
    cancelled: list[str] = field(default_factory=list)  # what it stopped, for `ending`

    @property
    def unsettled(self) -> list[str]:
        return sorted(name for name, w in self.jobs.items() if not w.settled)

    @property
    def all_succeeded(self) -> bool:
        return self.ending == "settled" and all(w.succeeded for w in self.jobs.values())


STOP_MARGIN = 15.0  # beyond the longest stopGracePeriod: the wrapper's record and the writes


class Follower(Protocol):
    """What `follow` reads: the named jobs as last seen (JobWatch follows the store; the remote
    client follows a server's watch stream the same way)."""

    jobs: dict[str, Watched]

    def poll(self) -> set[str]: ...  # names of followed jobs that changed since the last poll
    def wait(self, timeout: float) -> None: ...  # until a change may have arrived, or timeout
    def all_settled(self) -> bool: ...
    def failures(self) -> list[str]: ...  # ended other than Succeeded at their current version


Cancel = Callable[[str, str], object]  # (job, by what) -> cancel its current revision
Grace = Callable[[list[str]], float]  # jobs -> the longest of their stop grace periods, seconds


OnChange = Callable[[dict[str, Watched], set[str]], None]  # all followed jobs, the names that changed


def _quiet(jobs: dict[str, Watched], changed: set[str]) -> None:
    pass


@dataclass(frozen=True)
class Until:
    """How `up` and `run --wait` follow their jobs: for how long, what stops them early, and
    who hears of each change."""

    timeout: float | None
    stop: threading.Event
    on_change: OnChange = _quiet
    fail_fast: bool = False
    interrupt: threading.Event = field(default_factory=threading.Event)  # set with `stop` by a Ctrl-C
    # jobs already running when `up` began, which its apply left as they were: not its to stop
    spare: frozenset[str] = frozenset()


def converge(store: Store, names: list[str], until: Until) -> Converged:
    """Run a controller in this process until every named job is settled (see `follow`). It
    consumes no Source: a queue is for a controller that stays, not one that ends with its jobs."""
    with controller_running(store, sources=False):
        return follow(
            JobWatch(store, names),
            cancel=lambda name, by: cancel(store, name, by=by),
            grace=lambda jobs: _longest_grace(store, jobs),
            until=until,
        )


def follow(watch: Follower, *, cancel: Cancel, grace: Grace, until: Until) -> Converged:
    """Follow the jobs until every one is settled. If it ends any other way (the timeout
    passes, `stop` is set, Ctrl-C, or with `fail_fast` a job fails), it stops what it
    started: every followed job not yet Completed is cancelled, saying by what, and followed
    until it is, so that no process is left behind. Services that settled (Running) keep
    running after a settled end; the next controller adopts them. A second Ctrl-C while
    stopping leaves the rest running (KeyboardInterrupt passes through)."""
    until.on_change(watch.jobs, set(watch.jobs))
    try:
        result = _follow(watch, until)
    except KeyboardInterrupt:
        result = Converged(watch.jobs, "interrupted")
    if result.ending != "settled":
        by = _stopped_by(result, until.timeout)
        result.cancelled = _stop_unsettled(watch, cancel, grace, by, until.on_change, until.spare)
    return result


def _follow(watch: Follower, until: Until) -> Converged:
    # a job may have failed before the first look (through a server, the apply's answer and
    # the first list are apart): --fail-fast acts on it as on one that fails later
    if until.fail_fast and (failed := watch.failures()):
        return Converged(watch.jobs, "failed fast", failed=failed[0])
    deadline = None if until.timeout is None else time.monotonic() + until.timeout
    look = True  # whether to check for convergence: at first and after every change
    paced = time.monotonic()  # looks are paced as if one had been due every LOOK_GAP until here
    while not until.stop.is_set():
        looked_at = time.monotonic()
        paced = max(paced, looked_at) + LOOK_GAP
        if changed := watch.poll():
            until.on_change(watch.jobs, changed)
            look = True
            failed = sorted(n for n in changed if until.fail_fast and did_not_succeed(watch.jobs[n]))
            if failed:
                return Converged(watch.jobs, "failed fast", failed=failed[0])
        if look:
            look = False
            if watch.all_settled():
                return Converged(watch.jobs)
        if deadline is not None and time.monotonic() >= deadline:
            return Converged(watch.jobs, "timed out")
        # the next look: once a change is announced (the job's end is seen as it is written,
        # not up to a poll later), within the pace (LOOK_BURST, LOOK_GAP), and at the latest
        # after LOOK_INTERVAL (the poll, where nothing announces: another process's writes
        # to a SQLite store)
        if until.stop.wait(max(0.0, paced - LOOK_BURST * LOOK_GAP - time.monotonic())):
            break
        watch.wait(max(0.0, looked_at + LOOK_INTERVAL - time.monotonic()))
    return Converged(watch.jobs, "interrupted" if until.interrupt.is_set() else "stopped")


def did_not_succeed(job: Watched) -> bool:
    """Completed other than Succeeded (as last seen)."""
    return job.status.get("phase") == Phase.COMPLETED and job.status.get("outcome") != Outcome.SUCCEEDED


def _stopped_by(result: Converged, timeout: float | None) -> str:
    """What a job cancelled on the way out is told (its message: cancelled by ...)."""
    if result.ending == "failed fast":
        outcome = result.jobs[result.failed or ""].status.get("outcome")
        return f"up --fail-fast: job {result.failed} ended {outcome}"
    if result.ending == "timed out":
        return f"up: timed out after {timeout:g}s"
    return "up: interrupted" if result.ending == "interrupted" else "up: stopped by a signal"


def _stop_unsettled(
    watch: Follower, cancel: Cancel, grace: Grace, by: str, on_change: OnChange, spare: frozenset[str] = frozenset()
) -> list[str]:
    """Cancel the followed jobs that are not Completed (but those in `spare`) and follow them
    until they are (their processes gone), or until the longest of their grace periods has
    passed with a margin."""
    names = sorted(
        n
        for n, w in watch.jobs.items()
        if n not in spare and not w.deleted and w.status.get("phase") != Phase.COMPLETED
    )
    for name in names:
        with suppress(NotFound):  # deleted meanwhile: nothing to stop
            cancel(name, by)
    deadline = time.monotonic() + grace(names) + STOP_MARGIN
    while time.monotonic() < deadline:
        if changed := watch.poll():
            on_change(watch.jobs, changed)
        if all(watch.jobs[n].deleted or watch.jobs[n].status.get("phase") == Phase.COMPLETED for n in names):
            break
        time.sleep(LOOK_INTERVAL)
    return names


def _longest_grace(store: Store, names: list[str]) -> float:
    with store.read() as session:
        return longest_grace([o.spec for o in repo.list_objects(session, kind="Job", names=names)])


def longest_grace(specs: list[dict[str, Any]]) -> float:
    """The longest stopGracePeriod of these job specs, in seconds."""
    return max((parse_duration(s.get("stopGracePeriod", "10s")) for s in specs), default=0.0)


@contextmanager
def controller_running(
    store: Store, *, workers: int = 1, local_node: bool = True, address: str | None = None, sources: bool = True
) -> Iterator[Controller]:
    """A controller (the reconcile loop and, unless `local_node` is False, this machine's
    agent and Node; unless `sources` is False, the Sources' consumers) running in this
    process for the duration of the block."""
    from .controller.manager import Controller  # not for `wait`, which imports this module too

    controller = Controller(store, workers=workers, local_node=local_node, address=address, sources=sources).start()
    try:
        yield controller
    finally:
        controller.stop()


@contextmanager
def controller_elected(
    store: Store,
    *,
    lease: float,
    workers: int = 1,
    local_node: bool = True,
    address: str | None = None,
) -> Iterator[Elected]:
    """`serve`: a controller in this process only while it holds the store's controller
    lease (`lease` seconds), so that of several servers on one store exactly one runs the
    reconcile loop; the others take over when its lease expires."""
    from .controller.leader import Leadership
    from .controller.manager import Controller
    from .controller.nodes import local_node_name, shared_node_refusal

    state = str(store.state_dir.resolve())
    refused = shared_node_refusal(store, local_node_name(), local_node=local_node, state_dir=state, now=time.time())
    if refused is not None:
        raise InvalidInput(refused)

    def lead(term: int) -> Controller:
        return Controller(store, workers=workers, local_node=local_node, address=address, term=term).start()

    leadership = Leadership(store, lead, period=lease).start()
    try:
        yield Elected(local_node_name() if local_node else "", leadership)
    finally:
        leadership.stop()


@dataclass(frozen=True)
class Elected:
    node: str  # this machine's node ("" when it is none), run by whichever controller leads here
    leadership: Leadership


# -- wait -------------------------------------------------------------------------------------

WAITABLE = (Phase.COMPLETED, *Outcome)  # wait --for condition=...: Completed, or an outcome


def _status(job: StoredObject) -> JobStatusDict:
    return cast(JobStatusDict, job.status or {})


def wait_state(status: JobStatusDict, condition: str, *, stale: bool = False) -> str:
    """'met', 'pending' or 'never' for one job and `condition` (Succeeded | Completed | a
    Completed outcome). A `stale` completion (api.revisions.stale_completions) is still pending."""
    if status.get("phase") != Phase.COMPLETED or stale:
        return "pending"
    if condition == Phase.COMPLETED:
        return "met"
    return "met" if status.get("outcome") == condition else "never"


@dataclass
class WaitResult:
    states: dict[str, str]  # name -> met | pending | never

    def names(self, state: str) -> list[str]:
        return [n for n, s in self.states.items() if s == state]


def wait_for(
    store: Store,
    names: list[str],
    condition: str,
    timeout: float,
    selector: list[Requirement] | None = None,
) -> WaitResult:
    """Follow the named jobs (or all, or those matching `selector`) until every one meets
    `condition`, one can never meet it, or `timeout` passes; NotFound for a named job that
    does not exist. A completion that predates a spec change, a rerun or a dependency's new
    revision is not an answer yet: the controller will run the job again."""
    feed = ChangeFeed(store)

    def look() -> WaitResult:
        with store.read() as session:
            objs = repo.list_objects(session, kind="Job", names=names or None)
            return wait_states(objs, _loader(session, objs), names, condition, selector)

    return wait_until(look, lambda: bool(feed.poll()), timeout)


def wait_states(
    objs: list[StoredObject],
    load: Callable[[str], StoredObject | None],
    names: list[str],
    condition: str,
    selector: list[Requirement] | None,
) -> WaitResult:
    """Where each job of `objs` (the named ones, or all) stands against `condition`; `load`
    finds the other jobs a completion's staleness depends on. NotFound for a missing name."""
    if names and (missing := set(names) - {o.name for o in objs}):
        raise NotFound("; ".join(f'jobs "{n}" not found' for n in sorted(missing)))
    if selector:
        objs = [o for o in objs if matches(selector, o.labels)]
    stale = stale_completions(objs, load)
    return WaitResult({o.name: wait_state(_status(o), condition, stale=o.name in stale) for o in objs})


def wait_until(look: Callable[[], WaitResult], changed: Callable[[], bool], timeout: float) -> WaitResult:
    """Look again after each change until every job meets the condition, one never can, or
    `timeout` passes: `wait`, on a store or through a server."""
    deadline = time.monotonic() + timeout
    result = look()
    while not result.names("never") and result.names("pending"):
        if time.monotonic() >= deadline:
            return result
        time.sleep(LOOK_INTERVAL)  # a follower polling the cheap change sequence
        if changed():
            result = look()
    return result
