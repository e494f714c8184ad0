"""Annotations that are part of the contract: how users and verbs ask the controller for an
action, and how objects say who made them (the Kubernetes way: intent as metadata)."""

from __future__ import annotations

SYSTEM_PREFIX = "reconciler.dev/"  # annotations and labels under it are the system's, kept across applies
# on a Node an agent registered (the controller's for its host, or a remote agent's): the
# host's name; such a node is never pruned, whoever applied a manifest for it since
HOSTNAME_LABEL = "reconciler.dev/hostname"

CANCEL = "reconciler.dev/cancel-revision"  # value: the revision to cancel
CANCEL_REASON = "reconciler.dev/cancel-reason"  # value: who or what asked (the job's message says it)
RERUN = "reconciler.dev/rerun"  # value: a token; a new token asks for a new revision
DOWNSTREAM_SUFFIX = ";downstream"  # on the rerun token: dependents run again after it too
MANAGED_BY = "reconciler.dev/managed-by"  # "apply" marks objects that `apply --prune` may delete
# `controller --watch DIR`: "watch:" and the folder's path; its prune deletes only what it applied
APPLIED_FROM = "reconciler.dev/applied-from"
CREATED_BY = "reconciler.dev/created-by"  # "run" for jobs made by `reconciler run`, "source/NAME" from a queue
MESSAGE_ID = "reconciler.dev/message-id"  # on a job made from a queue message: the message's id (redelivery key)
# `drain --force` on a job holding slots on the node: value "RUN@NODE", the admission's run
# number and node. The operator's word that nothing of that run lives any more: the controller
# stops what is left of it and records it Lost (NodeLost). The run number scopes it: a later
# run of the job is never touched.
LOST_RUN = "reconciler.dev/lost-run"


def lost_run(annotations: dict[str, str]) -> tuple[int, str] | None:
    """(run number, node) that `drain --force` declared lost, if any."""
    number, sep, node = annotations.get(LOST_RUN, "").partition("@")
    return (int(number), node) if sep and number.isdigit() else None


def user_annotations(annotations: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in annotations.items() if not k.startswith(SYSTEM_PREFIX)}


def system_annotations(annotations: dict[str, str]) -> dict[str, str]:
    """The system's entries of annotations, or of labels."""
    return {k: v for k, v in annotations.items() if k.startswith(SYSTEM_PREFIX)}
