"""The tables: SQLAlchemy Core definitions, and a mapped class per table for code that names
columns through it (`ObjectRow.kind`, `update(QueueRow)`) or wants rows as objects (the crash
tests' harness). JSON documents are TEXT so SQLite and PostgreSQL share one schema.

They were SQLModel classes; building those (a pydantic model and a mapping each) cost every
CLI call ~20 ms of start-up, and nothing used them as models. The schema is the same to the
letter (VARCHAR, INTEGER, FLOAT and TEXT columns, nullability, keys, index names, insert
defaults), so stored databases keep working."""

from __future__ import annotations

from sqlalchemy import Column, Float, Index, Integer, MetaData, String, Table, Text
from sqlalchemy.orm import DeclarativeBase

metadata = MetaData()

OBJECTS = Table(
    "objects", metadata,  # desired spec and observed status of every resource, one row per (kind, name)
    Column("kind", String, primary_key=True),
    Column("name", String, primary_key=True),
    Column("uid", String, nullable=False, unique=True),
    Column("generation", Integer, nullable=False),
    Column("resource_version", Integer, nullable=False, index=True),
    Column("labels", Text, nullable=False),
    Column("annotations", Text, nullable=False),
    Column("spec", Text, nullable=False),
    Column("status", Text),
    Column("phase", String, index=True),  # copied from status so the controller finds open jobs fast
    Column("observed_generation", Integer),  # copied from status: completed jobs with a newer spec are found by SQL
    Column("created_at", Float, nullable=False),
    Column("deleted_at", Float),
)

EVENTS = Table(
    "events", metadata,  # append-only: written in the same transaction as the change it records
    Column("id", Integer, primary_key=True),
    Column("resource_version", Integer, nullable=False, index=True),
    Column("time", Float, nullable=False),
    Column("kind", String, nullable=False),
    Column("name", String, nullable=False),
    Column("uid", String, nullable=False),
    Column("type", String, nullable=False),  # Normal | Warning
    Column("reason", String, nullable=False),
    Column("message", Text, nullable=False),
    Index("ix_events_object", "kind", "name"),
)

META = Table(
    "meta", metadata,  # store-wide counters: schema version and the change sequence (resourceVersion source)
    Column("key", String, primary_key=True),
    Column("value", Integer, nullable=False),
)

ADMISSIONS = Table(
    "admissions", metadata,  # slots held by an admitted job, from admission until its processes are proven gone
    Column("job_uid", String, primary_key=True),
    Column("job_name", String, nullable=False),
    Column("pool", String, index=True),
    Column("slots", Integer, nullable=False),
    Column("node", String, index=True),
    Column("run_number", Integer, nullable=False),
    Column("admitted_at", Float, nullable=False),
    Column("owner", String),  # the agent that claimed the spawn (host:pid:start), so no run starts twice
)

QUEUE = Table(
    "queue", metadata,  # eligible jobs waiting for admission, ordered by (rank = -priority, eligible_at, uid)
    Column("job_uid", String, primary_key=True),
    Column("job_name", String, nullable=False),
    Column("pool", String),
    Column("slots", Integer, nullable=False),
    Column("rank", Integer, nullable=False),
    Column("eligible_at", Float, nullable=False),
    Column("bypass_count", Integer, nullable=False, default=0),
    Column("node_name", String),  # placement constraints, so a head's fit can be judged from here
    Column("node_selector", String, nullable=False, default="{}"),
    Index("ix_queue_global", "rank", "eligible_at", "job_uid"),
    Index("ix_queue_pool", "pool", "rank", "eligible_at", "job_uid"),
)


class Base(DeclarativeBase):
    metadata = metadata


class ObjectRow(Base):
    __table__ = OBJECTS


class EventRow(Base):
    __table__ = EVENTS


class MetaRow(Base):
    __table__ = META


class AdmissionRow(Base):
    __table__ = ADMISSIONS


class QueueRow(Base):
    __table__ = QUEUE
