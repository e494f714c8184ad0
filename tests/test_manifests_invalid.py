"""Malformed manifests: `apply` refuses each with exit 2, names `FILE:LINE: field.path`,
prints nothing on stdout, never a traceback, and leaves the store exactly as it was.

One SQLite store per module is pre-populated with valid objects (pools, jobs with a
dependency); every case is applied against it, and every row of every table is compared
before and after. Each case's expected line is the line carrying the marker `# <--`
in the case's YAML (or given explicitly where a marker cannot be written)."""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.data.inprocess import cli
from tests.helpers import run_cli

MARK = "# <--"
HEAD = "apiVersion: reconciler.dev/v1alpha1\n"

# Stored before any case runs: cases refer to these (cycles through stored jobs, pool
# capacities, shrinking a pool below a stored job's need).
BASE = """\
apiVersion: reconciler.dev/v1alpha1
kind: Pool
metadata: {name: global}
spec: {slots: 4}
---
apiVersion: reconciler.dev/v1alpha1
kind: Pool
metadata: {name: analysis, labels: {team: data}}
spec: {slots: 2}
---
apiVersion: reconciler.dev/v1alpha1
kind: Job
metadata: {name: base, labels: {pipeline: base}}
spec:
  command: ["true"]
  pool: analysis
  slots: 2
---
apiVersion: reconciler.dev/v1alpha1
kind: Job
metadata: {name: base-2, labels: {pipeline: base}}
spec:
  shell: "echo two"
  dependsOn: [base]
---
apiVersion: reconciler.dev/v1alpha1
kind: Notifier
metadata: {name: chat}
spec: {url: "https://hooks.example/jobs"}
"""


def job(spec: str, name: str = "bad", meta: str = "") -> str:
    """A Job document whose spec body is `spec` (indented by the caller's 2 spaces)."""
    return f"{HEAD}kind: Job\nmetadata:\n  name: {name}\n{meta}spec:\n{spec}"


@dataclass
class Case:
    id: str
    files: dict[str, str | bytes]
    file: str  # which file the error must name
    path: str | None  # the field path; None where none applies (YAML syntax, file-level)
    message: str  # a fragment the message must contain (case-insensitive)
    line: int | None = None  # None: the line carrying MARK in `file`
    extra: list[str] = field(default_factory=list)  # further fragments of stderr


def one(id: str, text: str, path: str | None, message: str, *, line: int | None = None, **kw) -> Case:
    return Case(id, {"jobs.yaml": text}, "jobs.yaml", path, message, line, **kw)


