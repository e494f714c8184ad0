"""The routes node agents use (`reconciler agent`): heartbeat, the runs placed on a node (a
long poll answered as soon as they differ from what the agent has, save for runs leaving
whose end it reported), and reports of a run's start and end; and the log of a remote run,
fetched from its node's agent."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import httpx
from fastapi import FastAPI, Header, Query

from .. import noderuns, reads, runlogs
from ..agentwire import AGENT_HEADER, QUIET_ENDS_HEADER, HeartbeatRequest, HeldRuns, RunReport, RunReports
from ..api import node as node_api
from ..errors import NotFound, ReconcilerError
from ..store import Store
from ..wire import PREFIX, status
from .auth import Tokens

LONG_POLL = 30.0  # the longest a runs request waits for a change (the agent asks again)
OTHER_WRITERS_POLL = 0.05  # writes of other processes (another server) are looked for this often
COALESCE = 0.005  # the shared look is taken at most this often: a burst of commits costs one
POLLS = anyio.CapacityLimiter(1024)  # waiting agents hold a thread each, apart from the routes' pool
LOG_CONNECT = 5.0  # seconds to reach a node's log port

Wake = Callable[[str], None]
# the agent process asking (runs, reports): one that does not serve the node is refused (409)
AGENT = Header(None, alias=AGENT_HEADER, description="The agent process (host:pid:start) its heartbeat names.")
QUIET_ENDS = Header(
    False,
    alias=QUIET_ENDS_HEADER,
    description="The agent needs no answer when a run whose end it reported leaves the node (1: not answered).",
)
Keys = dict[str, list[tuple[Any, ...]]]
RunId = tuple[str, int, int]  # (job uid, run number, epoch): one admission's run


class _Answered:
    """The answer this process last gave a node's agent (one agent a node): its digest, each
    run's text and the node's key it was read at; and the runs of it that agent reported
    ended since."""

    __slots__ = ("agent", "digest", "ended", "key", "texts")

    def __init__(self, agent: str, digest: str, texts: dict[RunId, str], key: list[tuple[Any, ...]]):
        self.agent, self.digest, self.texts, self.key = agent, digest, texts, key
        self.ended: set[RunId] = set()


class Placements:
    """Answers each agent's long poll as soon as its node's admissions differ from the digest
    it holds: woken at once by this process's writes (`Store.committed`), on PostgreSQL by
    every server's (NOTIFY), and every 50 ms by a small look for the rest. The look
    (`noderuns.placement_keys`: every node's admissions, epochs and stops, one query) is
    shared by every waiting agent: taken once per wake-up (at most every 5 ms), not once per
    agent, and a node's runs with their specs are read only when its key moved (an agent
    asking again with the digest it was just answered waits without reading them).

    For an agent that asks for it (`QUIET_ENDS_HEADER`), a run gone from the node whose end
    that agent process itself reported to this server process is not answered, and when the
    node's key shows no more than that, its runs are not read: the agent holds the run ended
    and needs no word (over busy agents, two answers in five: counted over `bench/burndown.py`).
    Every other change is answered, such as a run gone that the agent holds alive: it must
    hear of it, to report it and be told to stop it. The next answer shows the run gone, and
    the poll's timeout answers with the runs as they are."""

    def __init__(self, store: Store):
        self.store = store
        self._cond = threading.Condition()
        self._generation = 0
        self._look_lock = threading.Lock()
        self._keys: Keys = {}
        self._looked_generation = -1  # the generation the shared look was taken at (or after)
        self._looked_at = 0.0  # time.monotonic() of that look
        # node -> (its key, the digest of its runs read at or after it): a request whose digest
        # is that one, while the key holds, waits without reading the runs again
        self._last: dict[str, tuple[list[tuple[Any, ...]], str]] = {}
        self._stopping = False  # the server stops: every waiting poll is answered now
        self._serving: dict[str, str] = {}  # node -> the agent last found serving it
        self._ended_lock = threading.Lock()
        self._answered: dict[str, _Answered] = {}  # node -> its quiet agent's last answer here
        store.committed.append(self._committed)
        if not store.is_sqlite:  # another server's writes (the leader's admissions), announced by NOTIFY
            threading.Thread(target=self._announced, name="placements-listen", daemon=True).start()

    def _announced(self) -> None:
        # other processes' writes (this process's own call `_committed` after their commit)
        wakeups = self.store.wakeups()
        seen = wakeups.seen(foreign=True)
        while True:
            now = wakeups.wait(seen, 1.0, foreign=True)
            if now != seen:
                seen = now
                self._committed()

    def _committed(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def stop(self) -> None:
        """Answer every waiting agent now (it asks again, of whichever server answers): a
        stopping server does not hold its polls until its graceful shutdown gives up."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def _look(self, generation: int) -> Keys:
        """Every node's key as of `generation` or later: one query for all the waiting agents
        (whoever comes first takes it; the others use it)."""
        with self._look_lock:
            fresh = time.monotonic() - self._looked_at < OTHER_WRITERS_POLL
            if self._looked_generation >= generation and fresh:
                return self._keys
            wait = self._looked_at + COALESCE - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            with self._cond:
                taken = self._generation  # commits after this one are seen by the next look
            self._keys = noderuns.placement_keys(self.store)
            self._looked_generation, self._looked_at = taken, time.monotonic()
            return self._keys

    def ended(self, node: str, agent: str | None, runs: list[RunId]) -> None:
        """The agent process `agent` reports these runs of the node ended: noted before the
        report is written (the polls wake after its commit), since whatever the report's
        fate, that agent holds them ended. Only runs in the answer this process last gave
        that agent are noted: no other can leave it unanswered."""
        if not runs or not agent:
            return
        with self._ended_lock:
            if (last := self._answered.get(node)) is not None and last.agent == agent:
                last.ended.update(run for run in runs if run in last.texts)

    def _fetch(
        self, node: str, key: list[tuple[Any, ...]], agent: str | None
    ) -> tuple[dict[str, Any], dict[RunId, str]]:
        """The node's runs with their specs, read now (Conflict when `agent` does not serve
        the node, judged in the same read), and each run's text; remembered as what `key`
        answers."""
        items = noderuns.placed(self.store, node, agent)
        texts = [_text(item) for item in items]
        digest = hashlib.sha256(("[" + ",".join(texts) + "]").encode()).hexdigest()[:32]  # the items' JSON array
        self._last[node] = (key, digest)
        return {"digest": digest, "items": items}, {_run_id(i): t for i, t in zip(items, texts, strict=True)}

    def _news(self, node: str, agent: str | None, known: str, answer: dict[str, Any], texts: dict[RunId, str]) -> bool:
        """Whether `answer` tells `agent`, which holds `known`, anything: it differs from it
        other than by runs gone whose end that agent reported."""
        if answer["digest"] == known:
            return False
        with self._ended_lock:
            if (last := self._held(node, agent, known)) is None:
                return True  # not the answer this process gave that agent last: said as it is
            gone = last.texts.keys() - texts.keys()
            return not gone <= last.ended or any(last.texts.get(run) != text for run, text in texts.items())

    def _ended_only(self, node: str, agent: str | None, known: str, key: list[tuple[Any, ...]]) -> bool:
        """Whether the node's key holds, since the answer `agent` holds (`known`), nothing new
        and lacks only runs of that answer whose end that agent reported: then its runs need
        not be read (`_news` would find nothing to tell). A key's entries name each run (uid,
        number, epoch, stop). The runs are the answer's own, not its key's: that key was
        looked at before they were read, and a run placed in between is in the answer only."""
        with self._ended_lock:
            if (last := self._held(node, agent, known)) is None:
                return False
            return set(key) <= set(last.key) and last.texts.keys() - {entry[:3] for entry in key} <= last.ended

    def _held(self, node: str, agent: str | None, known: str) -> _Answered | None:
        """The answer this process last gave `agent`, when it is `known` (under `_ended_lock`)."""
        last = self._answered.get(node)
        return last if last is not None and agent and (last.agent, last.digest) == (agent, known) else None

    def _answer(
        self,
        node: str,
        agent: str | None,
        key: list[tuple[Any, ...]],
        answer: dict[str, Any],
        texts: dict[RunId, str],
    ) -> dict[str, Any]:
        if agent:
            with self._ended_lock:
                last = self._answered.get(node)
                self._answered[node] = now = _Answered(agent, answer["digest"], texts, key)
                if last is not None and last.agent == agent:
                    now.ended = last.ended & texts.keys()  # the others are gone from what the agent holds now
        return answer

    def wait(
        self, node: str, known: str, timeout: float, agent: str | None = None, quiet_ends: bool = False
    ) -> dict[str, Any]:
        """The node's runs once they differ from `known` (with `quiet_ends`, other than by runs
        gone whose end `agent` reported), or after `timeout`. Every answer is read with the
        check that `agent` serves the node (`noderuns.serving`); an agent other than the one
        last found serving it is checked before it waits too, so that a duplicate is refused
        at once, while the serving agent's polls cost no read of their own."""
        quiet = agent if quiet_ends else None  # whose reported ends go unanswered
        if not agent or self._serving.get(node) != agent:  # one naming none is checked each time
            noderuns.serving(self.store, node, agent)
            if agent:
                self._serving[node] = agent
        deadline = time.monotonic() + timeout
        with self._cond:
            generation = self._generation
        seen = self._look(generation).get(node, [])
        # else nothing moved since the answer the agent holds, or only runs it reported ended left
        if self._last.get(node) != (seen, known) and not self._ended_only(node, quiet, known, seen):
            answer, texts = self._fetch(node, seen, agent)
            if self._news(node, quiet, known, answer, texts):
                return self._answer(node, quiet, seen, answer, texts)
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or self._stopping:
                return self._answer(node, quiet, seen, *self._fetch(node, seen, agent))  # reports may have moved
            with self._cond:
                if self._generation == generation and not self._stopping:
                    self._cond.wait(min(left, OTHER_WRITERS_POLL))
                generation = self._generation
            key = self._look(generation).get(node, [])
            if key != seen:
                seen = key
                if self._ended_only(node, quiet, known, key):
                    continue
                answer, texts = self._fetch(node, key, agent)  # the specs only when the key moved
                if self._news(node, quiet, known, answer, texts):
                    return self._answer(node, quiet, key, answer, texts)


