"""`reconciler explain`, through the real CLI, and its agreement with the generated CRDs."""

from __future__ import annotations

import pytest

from reconciler.api.kinds import KINDS
from reconciler.api.schema import structural_schema
from reconciler.cli.explain import explain_text, type_name
from reconciler.errors import InvalidInput
from tests.helpers import run_cli


def test_explain_job_spec_retry(sqlite_url):
    result = run_cli("explain", "job.spec.retry", store=sqlite_url)
    assert result.code == 0, result.stderr
    out = result.stdout
    assert "KIND:       Job" in out and "VERSION:    v1alpha1" in out and "GROUP:      reconciler.dev" in out
    assert "FIELD: retry <Object>" in out
    assert "DESCRIPTION:" in out and "FIELDS:" in out
    assert "  limit\t<integer>" in out and "Retries after the first run; attempts = limit + 1." in out
    assert "  onExitCodes\t<[]integer>" in out and "  backoff\t<Object>" in out
    assert result.stderr == ""


def test_explain_pool(sqlite_url):
    result = run_cli("explain", "pool", store=sqlite_url)
    assert result.code == 0, result.stderr
    assert "KIND:       Pool" in result.stdout
    assert "  metadata\t<Object> -required-" in result.stdout
    assert "  spec\t<Object>" in result.stdout and "  status\t<Object>" in result.stdout
    assert "FIELD:" not in result.stdout  # the kind itself, not one of its fields


def test_explain_leaf_with_enum_and_plural_kind(sqlite_url):
    result = run_cli("explain", "jobs.spec.retry.backoff.policy", store=sqlite_url)
    assert result.code == 0, result.stderr
    assert "FIELD: policy <string>" in result.stdout
    assert "ENUM:\n    constant\n    linear\n    exponential" in result.stdout
    assert "FIELDS:" not in result.stdout


def test_explain_unknown_field_exits_2(sqlite_url):
    result = run_cli("explain", "job.spec.retry.bogus", store=sqlite_url)
    assert result.code == 2
    assert result.stdout == ""
    assert "job.spec.retry.bogus" in result.stderr and '"bogus"' in result.stderr


def test_explain_unknown_kind_exits_2(sqlite_url):
    result = run_cli("explain", "widgets.spec", store=sqlite_url)
    assert result.code == 2 and "widgets" in result.stderr


def test_explain_recursive_lists_nested_fields():
    out = explain_text("node.spec", recursive=True)
    assert "  capacity\t<Object>\n    cpu\t<IntOrString>\n    memory\t<IntOrString>\n    slots\t<integer>" in out


def test_explain_walks_into_list_items():
    out = explain_text("job.spec.dependsOn")
    assert "FIELD: dependsOn <[]Object>" in out
    assert "  job\t<string> -required-" in out and "  outcomes\t<[]string>" in out


def _fields(node: dict, path: str):
    while node.get("type") == "array":
        node = node["items"]
    for name, sub in node.get("properties", {}).items():
        yield f"{path}.{name}", sub
        yield from _fields(sub, f"{path}.{name}")


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_schema_field_is_explained_as_in_the_crd(kind):
    """explain reads the same structural schema as the CRD: every field, its type and its text."""
    for path, node in _fields(structural_schema(KINDS[kind]), kind.lower()):
        out = explain_text(path)
        assert f"FIELD: {path.rsplit('.', 1)[1]} <{type_name(node)}>" in out, path
        first_words = " ".join(node.get("description", "<empty>").split()[:4])
        assert first_words in " ".join(out.split()), path


def test_malformed_paths_are_invalid_input():
    for path in ("job.", "job..spec", "job.spec.retry.limit.deeper"):
        with pytest.raises(InvalidInput):
            explain_text(path)
