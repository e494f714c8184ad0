"""reconciler/selectors.py: Kubernetes label selectors, parsed and matched (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.errors import InvalidInput
from reconciler.selectors import Requirement, matches, parse

R = Requirement

PARSE_CASES = [
    ("a=b", [R("a", "in", frozenset({"b"}))]),
    ("a==b", [R("a", "in", frozenset({"b"}))]),
    ("a!=b", [R("a", "notin", frozenset({"b"}))]),
    ("a = b", [R("a", "in", frozenset({"b"}))]),
    ("a=", [R("a", "in", frozenset({""}))]),
    ("a in (x,y)", [R("a", "in", frozenset({"x", "y"}))]),
    ("a in ( x , y )", [R("a", "in", frozenset({"x", "y"}))]),
    ("a notin (x)", [R("a", "notin", frozenset({"x"}))]),
    ("a", [R("a", "exists")]),
    ("!a", [R("a", "!exists")]),
    ("! a", [R("a", "!exists")]),
    ("example.com/app=web", [R("example.com/app", "in", frozenset({"web"}))]),
    ("app.kubernetes.io/name", [R("app.kubernetes.io/name", "exists")]),
    ("a=b,c!=d", [R("a", "in", frozenset({"b"})), R("c", "notin", frozenset({"d"}))]),
    ("a in (x,y),!b,c", [R("a", "in", frozenset({"x", "y"})), R("b", "!exists"), R("c", "exists")]),
    (
        "tier=web, env in (prod,staging)",
        [R("tier", "in", frozenset({"web"})), R("env", "in", frozenset({"prod", "staging"}))],
    ),
    ("v=1.2-rc_3", [R("v", "in", frozenset({"1.2-rc_3"}))]),
]


@pytest.mark.parametrize("text,expected", PARSE_CASES, ids=[t for t, _ in PARSE_CASES])
def test_parse(text, expected):
    assert parse(text) == expected


INVALID = [
    "",
    " , ",
    "a in (x",
    "a in x",
    "a notin",
    "=b",
    "a=b=c",
    "a b",
    "a=b c",
    "a ~ b",
    "!",
    "!a=b",
    "a in (x),(y)",
    "a>1",
]


@pytest.mark.parametrize("text", INVALID, ids=[repr(t) for t in INVALID])
def test_parse_refuses(text):
    with pytest.raises(InvalidInput) as info:
        parse(text)
    assert "selector" in str(info.value)


@pytest.mark.parametrize("text", ["a in ()", "a notin ()"])
def test_empty_value_sets_are_refused(text):
    """Kubernetes refuses `in`/`notin` with no values ("values set can't be empty"): `a notin ()`
    would otherwise silently select everything, and `a in ()` nothing."""
    with pytest.raises(InvalidInput):
        parse(text)


LABELS = {"tier": "web", "env": "prod", "empty": ""}
MATCH_CASES = [
    ("tier=web", True),
    ("tier=db", False),
    ("tier!=db", True),
    ("tier!=web", False),
    ("missing!=x", True),  # != and notin match objects without the key
    ("missing notin (x)", True),
    ("missing in (x)", False),
    ("missing=x", False),
    ("tier in (db,web)", True),
    ("tier notin (db,web)", False),
    ("tier", True),
    ("!tier", False),
    ("missing", False),
    ("!missing", True),
    ("empty=", True),
    ("empty", True),
    ("missing=", False),
    ("tier=web,env=prod", True),
    ("tier=web,env=dev", False),
    ("tier=web,env=prod,!missing,missing notin (a)", True),
    ("tier=web,tier=db", False),
]


@pytest.mark.parametrize("text,expected", MATCH_CASES, ids=[t for t, _ in MATCH_CASES])
def test_matches(text, expected):
    assert matches(parse(text), LABELS) is expected


def test_matches_no_requirements_selects_everything():
    assert matches([], {}) and matches([], LABELS)


# a small vocabulary of label-syntax words, so that keys and values collide often
_value = st.sampled_from(["a", "b", "web", "db", "x-1", "y.2", "z_3"])
_key = st.one_of(_value, st.just("example.com/app"))
_labels = st.dictionaries(_key, _value, max_size=4)


@given(labels=_labels, key=_key, values=st.sets(_value, min_size=1, max_size=3))
def test_in_and_notin_are_complements(labels, key, values):
    listed = ",".join(sorted(values))
    assert matches(parse(f"{key} in ({listed})"), labels) != matches(parse(f"{key} notin ({listed})"), labels)


@given(labels=_labels, key=_key)
def test_exists_and_not_exists_are_complements(labels, key):
    assert matches(parse(key), labels) != matches(parse(f"!{key}"), labels)
    assert matches(parse(key), labels) == (key in labels)


@given(labels=_labels, key=_key, value=_value)
def test_equality_forms_agree(labels, key, value):
    eq = matches(parse(f"{key}={value}"), labels)
    assert eq == matches(parse(f"{key}=={value}"), labels) == matches(parse(f"{key} in ({value})"), labels)
    assert eq == (labels.get(key) == value)
    assert matches(parse(f"{key}!={value}"), labels) == (not eq)


@given(labels=_labels, a=_key, b=_key, va=_value, vb=_value)
def test_comma_is_and(labels, a, b, va, vb):
    both = matches(parse(f"{a}={va},{b}!={vb}"), labels)
    assert both == (matches(parse(f"{a}={va}"), labels) and matches(parse(f"{b}!={vb}"), labels))