def _text(item: dict[str, Any]) -> str:
    """What the agent holds of one of its node's runs (the answer's digest is of these).
    Whether the server holds the run's start or end is left out: the agent reported it
    itself (it needs those only on its first look after a start, to tell a run it lost from
    one to start), so a report does not send every agent of the node a new answer."""
    kept = {k: v for k, v in item.items() if k not in ("started", "finished")}
    return json.dumps(kept, sort_keys=True, separators=(",", ":"))


def _run_id(item: dict[str, Any]) -> RunId:
    return (item["uid"], item["run"], item["epoch"])


def routes(app: FastAPI, store: Store, wake: Wake | None, hand: noderuns.Hand | None = None) -> None:
    placements = Placements(store)
    app.state.on_exit.append(placements.stop)
    # when this server began taking heartbeats: a node silent only since then keeps its agent
    # (no other host takes it over) until the Ready window has passed
    up_since = time.time()

    @app.post(PREFIX + "/nodes/{name}/heartbeat", tags=["agents"])
    def heartbeat(name: str, request: HeartbeatRequest) -> dict[str, Any]:
        """A node agent's heartbeat: registers the Node on the first, keeps it Ready."""
        beat = noderuns.Beat(
            agent=request.agent,
            address=request.address,
            labels=request.labels,
            capacity=request.capacity.model_dump(exclude_none=True),
            cpu_count=request.cpu_count,
            log_port=request.log_port,
            withdraws=request.withdraws,
        )
        became_ready, node_uid = noderuns.heartbeat(store, name, beat, time.time(), up_since)
        # readyWindowSeconds: the agent starts runs only while this heartbeat is younger (its lease)
        window = node_api.READY_WINDOW  # read now: serve --node-lost-after sets it
        # nodeUid: the node's registration in this store, which the agent records with each run
        answer = {"becameReady": became_ready, "readyWindowSeconds": window, "nodeUid": node_uid}
        return {**status(200, f"node {name} is Ready"), **answer}

    @app.get(PREFIX + "/nodes/{name}/runs", tags=["agents"])
    async def placed(
        name: str,
        known: str = Query("", description="The digest of the last answer: wait until the runs differ from it."),
        timeout_seconds: float = Query(LONG_POLL, alias="timeoutSeconds", ge=0, le=300),
        agent: str | None = AGENT,
        quiet_ends: bool = QUIET_ENDS,
    ) -> dict[str, Any]:
        """The runs placed on the node (each with its epoch, job spec, and a stop when the job
        is stopping it), answered when they differ from `known` (for an agent sending
        X-Reconciler-Quiet-Ends, other than by runs gone whose end it reported) or after
        timeoutSeconds."""
        return await anyio.to_thread.run_sync(
            placements.wait, name, known, timeout_seconds, agent, quiet_ends, limiter=POLLS
        )

    @app.post(PREFIX + "/nodes/{name}/runs/reports", tags=["agents"])
    def reports(name: str, request: RunReports, agent: str | None = AGENT) -> dict[str, Any]:
        """Several runs' reports, kept in one transaction (the controller's batch, when it
        runs in this process); each is judged alone: `items` says, in order, 200 (kept) or
        409 (its admission is no longer current: stop the process)."""
        reports = [noderuns.Report(r.uid, r.run, r.epoch, r.facts(), r.job) for r in request.items]
        placements.ended(name, agent, [(r.uid, r.run, r.epoch) for r in request.items if r.finished_at is not None])
        kept, handed = noderuns.report_many(store, name, reports, agent, hand=hand)
        items = []
        for r, ok in zip(request.items, kept, strict=True):
            if ok and wake is not None and not handed:
                wake(r.job)  # the controller in this process looks at once, not at its next feed poll
            message = "report kept" if ok else noderuns.stale_message(r.job, name, r.run, r.epoch)
            items.append({"job": r.job, "run": r.run, "code": 200 if ok else 409, "message": message})
        return {**status(200, f"{sum(kept)} of {len(kept)} reports kept"), "items": items}

    @app.post(PREFIX + "/nodes/{name}/runs/kept", tags=["agents"])
    def kept(name: str, request: HeldRuns) -> dict[str, Any]:
        """Which of the ended runs whose folders the node's agent holds the store still keeps:
        the agent removes the others' folders, as the controller's own agent does when a job
        is deleted or a service's status drops its oldest runs."""
        found = noderuns.kept_runs(store, name, [(r.uid, r.run, r.node_uid) for r in request.items])
        items = [{"uid": r.uid, "run": r.run, "kept": k} for r, k in zip(request.items, found, strict=True)]
        return {**status(200, f"{sum(found)} of {len(found)} runs of node {name} kept"), "items": items}

    @app.post(PREFIX + "/nodes/{name}/runs/{job}/report", tags=["agents"])
    def report(name: str, job: str, request: RunReport, agent: str | None = AGENT) -> dict[str, Any]:
        """A run's start (pid, process start time) or end (exit code, times; or gone without
        a record). 409 when the admission it names is no longer current: stop the process."""
        facts = request.facts()
        if request.finished_at is not None:
            placements.ended(name, agent, [(request.uid, request.run, request.epoch)])
        noderuns.report(
            store, name, job, uid=request.uid, run=request.run, epoch=request.epoch, facts=facts, agent=agent
        )
        if wake is not None:
            wake(job)  # the controller in this process looks at once, not at its next feed poll
        return status(200, f"run {request.run} of job {job}: report kept")