def _alias_bomb() -> str:
    lines = [
        HEAD
        + 'kind: Job\nmetadata:\n  name: lol\nspec:\n  command: ["true"]\n  env:\n'
        + "    a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"
    ]
    for i in range(1, 10):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        lines.append(f"    a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


CASES: list[Case] = [
    # --- the document itself -------------------------------------------------------------
    one("yaml-unclosed-flow", job("  command: [echo, hi\n  slots: 1  # <--\n"), None, "invalid YAML"),
    one("yaml-bad-indent", job('  command: ["true"]\n    slots: 1  # <--\n'), None, "invalid YAML"),
    one("yaml-tab-indent", HEAD + "kind: Job\nmetadata:\n\tname: x  # <--\n", None, "invalid YAML"),
    one("non-mapping-list", "- apiVersion: reconciler.dev/v1alpha1  # <--\n- kind: Job\n", "(document)", "mapping"),
    one("non-mapping-scalar", "# a comment\njust a string  # <--\n", "(document)", "mapping"),
    one(
        "wrong-apiversion",
        'apiVersion: batch/v1  # <--\nkind: Job\nmetadata: {name: x}\nspec: {command: ["true"]}\n',
        "apiVersion",
        "reconciler.dev/v1alpha1",
    ),
    one(
        "missing-apiversion",
        'kind: Job  # <--\nmetadata: {name: x}\nspec: {command: ["true"]}\n',
        "apiVersion",
        "reconciler.dev/v1alpha1",
        line=1,
    ),
    one("unknown-kind", HEAD + "kind: Deployment  # <--\nmetadata: {name: x}\nspec: {}\n", "kind", "Job"),
    one("duplicate-yaml-key", job('  command: ["true"]\n  slots: 1\n  slots: 2  # <--\n'), "spec.slots", "duplicate"),
    one("alias-bomb", _alias_bomb(), None, "too large", line=1, extra=["aliases"]),
    one("empty-shell", job('  shell: ""  # <--\n'), "spec.shell", "must not be empty"),
    one("alias-self-reference", job('  command: ["true"]\n  env: &loop {x: *loop}\n'), None, "", line=1),
    one(
        "label-each-bad-one-named",
        job('  command: ["true"]\n', meta='  labels:\n    "b c": x  # <--\n    d: "bad value!"\n'),
        "metadata.labels.b c",
        "label key",
        extra=["metadata.labels.d: invalid label value"],
    ),
    Case(
        "oversized-file",
        {"jobs.yaml": job('  command: ["true"]\n') + "#" + "x" * (8 * 2**20) + "\n"},
        "jobs.yaml",
        None,
        "too large",
        line=1,
    ),
    Case(
        "non-utf8",
        {"jobs.yaml": job('  shell: "echo caf\xe9"\n').encode("latin-1")},
        "jobs.yaml",
        None,
        "UTF-8",
        line=1,
    ),
    # --- unknown fields at every depth ----------------------------------------------------
    one("unknown-top-level", job('  command: ["true"]\n') + "replicas: 3  # <--\n", "replicas", "unknown field"),
    one(
        "unknown-in-metadata",
        job('  command: ["true"]\n', meta="  namespace: default  # <--\n"),
        "metadata.namespace",
        "unknown field",
    ),
    one(
        "unknown-in-spec",
        job('  command: ["true"]\n  restartPolicy: Never  # <--\n'),
        "spec.restartPolicy",
        "unknown field",
    ),
    one(
        "unknown-in-backoff",
        job('  command: ["true"]\n  retry:\n    limit: 1\n    backoff:\n      delay: 1s\n      base: 2  # <--\n'),
        "spec.retry.backoff.base",
        "unknown field",
    ),
    one(
        "unknown-in-wait-condition",
        job(
            '  command: ["true"]\n  waitFor:\n    conditions:\n      - delay: 1s\n'
            "      - path: /tmp/ready\n        every: 1s  # <--\n"
        ),
        "spec.waitFor.conditions[1].every",
        "unknown field",
    ),
    one(
        "unknown-in-probe",
        job(
            '  command: ["true"]\n  waitFor:\n    conditions:\n      - probe:\n'
            "          command: [pg_isready]\n          retries: 3  # <--\n"
        ),
        "spec.waitFor.conditions[0].probe.retries",
        "unknown field",
    ),
    # --- command / shell ------------------------------------------------------------------
    one(
        "command-and-shell",
        HEAD + "kind: Job\nmetadata: {name: bad}\nspec:  # <--\n  command: [make]\n  shell: make\n",
        "spec",
        "exactly one of command or shell",
    ),
    one(
        "neither-command-nor-shell",
        job("  slots: 1\n").replace("spec:\n", "spec:  # <--\n"),
        "spec",
        "exactly one of command or shell",
    ),
    one("empty-command", job("  command: []  # <--\n"), "spec.command", "at least 1"),
    # --- names and labels -----------------------------------------------------------------
    one("name-uppercase", job('  command: ["true"]\n', name="Analyze-1  # <--"), "metadata.name", "DNS-1123"),
    one("name-too-long", job('  command: ["true"]\n', name="a" * 64 + "  # <--"), "metadata.name", "63"),
    one("name-leading-dash", job('  command: ["true"]\n', name="'-job'  # <--"), "metadata.name", "DNS-1123"),
    one(
        "name-missing",
        HEAD + 'kind: Job\nmetadata:  # <--\n  labels: {a: b}\nspec: {command: ["true"]}\n',
        "metadata.name",
        "required",
    ),
    one(
        "label-key-bad",
        job('  command: ["true"]\n', meta='  labels:\n    "bad key!": x  # <--\n'),
        "metadata.labels.bad key!",
        "label key",
    ),
    one(
        "label-value-bad",
        job('  command: ["true"]\n', meta='  labels:\n    tier: "-front end-"  # <--\n'),
        "metadata.labels.tier",
        "label value",
    ),
    # --- quantities -----------------------------------------------------------------------
    one("duration-bare-number", job('  command: ["true"]\n  timeout: 30  # <--\n'), "spec.timeout", "duration"),
    one("duration-bad-unit", job('  command: ["true"]\n  runTimeout: 5x  # <--\n'), "spec.runTimeout", "duration"),
    one(
        "duration-negative",
        job('  command: ["true"]\n  stopGracePeriod: -1s  # <--\n'),
        "spec.stopGracePeriod",
        "duration",
    ),
    one(
        "duration-in-backoff",
        job('  command: ["true"]\n  retry:\n    backoff:\n      maxDelay: soon  # <--\n'),
        "spec.retry.backoff.maxDelay",
        "duration",
    ),
    one(
        "size-bad", job('  command: ["true"]\n  resources:\n    memory: 12Qi  # <--\n'), "spec.resources.memory", "size"
    ),
    one("cpu-bad", job('  command: ["true"]\n  resources:\n    cpu: two  # <--\n'), "spec.resources.cpu", "CPU"),
    one(
        "probe-output-limit-bad",
        job(
            '  command: ["true"]\n  waitFor:\n    conditions:\n      - probe:\n'
            '          command: ["true"]\n          outputLimit: lots  # <--\n'
        ),
        "spec.waitFor.conditions[0].probe.outputLimit",
        "size",
    ),
    # --- enums ----------------------------------------------------------------------------
    one("enum-type", job('  command: ["true"]\n  type: batch  # <--\n'), "spec.type", "run, service"),
    one(
        "enum-backoff-policy",
        job('  command: ["true"]\n  retry:\n    limit: 1\n    backoff:\n      policy: fibonacci  # <--\n'),
        "spec.retry.backoff.policy",
        "constant, linear, exponential",
    ),
    one(
        "enum-wait-mode",
        job('  command: ["true"]\n  waitFor:\n    mode: most  # <--\n    conditions: [{delay: 1s}]\n'),
        "spec.waitFor.mode",
        "all, any",
    ),
    one(
        "enum-path-type",
        job(
            '  command: ["true"]\n  waitFor:\n    conditions:\n      - path: /run/x.sock\n        type: socket  # <--\n'
        ),
        "spec.waitFor.conditions[0].type",
        "file, dir",
    ),
    one(
        "enum-dependency-outcome",
        job('  command: ["true"]\n  dependsOn:\n    - job: base\n      outcomes: [Succeeded, Maybe]  # <--\n'),
        "spec.dependsOn[0].outcomes[1]",
        "Finished",
    ),
    # --- numbers --------------------------------------------------------------------------
    one("slots-negative", job('  command: ["true"]\n  slots: -1  # <--\n'), "spec.slots", "greater than or equal to 1"),
    one("slots-zero", job('  command: ["true"]\n  slots: 0  # <--\n'), "spec.slots", "greater than or equal to 1"),
    one(
        "retry-limit-negative",
        job('  command: ["true"]\n  retry:\n    limit: -1  # <--\n'),
        "spec.retry.limit",
        "greater than or equal to 0",
    ),
    one(
        "backoff-factor-below-1",
        job('  command: ["true"]\n  retry:\n    backoff: {policy: exponential,\n              factor: 0.5}  # <--\n'),
        "spec.retry.backoff.factor",
        "greater than or equal to 1",
    ),
    one(
        "exit-codes-zero",
        job('  command: ["true"]\n  retry:\n    limit: 1\n    onExitCodes: [1, 0]  # <--\n'),
        "spec.retry.onExitCodes",
        "0",
    ),
    one(
        "exit-codes-256",
        job('  command: ["true"]\n  retry:\n    limit: 1\n    onExitCodes: [75, 256]  # <--\n'),
        "spec.retry.onExitCodes",
        "256",
    ),
    one("port-on-run-job", job('  command: ["true"]\n  port: 8080  # <--\n'), "spec.port", "service"),
    one(
        "port-out-of-range",
        job('  command: ["true"]\n  type: service\n  port: 70000  # <--\n'),
        "spec.port",
        "less than or equal to 65535",
    ),
    one(
        "port-not-a-number", job('  command: ["true"]\n  type: service\n  port: http  # <--\n'), "spec.port", "integer"
    ),
    one(
        "restart-delay-zero-is-a-hot-loop",
        job('  command: ["true"]\n  type: service\n  restart:\n    delay: 0s  # <--\n    maxDelay: 0s\n'),
        "spec.restart.delay",
        "at least 100ms",
    ),
    one(
        "restart-on-run-job",
        job('  command: ["true"]\n  restart: {delay: 1s}  # <--\n'),
        "spec.restart",
        "only allowed on a service job",
    ),
    one(
        "readiness-on-run-job",
        job('  command: ["true"]\n  readiness: {probe: {command: ["true"]}}  # <--\n'),
        "spec.readiness",
        "only allowed on a service job",
    ),
    one(
        "restart-bad-duration",
        job('  command: ["true"]\n  type: service\n  restart:\n    resetAfter: soon  # <--\n'),
        "spec.restart.resetAfter",
        "duration",
    ),
    one(
        "readiness-without-probe",
        job('  command: ["true"]\n  type: service\n  readiness:  # <--\n    interval: 5s\n'),
        "spec.readiness.probe",
        "required",
    ),
    one(
        "readiness-fatal-on-error",
        job(
            '  command: ["true"]\n  type: service\n  readiness:\n'
            '    probe: {command: ["true"], fatalOnError: true}  # <--\n'
        ),
        "spec.readiness.probe.fatalOnError",
        "unknown field",
    ),
    one(
        "readiness-interval-too-short",
        job(
            '  command: ["true"]\n  type: service\n  readiness:\n'
            '    probe: {command: ["true"]}\n    interval: 10ms  # <--\n'
        ),
        "spec.readiness.interval",
        "100ms",
    ),
    # --- pools ----------------------------------------------------------------------------
    one("pool-global", job('  command: ["true"]\n  pool: global  # <--\n'), "spec.pool", "global"),
    one("pool-unknown", job('  command: ["true"]\n  pool: gpu  # <--\n'), "spec.pool", "does not exist"),
    one(
        "slots-exceed-pool",
        job('  command: ["true"]\n  pool: analysis\n  slots: 3  # <--\n'),
        "spec.slots",
        "never fit pool 'analysis'",
    ),
    one("slots-exceed-global", job('  command: ["true"]\n  slots: 5  # <--\n'), "spec.slots", "global limit"),
    one(
        "pool-slots-lots",
        HEAD + "kind: Pool\nmetadata: {name: big}\nspec:\n  slots: lots  # <--\n",
        "spec.slots",
        "unlimited",
    ),
    one(
        "pool-slots-negative",
        HEAD + "kind: Pool\nmetadata: {name: big}\nspec:\n  slots: -2  # <--\n",
        "spec.slots",
        "non-negative",
    ),
    one(
        "pool-shrunk-below-stored-job",
        HEAD + "kind: Pool\nmetadata: {name: analysis}\nspec:\n  slots: 1  # <--\n",
        "spec.slots",
        "'base' needs (2)",
    ),
    # --- dependencies ---------------------------------------------------------------------
    one(
        "dependency-unknown",
        job('  command: ["true"]\n  dependsOn:\n    - prepare-data  # <--\n'),
        "spec.dependsOn[0].job",
        "'prepare-data' does not exist",
    ),
    one(
        "dependency-self",
        job('  command: ["true"]\n  dependsOn:\n    - base\n    - {job: bad}  # <--\n'),
        "spec.dependsOn[1].job",
        "itself",
    ),
    Case(
        "cycle-of-2",
        {
            "jobs.yaml": job('  command: ["true"]\n  dependsOn: [b]  # <--\n', name="a")
            + "---\n"
            + job('  command: ["true"]\n  dependsOn: [a]\n', name="b")
        },
        "jobs.yaml",
        "spec.dependsOn",
        "dependency cycle: a -> b -> a",
    ),
    Case(
        "cycle-of-3",
        {
            "jobs.yaml": job('  command: ["true"]\n  dependsOn: [b]  # <--\n', name="a")
            + "---\n"
            + job('  command: ["true"]\n  dependsOn: [c]\n', name="b")
            + "---\n"
            + job('  command: ["true"]\n  dependsOn: [a]\n', name="c")
        },
        "jobs.yaml",
        "spec.dependsOn",
        "dependency cycle: a -> b -> c -> a",
    ),
    one(
        "cycle-through-stored-job",
        job('  command: ["true"]\n  pool: analysis\n  slots: 2\n  dependsOn: [base-2]  # <--\n', name="base"),
        "spec.dependsOn",
        "dependency cycle: base -> base-2 -> base",
    ),
    one(
        "dependency-contradictory-edges",
        job('  command: ["true"]\n  dependsOn:\n    - base\n    - {job: base, outcomes: [Failed]}  # <--\n'),
        "spec.dependsOn[1]",
        "different outcomes",
    ),
    one(
        "dependency-not-a-name",
        job('  command: ["true"]\n  dependsOn:\n    - {job: Base_1}  # <--\n'),
        "spec.dependsOn[0].job",
        "DNS-1123",
    ),
    Case(
        "duplicate-name-across-files",
        {"a.yaml": job('  command: ["true"]\n', name="twin"), "b.yaml": job('  shell: "true"\n', name="twin  # <--")},
        "b.yaml",
        "metadata.name",
        "duplicate Job 'twin'",
        extra=["a.yaml:1"],
    ),
    # --- waits ----------------------------------------------------------------------------
    one(
        "wait-two-kinds",
        job(
            '  command: ["true"]\n  waitFor:\n    conditions:\n      - delay: 1s\n'
            "      - path: /tmp/x  # <--\n        delay: 5s\n"
        ),
        "spec.waitFor.conditions[1]",
        "exactly one of until, delay, path, probe",
    ),
    one(
        "wait-no-kind",
        job('  command: ["true"]\n  waitFor:\n    conditions:\n      - interval: 1s  # <--\n'),
        "spec.waitFor.conditions[0]",
        "exactly one of until, delay, path, probe",
    ),
    one(
        "wait-abortat-and-abortafter",
        job(
            '  command: ["true"]\n  waitFor:  # <--\n    conditions: [{delay: 1s}]\n'
            '    abortAt: "2030-01-01T00:00:00Z"\n    abortAfter: 2h\n'
        ),
        "spec.waitFor",
        "abortAt or abortAfter",
    ),
    one(
        "wait-until-without-timezone",
        job('  command: ["true"]\n  waitFor:\n    conditions:\n      - until: "2030-12-01T03:00:00"  # <--\n'),
        "spec.waitFor.conditions[0].until",
        "time zone",
    ),
    one(
        "wait-abortat-not-a-time",
        job('  command: ["true"]\n  waitFor:\n    abortAt: tomorrow  # <--\n'),
        "spec.waitFor.abortAt",
        "datetime",
    ),
    # --- other kinds and fields -----------------------------------------------------------
    one(
        "notifier-url-and-command",
        HEAD + "kind: Notifier\nmetadata: {name: chat2}\nspec:  # <--\n"
        "  url: https://hooks.example/x\n  command: [notify-send, job]\n",
        "spec",
        "exactly one of url or command",
    ),
    one(
        "notifier-unknown-event",
        HEAD + "kind: Notifier\nmetadata: {name: chat2}\nspec:\n  url: https://h.example/x\n"
        "  events: [Succeeded, Exploded]  # <--\n",
        "spec.events[1]",
        "Succeeded",
    ),
    one(
        "notifier-bad-event-name",
        HEAD + "kind: Notifier\nmetadata: {name: chat2}\nspec:\n  url: https://h.example/x\n"
        "  events: [Started, Finished]  # <--\n",
        "spec.events[1]",
        "Retrying",
    ),
    one(
        "notifier-url-without-host",
        HEAD + "kind: Notifier\nmetadata: {name: chat2}\nspec:\n  url: 'http://'  # <--\n",
        "spec.url",
        "names no host",
    ),
    one(
        "notifier-event-twice",
        HEAD + "kind: Notifier\nmetadata: {name: chat2}\nspec:\n  url: https://h.example/x\n"
        "  events: [Failed, Failed]  # <--\n",
        "spec.events",
        "Failed named more than once",
    ),
    one(
        "pool-max-bypass-a-string",
        HEAD + "kind: Pool\nmetadata: {name: fair}\nspec:\n  maxBypass: '3'  # <--\n",
        "spec.maxBypass",
        "valid integer",
    ),
    one(
        "job-slots-a-string",
        job("  command: ['true']\n  slots: '2'  # <--\n"),
        "spec.slots",
        "valid integer",
    ),
    one(
        "notifier-bad-selector",
        HEAD + "kind: Notifier\nmetadata: {name: chat2}\nspec:\n  url: https://h.example/x\n"
        "  selector: 'team in ()'  # <--\n",
        "spec.selector",
        "invalid label selector",
    ),
    one(
        "notifier-secretref-without-file",
        HEAD + "kind: Notifier\nmetadata: {name: chat2}\nspec:\n  url: https://h.example/x\n  secretRef: {}  # <--\n",
        "spec.secretRef.file",
        "required field is missing",
    ),
    one(
        "notifier-secretref-with-command",
        HEAD + "kind: Notifier\nmetadata: {name: chat2}\nspec:  # <--\n  command: [notify-send]\n"
        "  secretRef: {file: /etc/key}\n",
        "spec",
        "secretRef signs webhook bodies",
    ),
    one(
        "node-negative-slots",
        HEAD + "kind: Node\nmetadata: {name: n1}\nspec:\n  capacity:\n    slots: -4  # <--\n",
        "spec.capacity.slots",
        "greater than or equal to 0",
    ),
    one(
        "artifact-bad-scheme",
        job('  command: ["true"]\n  artifact:\n    url: ftp://x/app.zip  # <--\n'),
        "spec.artifact.url",
        "file://",
    ),
    one(
        "artifact-bad-sha256",
        job('  command: ["true"]\n  artifact:\n    url: file:///srv/app.zip\n    sha256: xyz  # <--\n'),
        "spec.artifact.sha256",
        "pattern",
    ),
    one("env-bad-name", job('  command: ["true"]\n  env:  # <--\n    "A=B": x\n'), "spec.env", "environment variable"),
    one(
        "env-value-not-string",
        job('  command: ["true"]\n  env:\n    N: {nested: map}  # <--\n'),
        "spec.env.N",
        "string",
    ),
    one("suspend-not-bool", job('  command: ["true"]\n  suspend: perhaps  # <--\n'), "spec.suspend", "boolean"),
    one(
        "second-document-bad",
        job('  command: ["true"]\n', name="fine") + "---\n" + job('  command: ["true"]\n  priority: high  # <--\n'),
        "spec.priority",
        "integer",
    ),
    # --- hostile values: every one of these once stopped or wedged the controller ----------
    one("timeout-past-any-timer", job('  command: ["true"]\n  timeout: 110000d  # <--\n'), "spec.timeout", "3650d"),
    one(
        "run-timeout-past-any-timer",
        job('  command: ["true"]\n  runTimeout: 99999999999999999999d  # <--\n'),
        "spec.runTimeout",
        "longest allowed",
    ),
    one(
        "slots-past-any-integer",
        job('  command: ["true"]\n  slots: 99999999999999999999999  # <--\n'),
        "spec.slots",
        "less than or equal to 1000000",
    ),
    one(
        "priority-past-bound",
        job('  command: ["true"]\n  priority: 2000000000  # <--\n'),
        "spec.priority",
        "1000000000",
    ),
    one(
        "priority-below-bound",
        job('  command: ["true"]\n  priority: -99999999999999999999  # <--\n'),
        "spec.priority",
        "greater than or equal",
    ),
    one(
        "pool-slots-past-bound",
        HEAD + "kind: Pool\nmetadata: {name: huge}\nspec:\n  slots: 10000000000000000000000  # <--\n",
        "spec.slots",
        "1000000",
    ),
    one(
        "pool-max-bypass-past-bound",
        HEAD + "kind: Pool\nmetadata: {name: huge}\nspec:\n  maxBypass: 99999999999999999999  # <--\n",
        "spec.maxBypass",
        "less than or equal",
    ),
    one(
        "node-slots-past-bound",
        HEAD + "kind: Node\nmetadata: {name: huge}\nspec:\n  capacity:\n    slots: 99999999999999  # <--\n",
        "spec.capacity.slots",
        "less than or equal",
    ),
    one(
        "memory-past-bound",
        job('  command: ["true"]\n  resources: {memory: 9999Pi}  # <--\n'),
        "spec.resources.memory",
        "1Pi",
    ),
    one("cpu-past-bound", job('  command: ["true"]\n  resources: {cpu: "1e9"}  # <--\n'), "spec.resources.cpu", "CPU"),
    one(
        "backoff-factor-past-bound",
        job('  command: ["true"]\n  retry:\n    backoff: {factor: 1e308}  # <--\n'),
        "spec.retry.backoff.factor",
        "less than or equal",
    ),
    one(
        "probe-interval-spins",
        job(
            '  command: ["true"]\n  waitFor:\n    conditions:\n    - probe: {command: ["true"], interval: 0s}  # <--\n'
        ),
        "spec.waitFor.conditions[0].probe.interval",
        "at least 100ms",
    ),
    one(
        "path-interval-spins",
        job('  command: ["true"]\n  waitFor:\n    conditions:\n    - {path: /tmp/x, interval: 1ms}  # <--\n'),
        "spec.waitFor.conditions[0].interval",
        "at least 100ms",
    ),
    one(
        "probe-output-limit-past-bound",
        job(
            '  command: ["true"]\n  waitFor:\n    conditions:\n'
            '    - probe: {command: ["true"], outputLimit: 1Gi}  # <--\n'
        ),
        "spec.waitFor.conditions[0].probe.outputLimit",
        "less than or equal",
    ),
    one(
        "yaml-boolean-where-text-is-wanted",
        job("  command: [true]  # <--\n"),
        "spec.command[0]",
        'YAML read true as a boolean, not as text: quote it ("true")',
    ),
    one(
        "yaml-number-where-text-is-wanted",
        job("  command: [sleep, 5]  # <--\n"),
        "spec.command[1]",
        'read 5 as a number, not as text: quote it ("5")',
    ),
    one(
        "yaml-yes-is-a-boolean",
        job('  command: ["true"]\n  env:\n    DEBUG: yes  # <--\n'),
        "spec.env.DEBUG",
        "read yes as a boolean",
    ),
    one(
        "log-limit-past-bound",
        job('  command: ["true"]\n  logLimit: 2Pi  # <--\n'),
        "spec.logLimit",
        "larger than the largest allowed, 1Pi",
    ),
    one(
        "log-limit-too-small",
        job('  command: ["true"]\n  logLimit: 1Ki  # <--\n'),
        "spec.logLimit",
        "at least 4Ki",
    ),
    one("log-limit-bad", job('  command: ["true"]\n  logLimit: lots  # <--\n'), "spec.logLimit", "size"),
    one(
        "yaml-binary-tag",
        job('  command: ["true"]\n  env:\n    KEY: !!binary aGVsbG8=  # <--\n'),
        "spec.env.KEY",
        "!!binary is not allowed",
    ),
    one(
        "yaml-set-tag",
        job("  command: !!set {a, b}  # <--\n"),
        "spec.command",
        "!!set is not allowed",
    ),
    one(
        "resource-version-not-a-number",
        HEAD + 'kind: Job\nmetadata:\n  name: base\n  resourceVersion: "abc"  # <--\nspec: {command: ["true"]}\n',
        "metadata.resourceVersion",
        "invalid resourceVersion",
    ),
    one("nul-in-shell", job('  shell: "echo a\\0b"  # <--\n'), "spec.shell", "NUL byte"),
    one("nul-in-command", job('  command: ["echo", "a\\0b"]  # <--\n'), "spec.command[1]", "NUL byte"),
    one("nul-in-env-value", job('  command: ["true"]\n  env:  # <--\n    A: "x\\0y"\n'), "spec.env", "NUL byte"),
    one(
        "nul-in-working-dir", job('  command: ["true"]\n  workingDir: "/tmp/a\\0b"  # <--\n'), "spec.workingDir", "NUL"
    ),
    one(
        "nul-in-wait-path",
        job('  command: ["true"]\n  waitFor:\n    conditions:\n    - path: "/tmp/\\0"  # <--\n'),
        "spec.waitFor.conditions[0].path",
        "NUL byte",
    ),
]


# --- the store and its dump --------------------------------------------------------------


def dump(db: Path) -> dict[str, list[tuple]]:
    """Every row of every table, in a stable order."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {t: sorted(conn.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables}
    finally:
        conn.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """(url, db path): a store holding BASE, shared by every case of this module."""
    root = tmp_path_factory.mktemp("invalid-store")
    db = root / "state" / "state.db"
    url = f"sqlite:///{db}"
    (root / "base.yaml").write_text(BASE)
    result = cli("apply", "-f", str(root / "base.yaml"), store=url)
    assert result.code == 0, result.stderr
    assert dump(db)["objects"], "the store was not populated"
    return url, db


def write_case(case: Case, root: Path) -> Path:
    """The case's files under root/ID; returns what to pass to -f (the file, or the folder)."""
    folder = root / case.id
    folder.mkdir()
    for name, content in case.files.items():
        target = folder / name
        target.write_bytes(content) if isinstance(content, bytes) else target.write_text(content)
    return folder / case.file if len(case.files) == 1 else folder


def expected_line(case: Case) -> int:
    if case.line is not None:
        return case.line
    text = case.files[case.file]
    assert isinstance(text, str)
    marked = [i for i, line in enumerate(text.splitlines(), 1) if MARK in line]
    assert len(marked) == 1, f"case {case.id} must mark exactly one line with {MARK!r}"
    return marked[0]


def where_pattern(file: str, line: int, path: str | None) -> re.Pattern:
    """A stderr line `[error: ]FILE:LINE: PATH: ...` (or `FILE:LINE: ...` without a path)."""
    head = re.escape(f"{file}:{line}: ") + (re.escape(f"{path}: ") if path else "")
    return re.compile(rf"^(error: )?{head}", re.MULTILINE)


def assert_refused(result, *, file: str, line: int, path: str | None, message: str, extra=()) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.code == 2, f"exit {result.code}, stderr: {result.stderr}"
    assert result.stdout == "", f"stdout must be empty, got: {result.stdout!r}"
    assert where_pattern(file, line, path).search(result.stderr), (
        f"expected a line starting with {file}:{line}: {path or ''}\n--- stderr:\n{result.stderr}"
    )
    assert message.lower() in result.stderr.lower(), f"expected {message!r} in:\n{result.stderr}"
    for fragment in extra:
        assert fragment in result.stderr, f"expected {fragment!r} in:\n{result.stderr}"


def test_cases_are_many_and_distinct():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(CASES) >= 45


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_invalid_manifest_is_refused(case: Case, store, tmp_path):
    url, db = store
    target = write_case(case, tmp_path)
    before = dump(db)
    result = cli("apply", "-f", str(target), store=url)
    assert_refused(
        result,
        file=str(tmp_path / case.id / case.file),
        line=expected_line(case),
        path=case.path,
        message=case.message,
        extra=case.extra,
    )
    assert dump(db) == before, "the store changed"


def test_dry_run_refuses_the_same_way(store, tmp_path):
    url, db = store
    case = next(c for c in CASES if c.id == "enum-backoff-policy")
    target = write_case(case, tmp_path)
    before = dump(db)
    result = cli("apply", "--dry-run", "-f", str(target), store=url)
    assert_refused(result, file=str(target), line=expected_line(case), path=case.path, message=case.message)
    assert dump(db) == before


def test_diff_refuses_the_same_way(store, tmp_path):
    url, db = store
    case = next(c for c in CASES if c.id == "cycle-of-3")
    target = write_case(case, tmp_path)
    before = dump(db)
    result = cli("diff", "-f", str(target), store=url)
    assert_refused(result, file=str(target), line=expected_line(case), path=case.path, message=case.message)
    assert dump(db) == before


GOOD_JOB = job('  command: ["true"]\n  pool: analysis\n', name="good-{n}")


def test_folder_with_one_bad_file_stores_nothing(store, tmp_path):
    """All objects of one apply are validated before any is stored."""
    url, db = store
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "a-pool.yaml").write_text(HEAD + "kind: Pool\nmetadata: {name: fresh}\nspec: {slots: 3}\n")
    for n in (1, 2):
        (folder / f"b-good-{n}.yaml").write_text(GOOD_JOB.format(n=n))
    bad = folder / "c-bad.yaml"
    bad.write_text(job('  command: ["true"]\n  retry:\n    backoff:\n      policy: sometimes\n'))
    (folder / "d-good.yaml").write_text(GOOD_JOB.format(n=3))
    (folder / "notes.txt").write_text("not a manifest: ignored\n")
    before = dump(db)
    result = cli("apply", "-f", str(folder), store=url)
    assert_refused(result, file=str(bad), line=9, path="spec.retry.backoff.policy", message="exponential")
    for good in ("a-pool.yaml", "b-good-1.yaml", "b-good-2.yaml", "d-good.yaml"):
        assert good not in result.stderr
    assert dump(db) == before
    assert cli("get", "jobs", "good-1", store=url).code == 3
    assert cli("get", "pools", "fresh", store=url).code == 3


