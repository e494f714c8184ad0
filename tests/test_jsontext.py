"""The canonical spelling (jsontext.canonical): one text per value, ASCII, keys sorted, and
the very text json.dumps(sort_keys=True) gives for every document a spec can be, so that a
spec stored before orjson spelled it reads as unchanged."""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from reconciler.api.kinds import KINDS
from reconciler.api.node import NodeSpec
from reconciler.api.pool import PoolSpec
from reconciler.jsontext import canonical, parse

# every value JSON can hold: any text (outside ASCII, DEL, control characters), ints past 64
# bits, floats of every magnitude
_leaves = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
documents = st.recursive(_leaves, lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=30)


def _json_dumps(document: Any) -> str:
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def _floats(document: Any) -> list[float]:
    if isinstance(document, float):
        return [document]
    if isinstance(document, dict):
        return [f for v in document.values() for f in _floats(v)]
    if isinstance(document, list):
        return [f for v in document for f in _floats(v)]
    return []


@given(documents)
def test_the_text_is_ascii_and_reads_back_as_the_document(document: Any) -> None:
    text = canonical(document)
    assert text.isascii()
    assert json.loads(text) == document


@given(documents)
def test_without_a_float_below_1e_4_the_text_is_json_dumps_sorted(document: Any) -> None:
    if all(f == 0 or abs(f) >= 1e-4 for f in _floats(document)):
        assert canonical(document) == _json_dumps(document)


@given(st.dictionaries(st.text(), _leaves))
def test_equal_mappings_built_in_any_order_spell_alike(mapping: dict[str, Any]) -> None:
    assert canonical(dict(reversed(list(mapping.items())))) == canonical(mapping)


def test_what_only_json_can_spell_is_spelled_by_json() -> None:
    for document in ({"n": 2**70}, {2: "int keys", 1: "as text"}, {"s": "caf\u00e9\u2028\x7f", "f": 1e-05}):
        assert canonical(document) == _json_dumps(document)

    class Name(str):
        pass

    assert canonical({Name("a"): Name("b")}) == '{"a":"b"}'


def test_what_neither_can_spell_raises_type_error() -> None:
    for bad in ({"a": object()}, {1: "x", "b": "y"}):
        with pytest.raises(TypeError):
            canonical(bad)


def test_nan_and_infinity_which_no_model_lets_through_are_null() -> None:
    """json would write NaN, which is not JSON (PostgreSQL's jsonb refuses it)."""
    assert canonical({"a": float("nan"), "b": [float("inf"), -float("inf")]}) == '{"a":null,"b":[null,null]}'


def _numbers(schema: Any, defs: dict[str, Any], seen: set[str]) -> list[dict[str, Any]]:
    """Every `number` in a JSON Schema, following its references once each."""
    found = []
    if isinstance(schema, dict):
        if (ref := schema.get("$ref")) is not None and ref not in seen:
            seen.add(ref)
            found += _numbers(defs[ref.rsplit("/", 1)[1]], defs, seen)
        if schema.get("type") == "number":
            found.append(schema)
        for key, value in schema.items():
            if key != "$defs":
                found += _numbers(value, defs, seen)
    elif isinstance(schema, list):
        for value in schema:
            found += _numbers(value, defs, seen)
    return found


def test_no_spec_of_any_kind_can_hold_a_float_that_json_spells_otherwise() -> None:
    """What makes the spelling of a stored spec the same as before: a float of a spec is
    bounded below by 1e-4 (or is a whole number), never NaN or infinite."""
    for info in KINDS.values():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # defaults the schema cannot show
            schema = info.model.model_json_schema(by_alias=True, mode="serialization")
        spec = schema["properties"]["spec"]
        for number in _numbers(spec, schema.get("$defs", {}), set()):
            low = number.get("minimum", number.get("exclusiveMinimum"))
            assert low is not None and low >= 1e-4, f"{info.kind}: a spec float not bounded below by 1e-4: {number}"


# what a stored status or node document holds: integers within 64 bits (the system's own, or an
# agent's report bounded by wire.Int64), floats of every kind json spells, any text
_stored_leaves = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.text(st.characters(codec="utf-8"))
)
stored = st.recursive(_stored_leaves, lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=30)


def _spelled(value: Any) -> str:
    """A value's full spelling: an int and its float, NaN and NaN, tell apart and match."""
    return json.dumps(value, sort_keys=True)


@given(stored, st.booleans())
def test_parse_reads_a_stored_document_as_json_loads_does(document: Any, ascii_only: bool) -> None:
    for text in (json.dumps(document, ensure_ascii=ascii_only), canonical(document)):
        assert _spelled(parse(text)) == _spelled(json.loads(text))


@pytest.mark.parametrize("text", ["NaN", "[Infinity, -Infinity]", "1e400", '"\\ud800"', '{"a": "\\udfff x"}'])
def test_what_orjson_refuses_parse_reads_as_json_does(text: str) -> None:
    assert _spelled(parse(text)) == _spelled(json.loads(text))
    assert _spelled(parse(text.encode())) == _spelled(json.loads(text))


def test_text_that_is_not_json_is_refused_as_json_refuses_it() -> None:
    for text in ("", "{", "[1,]", "{'a': 1}"):
        with pytest.raises(json.JSONDecodeError):
            parse(text)


def test_orjson_reads_an_integer_past_64_bits_as_a_float_which_no_stored_status_holds() -> None:
    """The one difference parse leaves (wire.Int64 and read_exit keep such integers out of a
    status): held here so that an orjson that reads them otherwise is noticed."""
    assert parse("18446744073709551615") == 2**64 - 1 and isinstance(parse("18446744073709551615"), int)
    assert isinstance(parse("18446744073709551616"), float)


def _integer_paths(schema: Any, defs: dict[str, Any], path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The property paths of a JSON Schema (an object's, following references) where an integer
    is allowed."""
    if (ref := schema.get("$ref")) is not None:
        return _integer_paths(defs[ref.rsplit("/", 1)[1]], defs, path)
    found = [path] if schema.get("type") == "integer" else []
    for branch in schema.get("anyOf", []):
        found += [p for p in _integer_paths(branch, defs, path) if p not in found]
    for name, sub in schema.get("properties", {}).items():
        found += _integer_paths(sub, defs, (*path, name))
    return found


@pytest.mark.parametrize("model", [PoolSpec, NodeSpec], ids=lambda m: m.__name__)
def test_a_pool_or_node_spec_read_by_parse_holds_no_integer_past_64_bits(model: Any) -> None:
    """The store reads Pools' and Nodes' specs with parse (scheduling's facts): every integer
    they can hold is bounded, so none reads back as a float."""
    schema = model.model_json_schema(by_alias=True)
    paths = _integer_paths(schema, schema.get("$defs", {}))
    assert paths  # slots at least
    for path in paths:
        document: Any = 2**64
        for name in reversed(path):
            document = {name: document}
        with pytest.raises(ValidationError):
            model.model_validate(document)
