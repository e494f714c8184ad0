"""SQLModel tables. JSON documents are TEXT so SQLite and PostgreSQL share one schema."""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Float, Index, Text, text
from sqlmodel import Field, SQLModel


class ObjectRow(SQLModel, table=True):
    """Desired spec and observed status of every resource, one row per (kind, name)."""

    __tablename__ = "objects"
    # what the metrics count at scrape time (jobs by phase and outcome, pending by pool and
    # reason): one index-only scan instead of decoding every status
    __table_args__ = (Index("ix_objects_state", "kind", "phase", "outcome", "pool", "reason"),)
    kind: str = Field(primary_key=True)
    name: str = Field(primary_key=True)
    uid: str = Field(unique=True)
    generation: int
    resource_version: int = Field(index=True)
    labels: str = Field(sa_column=Column(Text, nullable=False))
    annotations: str = Field(sa_column=Column(Text, nullable=False))
    spec: str = Field(sa_column=Column(Text, nullable=False))
    status: str | None = Field(default=None, sa_column=Column(Text))
    phase: str | None = None  # copied from status, found by SQL through ix_objects_state (every query names the kind)
    observed_generation: int | None = None  # copied from status: completed jobs with a newer spec are found by SQL
    outcome: str | None = None  # copied from status
    reason: str | None = None  # copied from status
    pool: str | None = None  # copied from a job's spec
    created_at: float
    deleted_at: float | None = None
    # the resourceVersion that created it (etcd's create_revision): a watch tells a change of
    # an object that existed at its resourceVersion (MODIFIED) from a creation after it
    # (ADDED) however coarsely it looked; NULL for objects made before schema 9 (as 0)
    created_rv: int | None = None


class EventRow(SQLModel, table=True):
    """Append-only: written in the same transaction as the change it records."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_object", "kind", "name"),)
    id: int | None = Field(default=None, primary_key=True)
    resource_version: int = Field(index=True)
    time: float
    kind: str
    name: str
    uid: str
    type: str  # Normal | Warning
    reason: str
    message: str = Field(sa_column=Column(Text, nullable=False))


class MetaRow(SQLModel, table=True):
    """Store-wide counters: schema version and the change sequence (resourceVersion source)."""

    __tablename__ = "meta"
    key: str = Field(primary_key=True)
    value: int


class AdmissionRow(SQLModel, table=True):
    """Slots held by an admitted job, against the global limit, its pool and its node.
    Present from admission until the run's processes are proven gone."""

    __tablename__ = "admissions"
    # one service per port and node, even with two controllers: the store refuses the second
    __table_args__ = (
        Index(
            "ix_admissions_node_port",
            "node",
            "port",
            unique=True,
            sqlite_where=text("port IS NOT NULL"),
            postgresql_where=text("port IS NOT NULL"),
        ),
    )
    job_uid: str = Field(primary_key=True)
    job_name: str
    pool: str | None = Field(default=None, index=True)
    slots: int
    node: str | None = Field(default=None, index=True)
    run_number: int
    admitted_at: float
    owner: str | None = None  # the agent that claimed the spawn (host:pid:start), so no run starts twice
    port: int | None = None  # a service's port, held on its node while admitted
    # spec.resources, held on the node while admitted: counted where the node declares cpu or
    # memory capacity (schema 6; NULL in admissions made before, counted as nothing)
    cpu: float | None = Field(default=None, sa_column=Column(Float))
    memory: int | None = Field(default=None, sa_column=Column(BigInteger))
    # schema 7: the admission's epoch (the resourceVersion that admitted it, or restarted its
    # service's run): a remote agent's report names it, and one for an epoch no longer
    # current is refused; the agent's last report of the run (JSON), and the change
    # sequence number of its write, which the controller's change feed follows
    epoch: int | None = None
    report: str | None = Field(default=None, sa_column=Column(Text))
    reported_rv: int | None = None


class QueueRow(SQLModel, table=True):
    """Eligible jobs waiting for admission, ordered by (rank = -priority, eligible_at, uid)."""

    __tablename__ = "queue"
    __table_args__ = (
        Index("ix_queue_global", "rank", "eligible_at", "job_uid"),
        Index("ix_queue_pool", "pool", "rank", "eligible_at", "job_uid"),
    )
    job_uid: str = Field(primary_key=True)
    job_name: str
    pool: str | None = None
    slots: int
    rank: int
    eligible_at: float
    bypass_count: int = 0
    node_name: str | None = None  # placement constraints, so a head's fit can be judged from here
    node_selector: str = "{}"
    cpu: float | None = Field(default=None, sa_column=Column(Float))  # what a head needs of a node (schema 6)
    memory: int | None = Field(default=None, sa_column=Column(BigInteger))


class OutboxRow(SQLModel, table=True):
    """A job event a notifier has yet to receive: written in the same transaction as the
    job status it reports, deleted once delivered or given up (schema 2)."""

    __tablename__ = "outbox"
    __table_args__ = (Index("ix_outbox_due", "notifier", "next_attempt_at", "id"),)
    id: int | None = Field(default=None, primary_key=True)
    notifier: str
    event_id: str
    body: str = Field(sa_column=Column(Text, nullable=False))  # the exact JSON sent (and signed) every time
    created_at: float  # the event's time: delivery is given up 24h after it
    next_attempt_at: float
    attempts: int = 0
    last_error: str | None = Field(default=None, sa_column=Column(Text))


class DeliveryRow(SQLModel, table=True):
    """Per notifier: what its deliveries came to, and the process delivering them now (a
    lease, so two controllers on one store do not both deliver every event) (schema 2)."""

    __tablename__ = "deliveries"
    notifier: str = Field(primary_key=True)
    delivered: int = 0
    failed: int = 0
    last_error: str | None = Field(default=None, sa_column=Column(Text))
    last_error_at: float | None = None
    last_delivery_at: float | None = None
    owner: str | None = None  # host:pid:start of the delivering process
    lease_until: float | None = None


class IngestedRow(SQLModel, table=True):
    """A queue message a Source turned into a job, written in the job's transaction: a
    redelivery of the message finds it and creates nothing new (schema 4)."""

    __tablename__ = "ingested"
    __table_args__ = (Index("ix_ingested_age", "source", "created_at"),)  # forgetting the old ones
    source: str = Field(primary_key=True)
    message_id: str = Field(primary_key=True)
    job: str
    created_at: float


class LeaseRow(SQLModel, table=True):
    """Who leads: one row per lease (today only `controller`, held by the `serve` process
    that runs the reconcile loop). `term` only grows: it is bumped each time the lease
    changes hands, and the leader's writes check it, so a former leader cannot write
    (schema 5). Times are the database's clock, so servers' clocks need not agree."""

    __tablename__ = "leases"
    name: str = Field(primary_key=True)
    holder: str | None = None  # host:pid:start of the leading process; None once released
    term: int
    expires_at: float  # the database's epoch seconds: another may take the lease after it
    renewed_at: float
    acquired_at: float  # when this term began
