"""SQLModel tables. JSON documents are TEXT so SQLite and PostgreSQL share one schema."""

from __future__ import annotations

from sqlalchemy import Column, Index, Text
from sqlmodel import Field, SQLModel


class ObjectRow(SQLModel, table=True):
    """Desired spec and observed status of every resource, one row per (kind, name)."""

    __tablename__ = "objects"
    kind: str = Field(primary_key=True)
    name: str = Field(primary_key=True)
    uid: str = Field(unique=True)
    generation: int
    resource_version: int = Field(index=True)
    labels: str = Field(sa_column=Column(Text, nullable=False))
    annotations: str = Field(sa_column=Column(Text, nullable=False))
    spec: str = Field(sa_column=Column(Text, nullable=False))
    status: str | None = Field(default=None, sa_column=Column(Text))
    created_at: float
    deleted_at: float | None = None


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