def test_every_problem_of_a_folder_is_reported_at_once(store, tmp_path):
    url, db = store
    folder = tmp_path / "two-bad"
    folder.mkdir()
    (folder / "one.yaml").write_text(job('  command: ["true"]\n  slots: 0\n', name="one"))
    (folder / "two.yaml").write_text(job('  command: ["true"]\n  type: cron\n', name="two"))
    before = dump(db)
    result = cli("apply", "-f", str(folder), store=url)
    assert result.code == 2 and result.stdout == "" and "Traceback" not in result.stderr
    assert where_pattern(str(folder / "one.yaml"), 7, "spec.slots").search(result.stderr), result.stderr
    assert where_pattern(str(folder / "two.yaml"), 7, "spec.type").search(result.stderr), result.stderr
    assert dump(db) == before


def test_yaml_schema_and_reference_problems_are_reported_in_one_round(store, tmp_path):
    """Not YAML errors first, then schema errors on the next try, then references: every
    problem of the apply at once, in file and line order. A reference to a document that
    was refused is not also called missing: its own problem is reported."""
    url, db = store
    folder = tmp_path / "rounds"
    folder.mkdir()
    (folder / "a-yaml.yaml").write_text(job("  command: [echo, hi\n  slots: 1\n", name="syntax"))
    (folder / "b-schema.yaml").write_text(job('  command: ["true"]\n  type: cron\n', name="schema"))
    (folder / "c-refs.yaml").write_text(
        job('  command: ["true"]\n  dependsOn: [nowhere]\n', name="refs")
        + "---\n"
        + job('  command: ["true"]\n  dependsOn: [schema]\n', name="on-refused")
    )
    before = dump(db)
    result = cli("apply", "-f", str(folder), store=url)
    assert result.code == 2 and result.stdout == "", result
    lines = result.stderr.splitlines()
    assert len(lines) == 3, result.stderr
    assert "a-yaml.yaml" in lines[0] and "invalid YAML" in lines[0]
    assert where_pattern(str(folder / "b-schema.yaml"), 7, "spec.type").search(lines[1])
    assert where_pattern(str(folder / "c-refs.yaml"), 7, "spec.dependsOn[0].job").search(lines[2])
    assert "'nowhere' does not exist" in lines[2]
    assert dump(db) == before