def remote_log(
    store: Store,
    tokens: Tokens | None,
    found: runlogs.RunLogs,
    *,
    stream: str | None,
    tail: int | None,
    follow: bool,
    stop: threading.Event,
) -> Iterator[str] | None:
    """The run's log as its node's agent serves it (None: the run is this machine's). The
    agent is reached before this returns, so a refusal is this request's error."""
    node = found.run.get("node")
    if not node:
        return None
    try:
        obj = reads.objects(store, "nodes", [node], None).objects[0]
    except NotFound:
        return None
    node_status = obj.status or {}
    if not node_status.get("remote"):
        return None
    port, address = node_status.get("logPort"), node_status.get("address")
    if not port or not address:
        raise ReconcilerError(f"node {node} serves no logs (its agent runs without --log-port)")
    token = tokens.agent_token(node) if tokens is not None else None
    params: dict[str, str] = {"follow": "true" if follow else "false"}
    if stream:
        params["stream"] = stream
    if tail is not None:
        params["tailLines"] = str(tail)
    host = f"[{address}]" if ":" in address else address
    url = f"http://{host}:{port}/logs/{found.dir.name}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    client = httpx.Client(timeout=httpx.Timeout(LOG_CONNECT, read=None))
    try:
        answer = client.send(client.build_request("GET", url, params=params, headers=headers), stream=True)
    except httpx.HTTPError as exc:
        client.close()
        raise ReconcilerError(f"the agent of node {node} cannot be reached for this log ({url}): {exc}") from None
    if answer.status_code != 200:
        answer.read()
        client.close()
        if answer.status_code == 404:
            raise NotFound(answer.text.strip() or f"node {node} has no logs of this run")
        raise ReconcilerError(f"the agent of node {node} answered {answer.status_code}: {answer.text.strip()}")
    return _pieces(client, answer, stop)


def _pieces(client: httpx.Client, answer: httpx.Response, stop: threading.Event) -> Iterator[str]:
    try:
        for piece in answer.iter_text():
            if stop.is_set():
                return
            yield piece
    except httpx.HTTPError:
        return  # the agent went away mid-log: what came is what there is
    finally:
        answer.close()
        client.close()
