"""Dependency receipts (API.md section 2). Pure: given what is known of each dependency now
and the receipts already written, decide: satisfied, still pending, or never satisfiable.
A receipt, once written, is never rewritten for the same revision of the dependent."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..api.job import Dependency


@dataclass(frozen=True)
class DepState:
    uid: str
    revision: int
    phase: str
    outcome: str | None
    propagates: bool = True  # does this revision make dependents that consumed an older one run again


@dataclass
class Verdict:
    receipts: list[dict[str, Any]]
    satisfied: bool
    broken: dict[str, Any] | None = None  # the receipt that can never be satisfied
    pending: list[str] = field(default_factory=list)


def evaluate(
    deps: list[Dependency], observed: dict[str, DepState | None], receipts: list[dict[str, Any]], now_text: str
) -> Verdict:
    by_job = {r["job"]: r for r in receipts}
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    broken = None
    for dep in deps:
        receipt = by_job.get(dep.job)
        if receipt is None:
            state = observed.get(dep.job)
            if state is None:
                receipt = {
                    "job": dep.job,
                    "satisfied": False,
                    "observedAt": now_text,
                    "outcome": None,
                    "message": "the job no longer exists",
                }
            elif state.phase == "Completed" and state.outcome is not None:
                receipt = {
                    "job": dep.job,
                    "uid": state.uid,
                    "revision": state.revision,
                    "outcome": state.outcome,
                    "satisfied": dep.satisfied_by(state.outcome),
                    "observedAt": now_text,
                }
        if receipt is None:
            pending.append(dep.job)
            continue
        out.append({k: v for k, v in receipt.items() if k != "message"})
        if not receipt["satisfied"] and broken is None:
            broken = receipt
    return Verdict(out, satisfied=not pending and broken is None, broken=broken, pending=pending)


def describe_broken(receipt: dict[str, Any], deps: list[Dependency]) -> str:
    need = next((d.outcomes for d in deps if d.job == receipt["job"]), [])
    if receipt.get("outcome") is None:
        return f"dependency {receipt['job']} no longer exists"
    return (
        f"dependency {receipt['job']} ended {receipt['outcome']} at revision {receipt.get('revision')}, "
        f"which can never satisfy {'/'.join(need)}"
    )
