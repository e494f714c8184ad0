"""A Source's shortcut for the seed's plainest request (messages.Drafter) drafts exactly the job
the long way drafts: the same refusal, naming the same field, or the same job, field for field,
with the same spec as stored. Held for templates and requests generated at random, valid or
not, and shown to be taken for the requests it is for (else the equality would hold vacuously)."""

from __future__ import annotations

import string
from pathlib import Path

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.api.meta import dump
from reconciler.controller.messages import Draft, Drafter, draft

BASE_DIR = Path("/srv/inbox")
NAMES = st.text(string.ascii_letters + "_", min_size=1, max_size=6)
ODD_TEXT = st.one_of(st.text(max_size=12), st.sampled_from(["", "\0", "a\0b", "A=B", "é", "$(x)", " "]))
LABELS = st.dictionaries(st.sampled_from(["tier", "team", "app.kubernetes.io/name"]), st.sampled_from(["a", "b"]))

TEMPLATE_FIELDS = {
    "suspend": st.booleans(),
    "env": st.dictionaries(st.one_of(NAMES, ODD_TEXT), st.one_of(NAMES, ODD_TEXT), max_size=3),
    "labels": LABELS,
    "annotations": st.dictionaries(st.sampled_from(["note", "reconciler.dev/created-by"]), st.just("x")),
    "timeout": st.sampled_from(["1m", "2h", "0s", "soon"]),
    "runTimeout": st.sampled_from(["30s", "5m"]),
    "type": st.sampled_from(["run", "service"]),
    "port": st.sampled_from([8080, 0]),
    "priority": st.integers(-5, 5),
    "slots": st.integers(0, 3),
    "pool": st.sampled_from(["gpu", "global", "Bad_Pool"]),
    "retry": st.fixed_dictionaries({"limit": st.integers(-1, 3)}),
    "workingDir": st.sampled_from(["sub", "/abs/dir", "../up", "~", "~/x"]),
    "resources": st.fixed_dictionaries({"cpu": st.sampled_from(["2", "500m"])}),
    "artifact": st.fixed_dictionaries({"url": st.just("http://files.local/a.zip")}),
    "stopGracePeriod": st.just("3s"),
}
TEMPLATES = st.fixed_dictionaries({}, optional=TEMPLATE_FIELDS)

REQUEST_FIELDS = {
    "command": st.one_of(ODD_TEXT, st.integers(-(2**63), 2**63 - 1)),
    "env_vars": st.one_of(st.dictionaries(st.one_of(NAMES, ODD_TEXT), ODD_TEXT, max_size=3), st.just(5)),
    "job_type": st.sampled_from(["run", "service", "batch"]),
    "port": st.one_of(st.none(), st.sampled_from([8080, "x"])),
    "deploy_url": st.sampled_from(["", "http://files.local/b.zip"]),
    "instance_id": st.sampled_from(["", "worker-1"]),
    "unknown": st.just("ignored"),
}
# what the shortcut is for: a command (no NUL) and perhaps environment variables JobSpec accepts
PLAIN_REQUESTS = st.fixed_dictionaries(
    {"command": st.text(min_size=1, max_size=20).filter(lambda c: "\0" not in c)},
    optional={"env_vars": st.dictionaries(NAMES, st.text(max_size=8).filter(lambda v: "\0" not in v), max_size=3)},
)
# half of them plain: the shortcut is taken often enough to be held to the long way
REQUESTS = st.one_of(PLAIN_REQUESTS, st.fixed_dictionaries({}, optional=REQUEST_FIELDS))
# every template field with values a Source accepts: each is seen under the shortcut
VALID_TEMPLATES = st.fixed_dictionaries(
    {},
    optional={
        **{k: TEMPLATE_FIELDS[k] for k in ("suspend", "labels", "priority", "resources", "artifact")},
        "env": st.dictionaries(NAMES, NAMES, max_size=2),
        "annotations": st.dictionaries(st.sampled_from(["note", "owner"]), st.just("x")),
        "timeout": st.sampled_from(["1m", "2h"]),
        "runTimeout": st.sampled_from(["30s", "5m"]),
        "stopGracePeriod": st.just("3s"),
        "retry": st.fixed_dictionaries({"limit": st.integers(0, 3)}),
        "workingDir": st.sampled_from(["sub", "/abs/dir", "sub/../other"]),
        "pool": st.just("gpu"),
        "slots": st.integers(1, 3),
        "type": st.just("run"),
    },
).filter(lambda t: not ("artifact" in t and t.get("workingDir", "").startswith("/")))  # relative to the artifact


def assert_same(quick: Draft, long: Draft) -> None:
    assert (quick.problem, quick.named) == (long.problem, long.named)
    assert (quick.job is None) == (long.job is None)
    if long.job is None or quick.job is None:
        return
    assert quick.job.model_dump() == long.job.model_dump()
    assert dump(quick.job) == dump(long.job)
    assert quick.job.model_fields_set == long.job.model_fields_set
    assert quick.job.spec.model_fields_set == long.job.spec.model_fields_set
    stored = quick.spec if quick.spec is not None else dump(quick.job.spec)
    assert stored == dump(long.job.spec)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(template=TEMPLATES, request=REQUESTS)
def test_the_shortcut_drafts_what_the_long_way_drafts(template, request):
    body = orjson.dumps(request)
    assert_same(Drafter(template, BASE_DIR).draft(body), draft(body, template, base_dir=BASE_DIR))


@settings(max_examples=300, deadline=None)
@given(template=VALID_TEMPLATES, request=PLAIN_REQUESTS)
def test_a_plain_request_takes_the_shortcut(template, request):
    drafter = Drafter(template, BASE_DIR)
    quick = drafter.shortcut(request)
    assert quick is not None and quick.job is not None and quick.spec is not None
    assert_same(quick, draft(orjson.dumps(request), template, base_dir=BASE_DIR))


def test_the_jobs_of_the_shortcut_are_their_own():
    """The template's job is shared underneath; each draft's own fields are its own."""
    drafter = Drafter({"env": {"A": "1"}, "suspend": True}, BASE_DIR)
    one = drafter.draft(b'{"command": "echo 1", "env_vars": {"B": "1"}}')
    two = drafter.draft(b'{"command": "echo 2"}')
    assert one.job is not None and two.job is not None
    assert (one.job.spec.shell, one.job.spec.env) == ("echo 1", {"A": "1", "B": "1"})
    assert (two.job.spec.shell, two.job.spec.env) == ("echo 2", {"A": "1"})
    assert one.spec is not None and two.spec is not None
    assert (one.spec["env"], two.spec["env"]) == ({"A": "1", "B": "1"}, {"A": "1"})


def test_what_the_shortcut_is_not_for_goes_the_long_way():
    drafter = Drafter({}, BASE_DIR)
    for request in (
        {"command": "a\0b"},
        {"command": "x", "env_vars": {"A=B": "1"}},
        {"command": "x", "job_type": "run"},
        {"command": "x", "instance_id": "worker-1"},
        {"command": "x", "deploy_url": "http://files.local/b.zip"},
        {"command": ""},
    ):
        assert drafter.shortcut(request) is None, request
    assert Drafter({"workingDir": "~/jobs"}, BASE_DIR).shortcut({"command": "x"}) is None  # $HOME per message
    assert Drafter({"pool": "global"}, BASE_DIR).shortcut({"command": "x"}) is None  # the template's own is refused
