"""GENERATED from tables.py by ddlgen.py (`python -m reconciler.store.ddlgen`): the
statements that create each table and its indexes, per dialect, in create_all's order.
Do not edit: tests/test_store.py fails when this differs from what tables.py compiles to."""

DDL: dict[str, dict[str, tuple[str, ...]]] = {
    "sqlite": {
        "objects": (
            (
                "CREATE TABLE objects ( kind VARCHAR NOT NULL, name VARCHAR NOT NULL, uid VARCHAR NOT NULL, "
                "generation INTEGER NOT NULL, resource_version INTEGER NOT NULL, labels TEXT NOT NULL, "
                "annotations TEXT NOT NULL, spec TEXT NOT NULL, status TEXT, phase VARCHAR, observed_generation "
                "INTEGER, outcome VARCHAR, reason VARCHAR, pool VARCHAR, created_at FLOAT NOT NULL, deleted_at "
                "FLOAT, created_rv INTEGER, PRIMARY KEY (kind, name), UNIQUE (uid) )"
            ),
            "CREATE INDEX ix_objects_resource_version ON objects (resource_version)",
            "CREATE INDEX ix_objects_state ON objects (kind, phase, outcome, pool, reason)",
        ),
        "events": (
            (
                "CREATE TABLE events ( id INTEGER NOT NULL, resource_version INTEGER NOT NULL, time FLOAT NOT "
                "NULL, kind VARCHAR NOT NULL, name VARCHAR NOT NULL, uid VARCHAR NOT NULL, type VARCHAR NOT NULL,"
                " reason VARCHAR NOT NULL, message TEXT NOT NULL, PRIMARY KEY (id) )"
            ),
            "CREATE INDEX ix_events_object ON events (kind, name)",
            "CREATE INDEX ix_events_resource_version ON events (resource_version)",
        ),
        "meta": ('CREATE TABLE meta ( "key" VARCHAR NOT NULL, value INTEGER NOT NULL, PRIMARY KEY ("key") )',),
        "admissions": (
            (
                "CREATE TABLE admissions ( job_uid VARCHAR NOT NULL, job_name VARCHAR NOT NULL, pool VARCHAR, "
                "slots INTEGER NOT NULL, node VARCHAR, run_number INTEGER NOT NULL, admitted_at FLOAT NOT NULL, "
                "owner VARCHAR, port INTEGER, cpu FLOAT, memory BIGINT, epoch INTEGER, report TEXT, reported_rv "
                "INTEGER, PRIMARY KEY (job_uid) )"
            ),
            "CREATE INDEX ix_admissions_node ON admissions (node)",
            "CREATE INDEX ix_admissions_pool ON admissions (pool)",
            "CREATE UNIQUE INDEX ix_admissions_node_port ON admissions (node, port) WHERE port IS NOT NULL",
        ),
        "queue": (
            (
                "CREATE TABLE queue ( job_uid VARCHAR NOT NULL, job_name VARCHAR NOT NULL, pool VARCHAR, slots "
                "INTEGER NOT NULL, rank INTEGER NOT NULL, eligible_at FLOAT NOT NULL, bypass_count INTEGER NOT "
                "NULL, node_name VARCHAR, node_selector VARCHAR NOT NULL, cpu FLOAT, memory BIGINT, PRIMARY KEY "
                "(job_uid) )"
            ),
            "CREATE INDEX ix_queue_global ON queue (rank, eligible_at, job_uid)",
            "CREATE INDEX ix_queue_pool ON queue (pool, rank, eligible_at, job_uid)",
        ),
        "outbox": (
            (
                "CREATE TABLE outbox ( id INTEGER NOT NULL, notifier VARCHAR NOT NULL, event_id VARCHAR NOT NULL,"
                " body TEXT NOT NULL, created_at FLOAT NOT NULL, next_attempt_at FLOAT NOT NULL, attempts INTEGER"
                " NOT NULL, last_error TEXT, PRIMARY KEY (id) )"
            ),
            "CREATE INDEX ix_outbox_due ON outbox (notifier, next_attempt_at, id)",
        ),
        "deliveries": (
            (
                "CREATE TABLE deliveries ( notifier VARCHAR NOT NULL, delivered INTEGER NOT NULL, failed INTEGER "
                "NOT NULL, last_error TEXT, last_error_at FLOAT, last_delivery_at FLOAT, owner VARCHAR, "
                "lease_until FLOAT, PRIMARY KEY (notifier) )"
            ),
        ),
        "ingested": (
            (
                "CREATE TABLE ingested ( source VARCHAR NOT NULL, message_id VARCHAR NOT NULL, job VARCHAR NOT "
                "NULL, created_at FLOAT NOT NULL, PRIMARY KEY (source, message_id) )"
            ),
            "CREATE INDEX ix_ingested_age ON ingested (source, created_at)",
        ),
        "leases": (
            (
                "CREATE TABLE leases ( name VARCHAR NOT NULL, holder VARCHAR, term INTEGER NOT NULL, expires_at "
                "FLOAT NOT NULL, renewed_at FLOAT NOT NULL, acquired_at FLOAT NOT NULL, PRIMARY KEY (name) )"
            ),
        ),
    },
    "postgresql": {
        "objects": (
            (
                "CREATE TABLE objects ( kind VARCHAR NOT NULL, name VARCHAR NOT NULL, uid VARCHAR NOT NULL, "
                "generation INTEGER NOT NULL, resource_version INTEGER NOT NULL, labels TEXT NOT NULL, "
                "annotations TEXT NOT NULL, spec TEXT NOT NULL, status TEXT, phase VARCHAR, observed_generation "
                "INTEGER, outcome VARCHAR, reason VARCHAR, pool VARCHAR, created_at FLOAT NOT NULL, deleted_at "
                "FLOAT, created_rv INTEGER, PRIMARY KEY (kind, name), UNIQUE (uid) )"
            ),
            "CREATE INDEX ix_objects_resource_version ON objects (resource_version)",
            "CREATE INDEX ix_objects_state ON objects (kind, phase, outcome, pool, reason)",
        ),
        "events": (
            (
                "CREATE TABLE events ( id SERIAL NOT NULL, resource_version INTEGER NOT NULL, time FLOAT NOT "
                "NULL, kind VARCHAR NOT NULL, name VARCHAR NOT NULL, uid VARCHAR NOT NULL, type VARCHAR NOT NULL,"
                " reason VARCHAR NOT NULL, message TEXT NOT NULL, PRIMARY KEY (id) )"
            ),
            "CREATE INDEX ix_events_object ON events (kind, name)",
            "CREATE INDEX ix_events_resource_version ON events (resource_version)",
        ),
        "meta": ("CREATE TABLE meta ( key VARCHAR NOT NULL, value INTEGER NOT NULL, PRIMARY KEY (key) )",),
        "admissions": (
            (
                "CREATE TABLE admissions ( job_uid VARCHAR NOT NULL, job_name VARCHAR NOT NULL, pool VARCHAR, "
                "slots INTEGER NOT NULL, node VARCHAR, run_number INTEGER NOT NULL, admitted_at FLOAT NOT NULL, "
                "owner VARCHAR, port INTEGER, cpu FLOAT, memory BIGINT, epoch INTEGER, report TEXT, reported_rv "
                "INTEGER, PRIMARY KEY (job_uid) )"
            ),
            "CREATE INDEX ix_admissions_node ON admissions (node)",
            "CREATE INDEX ix_admissions_pool ON admissions (pool)",
            "CREATE UNIQUE INDEX ix_admissions_node_port ON admissions (node, port) WHERE port IS NOT NULL",
        ),
        "queue": (
            (
                "CREATE TABLE queue ( job_uid VARCHAR NOT NULL, job_name VARCHAR NOT NULL, pool VARCHAR, slots "
                "INTEGER NOT NULL, rank INTEGER NOT NULL, eligible_at FLOAT NOT NULL, bypass_count INTEGER NOT "
                "NULL, node_name VARCHAR, node_selector VARCHAR NOT NULL, cpu FLOAT, memory BIGINT, PRIMARY KEY "
                "(job_uid) )"
            ),
            "CREATE INDEX ix_queue_global ON queue (rank, eligible_at, job_uid)",
            "CREATE INDEX ix_queue_pool ON queue (pool, rank, eligible_at, job_uid)",
        ),
        "outbox": (
            (
                "CREATE TABLE outbox ( id SERIAL NOT NULL, notifier VARCHAR NOT NULL, event_id VARCHAR NOT NULL, "
                "body TEXT NOT NULL, created_at FLOAT NOT NULL, next_attempt_at FLOAT NOT NULL, attempts INTEGER "
                "NOT NULL, last_error TEXT, PRIMARY KEY (id) )"
            ),
            "CREATE INDEX ix_outbox_due ON outbox (notifier, next_attempt_at, id)",
        ),
        "deliveries": (
            (
                "CREATE TABLE deliveries ( notifier VARCHAR NOT NULL, delivered INTEGER NOT NULL, failed INTEGER "
                "NOT NULL, last_error TEXT, last_error_at FLOAT, last_delivery_at FLOAT, owner VARCHAR, "
                "lease_until FLOAT, PRIMARY KEY (notifier) )"
            ),
        ),
        "ingested": (
            (
                "CREATE TABLE ingested ( source VARCHAR NOT NULL, message_id VARCHAR NOT NULL, job VARCHAR NOT "
                "NULL, created_at FLOAT NOT NULL, PRIMARY KEY (source, message_id) )"
            ),
            "CREATE INDEX ix_ingested_age ON ingested (source, created_at)",
        ),
        "leases": (
            (
                "CREATE TABLE leases ( name VARCHAR NOT NULL, holder VARCHAR, term INTEGER NOT NULL, expires_at "
                "FLOAT NOT NULL, renewed_at FLOAT NOT NULL, acquired_at FLOAT NOT NULL, PRIMARY KEY (name) )"
            ),
        ),
    },
}
