"""Dependency receipts (API.md section 2). Pure: given what is known of each dependency now
and the receipts already written, decide: satisfied, still pending, or never satisfiable.
A receipt, once written, is never rewritten for the same revision of the dependent."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..api.job import Dependency
from ..api.revisions import DepState
from ..api.status import Phase, ReceiptDict

__all__ = ["DepState", "Verdict", "describe_broken", "evaluate"]


@dataclass
class Verdict:
    receipts: list[ReceiptDict]
    satisfied: bool
    broken: ReceiptDict | None = None  # the receipt that can never be satisfied
    pending: list[str] = field(default_factory=list)


def evaluate(
    deps: list[Dependency], observed: Mapping[str, DepState | None], receipts: list[ReceiptDict], now_text: str
) -> Verdict:
    by_job = {r["job"]: r for r in receipts}
    out: list[ReceiptDict] = []
    pending: list[str] = []
    broken: ReceiptDict | None = None
    for dep in deps:
        receipt = by_job.get(dep.job)
        if receipt is None:
            state = observed.get(dep.job)
            if state is None:  # gone: a receipt with no outcome, which satisfies nothing
                receipt = {"job": dep.job, "satisfied": False, "observedAt": now_text, "outcome": None}
            elif state.phase == Phase.COMPLETED and state.outcome is not None:
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
        out.append(receipt)
        if not receipt["satisfied"] and broken is None:
            broken = receipt
    return Verdict(out, satisfied=not pending and broken is None, broken=broken, pending=pending)


def describe_broken(receipt: ReceiptDict, deps: list[Dependency]) -> str:
    need = next((d.outcomes for d in deps if d.job == receipt["job"]), [])
    if receipt.get("outcome") is None:
        return f"dependency {receipt['job']} no longer exists"
    return (
        f"dependency {receipt['job']} ended {receipt['outcome']} at revision {receipt.get('revision')}, "
        f"which can never satisfy {'/'.join(need)}"
    )
