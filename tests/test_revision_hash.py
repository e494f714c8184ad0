"""The hash of a job's version (api/revisions.py): `spec_hash` of a stored spec's text is
`execution_hash` of the spec, whether or not it names `suspend` (which no version includes),
and equals the hash as it was first defined, so statuses written before still match."""

from __future__ import annotations

import hashlib
import json

from hypothesis import given
from hypothesis import strategies as st

from reconciler.api.revisions import execution_hash, spec_hash
from reconciler.jsontext import canonical

# floats as a spec may hold them: jsontext.canonical spells a float below 1e-4 or from 1e16 on
# as orjson does (1e-05 is 0.00001, 1e+16 is 1e16), which json would not; no spec holds one
# (its only float, a backoff factor, is 1 to 1000: see reconciler/jsontext.py)
_float = st.floats(min_value=-1e15, max_value=1e15, allow_nan=False).filter(lambda x: x == 0 or abs(x) >= 1e-4)
_leaf = st.none() | st.booleans() | st.integers() | _float | st.text()
_json = st.recursive(_leaf, lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=20)
_key = st.sampled_from(["command", "suspend", "env", "pool", "süspend", "x"]) | st.text()
_specs = st.dictionaries(_key, _json, max_size=6)


def _as_first_defined(spec: dict) -> str:
    body = json.dumps({k: v for k, v in spec.items() if k != "suspend"}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha1(body.encode(), usedforsecurity=False).hexdigest()[:16]


@given(_specs)
def test_the_hash_of_a_stored_spec_is_the_hash_of_the_spec(spec):
    expected = _as_first_defined(spec)
    assert execution_hash(spec) == expected
    assert spec_hash(canonical(spec)) == expected


def test_suspend_changes_no_version_and_a_nested_suspend_does():
    spec = {"command": ["true"], "env": {"suspend": "1"}}
    assert spec_hash(canonical({**spec, "suspend": True})) == spec_hash(canonical(spec))
    assert spec_hash(canonical(spec)) != spec_hash(canonical({"command": ["true"], "env": {"suspend": "2"}}))
