"""Lines named by checks that run after loading (references, cycles, conflicts): a manifest
keeps no YAML nodes, and composes its document again when a message needs a line in it.
These must name the same lines as if the nodes had been kept, in any document of a stream."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from reconciler.api.kinds import KINDS
from reconciler.manifests import Loader, Manifest, load, parse_text
from reconciler.problems import locate
from tests.data.inprocess import cli

JOB = """apiVersion: reconciler.dev/v1alpha1
kind: Job
metadata:
  name: {name}
spec:
  command: ["true"]
  dependsOn:
  - {first}
  - {dep}
"""
BASE = 'apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {name: ok-1}\nspec: {command: ["true"]}\n'

# an empty document, a comment-only one and a null one stand between the jobs
STREAM = (
    BASE
    + "---\n---\n# only a comment\n---\nnull\n---\n"
    + JOB.format(name="ok-2", first="ok-1", dep="ok-1")
    + "---\n"
    + JOB.format(name="bad", first="ok-2", dep="missing")
)


def eager_nodes(text: str) -> list[yaml.Node]:
    """The non-null documents' nodes, as the plain safe loader composes them."""
    return [n for n in yaml.compose_all(text, Loader=Loader) if not n.tag.endswith(":null")]


def test_where_matches_the_nodes_composed_at_once(tmp_path):
    manifests, problems = parse_text(STREAM, "s.yaml", tmp_path)
    assert problems == [] and [m.name for m in manifests] == ["ok-1", "ok-2", "bad"]
    for m, node in zip(manifests, eager_nodes(STREAM), strict=True):
        assert m.line == node.start_mark.line + 1
        for path in (("metadata", "name"), ("spec", "dependsOn", 1, "job"), ("spec", "nothing"), ()):
            assert m.where(*path).split(":")[:2] == ["s.yaml", str(locate(node, path))]


def test_a_later_syntax_error_does_not_hide_the_lines_before_it(tmp_path):
    text = JOB.format(name="first", first="a", dep="b") + "---\nkey: [unclosed\n"
    manifests, problems = parse_text(text, "s.yaml", tmp_path)
    assert [m.name for m in manifests] == ["first"] and problems and "invalid YAML" in problems[0]
    assert manifests[0].where("spec", "dependsOn", 1) == "s.yaml:9: spec.dependsOn[1]"


def test_a_manifest_may_still_be_given_its_node():
    text = JOB.format(name="given", first="a", dep="b")
    job = parse_text(text, "g.yaml", Path("/"))[0][0].obj
    m = Manifest(KINDS["Job"], job, "run", yaml.compose(text))
    assert m.line == 1 and m.where("spec", "command") == "run:6: spec.command"


def test_missing_dependency_in_a_later_document_names_its_line(sqlite_url, tmp_path):
    f = tmp_path / "stream.yaml"
    f.write_text(STREAM)
    result = cli("apply", "-f", str(f), store=sqlite_url)
    bad_line = STREAM.splitlines().index("  - missing") + 1
    assert (result.code, result.stdout) == (2, ""), result
    assert result.stderr == (
        f"error: {f}:{bad_line}: spec.dependsOn[1].job: job 'missing' does not exist "
        "(neither stored nor in this apply)\n"
    )


@pytest.mark.parametrize("files", [1, 3])
def test_loaded_manifests_keep_no_nodes(tmp_path, files):
    for i in range(files):
        (tmp_path / f"f{i}.yaml").write_text(JOB.format(name=f"j{i}", first="j0", dep="j0"))
    manifests = load([str(tmp_path)])
    assert [m._node for m in manifests] == [None] * files  # composed only when a line is asked for
    assert manifests[-1].where("spec", "dependsOn", 1) == f"{tmp_path / f'f{files - 1}.yaml'}:9: spec.dependsOn[1]"


def test_working_dirs_of_one_file_resolve_each_on_its_own(tmp_path, monkeypatch):
    """Answers are remembered per file: equal spellings agree, different ones do not mix."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    given = ["work", None, "work", "/abs/x/../y", "~/w", "work/../other", None]
    text = "---\n".join(
        f"apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {{name: w{i}}}\nspec:\n  command: [x]\n"
        + (f"  workingDir: {wd}\n" if wd is not None else "")
        for i, wd in enumerate(given)
    )
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "w.yaml").write_text(text)
    (tmp_path / "w.yaml").write_text(text)
    for folder in (tmp_path / "sub", tmp_path):
        dirs = [m.obj.spec.working_dir for m in load([str(folder / "w.yaml")])]
        real = os.path.realpath(folder)  # stored as the folder's real path
        assert dirs == [f"{real}/work", real, f"{real}/work", "/abs/y", f"{tmp_path}/home/w", f"{real}/other", real]
