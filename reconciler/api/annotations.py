"""Annotations that are part of the contract: how users and verbs ask the controller for an
action, and how objects say who made them (the Kubernetes way: intent as metadata)."""

from __future__ import annotations

SYSTEM_PREFIX = "reconciler.dev/"  # annotations under it are the system's, kept across applies

CANCEL = "reconciler.dev/cancel-revision"  # value: the revision to cancel
CANCEL_REASON = "reconciler.dev/cancel-reason"  # value: who or what asked (the job's message says it)
RERUN = "reconciler.dev/rerun"  # value: a token; a new token asks for a new revision
DOWNSTREAM_SUFFIX = ";downstream"  # on the rerun token: dependents run again after it too
MANAGED_BY = "reconciler.dev/managed-by"  # "apply" marks objects that `apply --prune` may delete
CREATED_BY = "reconciler.dev/created-by"  # "run" for jobs made by `reconciler run`


def user_annotations(annotations: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in annotations.items() if not k.startswith(SYSTEM_PREFIX)}


def system_annotations(annotations: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in annotations.items() if k.startswith(SYSTEM_PREFIX)}