def test_recursive_folder_reports_the_nested_bad_file(store, tmp_path):
    url, db = store
    nested = tmp_path / "tree" / "team-a" / "jobs"
    nested.mkdir(parents=True)
    (tmp_path / "tree" / "ok.yaml").write_text(GOOD_JOB.format(n=9))
    bad = nested / "bad.yml"
    bad.write_text(job('  command: ["true"]\n  dependsOn: [ghost]\n'))
    before = dump(db)
    result = cli("apply", "-R", "-f", str(tmp_path / "tree"), store=url)
    assert_refused(result, file=str(bad), line=7, path="spec.dependsOn[0].job", message="'ghost' does not exist")
    assert dump(db) == before


def test_stdin_errors_name_stdin_and_the_line(store):
    url, db = store
    text = job('  command: ["true"]\n', name="fine") + "---\n" + job('  command: ["true"]\n  timeout: 10\n')
    before = dump(db)
    result = cli("apply", "-f", "-", store=url, input=text)
    assert_refused(result, file="<stdin>", line=14, path="spec.timeout", message="duration")
    assert dump(db) == before


def test_stdin_yaml_syntax_error(store):
    url, db = store
    before = dump(db)
    result = cli("apply", "-f", "-", store=url, input=HEAD + "kind: Job\nmetadata: {name: x\nspec: {}\n")
    assert result.code == 2 and result.stdout == "" and "Traceback" not in result.stderr
    assert re.search(r"^(error: )?<stdin>:\d+: invalid YAML", result.stderr, re.MULTILINE), result.stderr
    assert dump(db) == before


def test_missing_path_is_invalid_input(store, tmp_path):
    url, db = store
    before = dump(db)
    result = cli("apply", "-f", str(tmp_path / "nowhere"), store=url)
    assert result.code == 2 and result.stdout == "" and "Traceback" not in result.stderr
    assert str(tmp_path / "nowhere") in result.stderr
    assert dump(db) == before


def test_empty_folder_is_invalid_input(store, tmp_path):
    url, _db = store
    (tmp_path / "empty").mkdir()
    result = cli("apply", "-f", str(tmp_path / "empty"), store=url)
    assert result.code == 2 and result.stdout == "" and "Traceback" not in result.stderr
    assert "no *.yaml" in result.stderr


# --- the in-process runner agrees with the real console script ------------------------------


@pytest.mark.parametrize("case_id", ["unknown-in-backoff", "alias-bomb"])
def test_subprocess_cli_gives_the_same_answer(case_id, store, tmp_path):
    url, db = store
    case = next(c for c in CASES if c.id == case_id)
    target = write_case(case, tmp_path)
    before = dump(db)
    real = run_cli("apply", "-f", str(target), store=url)
    assert_refused(
        real,
        file=str(tmp_path / case.id / case.file),
        line=expected_line(case),
        path=case.path,
        message=case.message,
        extra=case.extra,
    )
    assert (real.code, real.stdout, real.stderr) == tuple(vars(cli("apply", "-f", str(target), store=url)).values())
    assert dump(db) == before


def test_subprocess_stdin_error(store):
    url, db = store
    before = dump(db)
    result = run_cli("apply", "-f", "-", store=url, input=job('  command: ["true"]\n  type: daemon\n'))
    assert_refused(result, file="<stdin>", line=7, path="spec.type", message="run, service")
    assert dump(db) == before
