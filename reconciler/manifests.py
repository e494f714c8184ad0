"""Reading manifests: files, folders (optionally recursive), multi-document YAML and stdin.

Every problem is reported as `FILE:LINE: FIELD.PATH: message` and raised together as one
InvalidInput, so the user fixes a whole folder in one pass and nothing is stored meanwhile."""

from __future__ import annotations

import functools
import gc
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .api.job import Job, JobSpec
from .api.kinds import KINDS, KindInfo
from .api.meta import API_VERSION
from .api.notifier import Notifier
from .errors import InvalidInput
from .problems import field_problems, locate, validation_problems
from .yamldoc import (
    MAX_NODES,
    Loader,
    ManifestLoader,
    construct,
    expanded_size,
    format_path,
    items_node,
    says_list,
    surely_small,
)

__all__ = [
    "Document",
    "Loaded",
    "Loader",
    "Manifest",
    "documents",
    "format_path",
    "invalid",
    "load",
    "locate",
    "parse_text",
    "paused_gc",
    "read",
]

MAX_FILE_BYTES = 8 * 2**20  # a manifest file larger than this is refused before parsing
MAX_PROBLEMS = 50  # beyond this the user gets the count, not the list


class _Text:
    """One file's (or stdin's) text, whose node trees are composed again only when a message
    must name a line inside a document: a large apply keeps no node alive (all of them
    together would be most of its memory, and allocating and freeing them most of its time)."""

    __slots__ = ("nodes", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.nodes: list[yaml.Node] = []

    def node(self, index: int) -> yaml.Node:
        """The `index`-th node of the stream, as `parse_text` saw it (the same loader)."""
        if index >= len(self.nodes):
            loader = ManifestLoader(self.text)
            try:
                nodes: list[yaml.Node] = []
                while len(nodes) <= index and loader.check_node():
                    nodes.append(loader.get_node())
                self.nodes = nodes
            finally:
                loader.dispose()
        return self.nodes[index]


class Manifest:
    """One validated object and where it came from, so later checks can name the line: its
    node, or the text and index to compose that node again when it is asked for."""

    __slots__ = ("_node", "_origin", "ignored_status", "kind", "line", "name", "obj", "source")

    def __init__(
        self,
        kind: KindInfo,
        obj: Any,
        source: str,
        node: yaml.Node | None = None,
        ignored_status: bool = False,
        *,
        origin: tuple[_Text, int, int, int | None] | None = None,
    ) -> None:
        self.kind = kind
        self.obj = obj  # the pydantic model of the kind
        self.source = source
        self.name: str = obj.metadata.name  # read thousands of times by apply: once here, not through pydantic
        self.ignored_status = ignored_status
        self._node = node
        # (text, index of the node in its stream, line of the document, index among a List's items)
        self._origin = origin
        self.line: int = node.start_mark.line + 1 if node is not None else origin[2] if origin is not None else 0

    def __repr__(self) -> str:
        return f"Manifest({self.kind.kind}/{self.name} at {self.source}:{self.line})"

    @property
    def node(self) -> yaml.Node:
        if self._node is None:
            text, index, _, item = self._origin  # type: ignore[misc]
            self._node = text.node(index)
            if item is not None:
                self._node = items_node(self._node).value[item]  # type: ignore[union-attr]
        return self._node

    def where(self, *path: str | int) -> str:
        """`file:line: a.b[1].c` for a field path inside this document."""
        return f"{self.source}:{locate(self.node, path)}: {format_path(path)}"


class Document(Manifest):
    """An object that came in a request body (the HTTP API), not from a file: there is no line
    to name, so a field is named by its place in the request, `items[3].spec.pool`."""

    __slots__ = ()

    def __init__(self, kind: KindInfo, obj: Any, source: str, ignored_status: bool = False) -> None:
        super().__init__(kind, obj, source, ignored_status=ignored_status)

    def where(self, *path: str | int) -> str:
        return _at(self.source, format_path(path)) if path else self.source


def documents(items: list[Any], base_dir: Path, *, source: str | None = "items") -> Loaded:
    """The objects of a request body (JSON documents), validated as files are: the manifests
    that validated and the problems of the rest, each naming `items[N].field.path` (with
    source None, a request of one object: `field.path`). A relative workingDir resolves
    against `base_dir` (the server's working directory, as a manifest read from stdin
    resolves against the current one)."""
    loaded = Loaded()
    for index, data in enumerate(items):
        where = f"{source}[{index}]" if source is not None else ""
        problems, found = _document(data, where, base_dir)
        loaded.problems += problems
        if found is not None:
            loaded.manifests.append(found)
        elif (named := _named(data)) is not None:
            loaded.refused.add(named)
    return loaded


def _document(data: Any, where: str, base_dir: Path) -> tuple[list[str], Document | None]:
    if not isinstance(data, dict):
        return [f"{where or '(document)'}: must be an object with apiVersion, kind, metadata and spec"], None
    if data.get("apiVersion") != API_VERSION:
        return [f"{_at(where, 'apiVersion')}: must be {API_VERSION}"], None
    kind = data.get("kind")
    info = KINDS.get(kind) if isinstance(kind, str) else None
    if info is None:
        return [f"{_at(where, 'kind')}: must be one of {', '.join(KINDS)}"], None
    data = dict(data)
    ignored_status = data.pop("status", None) is not None
    try:
        obj = info.model.model_validate(data)
    except ValidationError as exc:
        return [_placed(where, problem) for problem in field_problems(exc)], None
    if isinstance(obj, Job):
        resolve_working_dir(obj.spec, base_dir)
    return [], Document(info, obj, where, ignored_status)


def _placed(where: str, problem: str) -> str:
    """`field.path: message` of a document as `items[N].field.path: message`."""
    if not where:
        return problem
    whole = "(document): "
    return f"{where}: {problem[len(whole) :]}" if problem.startswith(whole) else f"{where}.{problem}"


def _at(where: str, path: str) -> str:
    return f"{where}.{path}" if where else path


@contextmanager
def paused_gc() -> Iterator[None]:
    """Loading and applying thousands of manifests allocates millions of small objects (YAML
    nodes and marks, dicts, models, stored objects) that all stay alive until the apply ends;
    the cyclic collector would walk them again and again as they age (a third of a large
    apply's time) to free nothing. So it is paused meanwhile, and what survives is then filed
    straight into the oldest generation (`freeze` + `unfreeze`: two O(1) list moves), where
    repeated young collections would have put it. Nests; other threads just collect later."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if was_enabled:
            gc.enable()


@dataclass
class Loaded:
    """What a set of paths holds: the manifests that validated, the problems of the rest,
    and (kind, name) of each refused document that names one, so that later checks do not
    also call it missing."""

    manifests: list[Manifest] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    refused: set[tuple[str, str]] = field(default_factory=set)


def parse_text(text: str, source: str, base_dir: Path) -> tuple[list[Manifest], list[str]]:
    """All documents of one file: the manifests that validated, and the problems of the rest."""
    loaded = Loaded()
    _parse(text, source, base_dir, loaded)
    return loaded.manifests, loaded.problems


def _parse(text: str, source: str, base_dir: Path, loaded: Loaded) -> None:
    manifests, problems = loaded.manifests, loaded.problems
    loader = ManifestLoader(text)
    held = _Text(text)
    text_has_alias = "*" in text
    index = -1  # of the node in the stream, so that it can be composed again
    try:
        while loader.check_node():
            node = loader.get_node()
            index += 1
            if node is None or (isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null")):
                continue
            line = node.start_mark.line + 1
            # the size limit is a document's; a List's (what `get` prints) is each item's, when
            # no alias can make its items more than the text holds
            items = items_node(node) if not text_has_alias and says_list(node) else None
            parts = items.value if items is not None else [node]
            if any(not surely_small(p, text_has_alias) and expanded_size(p) > MAX_NODES for p in parts):
                problems.append(
                    f"{source}:{line}: document too large: more than {MAX_NODES} YAML nodes (aliases expanded)"
                )
                continue
            data, dupes = construct(loader, node, source)
            if dupes:
                problems.extend(dupes)
                continue
            placed: list[tuple[int | None, Any, yaml.Node]] = [(None, data, node)]
            if _is_list(data):  # what `get -o yaml|json` prints: its items, each as a document
                items = items_node(node)
                assert items is not None  # a List was constructed from it
                placed = [
                    (i, item, item_node)
                    for i, (item, item_node) in enumerate(zip(data["items"], items.value, strict=True))
                ]
            for position, item, item_node in placed:
                origin = (held, index, item_node.start_mark.line + 1, position)
                manifest, found = _to_manifest(item, source, item_node, base_dir, origin)
                problems.extend(found)
                if manifest is not None:
                    manifests.append(manifest)
                elif (named := _named(item)) is not None:
                    loaded.refused.add(named)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        problems.append(f"{source}:{line}: invalid YAML: {exc.problem or exc.context}")
    except yaml.YAMLError as exc:
        problems.append(f"{source}:1: invalid YAML: {exc}")
    except RecursionError:
        problems.append(f"{source}:1: invalid YAML: nested too deeply")
    finally:
        loader.dispose()


def _is_list(data: Any) -> bool:
    """A Kubernetes list: `v1` `List`, or this API's `JobList` (`PoolList`...), as `get` and
    the HTTP API print several objects; kubectl applies one as its items."""
    if not isinstance(data, dict) or not isinstance(data.get("items"), list):
        return False
    kind, version = data.get("kind"), data.get("apiVersion")
    return (version == "v1" and kind == "List") or (
        version == API_VERSION and isinstance(kind, str) and kind.endswith("List") and kind[:-4] in KINDS
    )


def _named(data: Any) -> tuple[str, str] | None:
    """(kind, name) of a document refused by its schema, when it says them."""
    if isinstance(data, dict) and isinstance(meta := data.get("metadata"), dict):
        kind, name = data.get("kind"), meta.get("name")
        if isinstance(kind, str) and isinstance(name, str):
            return kind, name
    return None


def _to_manifest(
    data: Any, source: str, node: yaml.Node, base_dir: Path, origin: tuple[_Text, int, int, int | None]
) -> tuple[Manifest | None, list[str]]:
    """One document (or a List's item) as a manifest, or its problems; the manifest keeps where
    its node can be composed again (`origin`), not the node."""
    line = node.start_mark.line + 1
    if not isinstance(data, dict):
        return None, [f"{source}:{line}: (document): must be a mapping with apiVersion, kind, metadata and spec"]
    if data.get("apiVersion") != API_VERSION:
        return None, [f"{source}:{locate(node, ['apiVersion'])}: apiVersion: must be {API_VERSION}"]
    kind = data.get("kind")
    info = KINDS.get(kind) if isinstance(kind, str) else None
    if info is None:
        return None, [f"{source}:{locate(node, ['kind'])}: kind: must be one of {', '.join(KINDS)}"]
    ignored_status = data.pop("status", None) is not None
    try:
        obj = info.model.model_validate(data)
    except ValidationError as exc:
        return None, validation_problems(exc, source, node)
    if isinstance(obj, Job) and (problem := resolve_working_dir(obj.spec, base_dir)) is not None:
        return None, [f"{source}:{locate(node, ['spec', 'workingDir'])}: spec.workingDir: {problem}"]
    if isinstance(obj, Notifier) and obj.spec.secret_ref is not None:
        obj.spec.secret_ref.file = _joined(str(base_dir), os.path.expanduser(obj.spec.secret_ref.file))
    return Manifest(info, obj, source, ignored_status=ignored_status, origin=origin), []


def resolve_working_dir(spec: JobSpec, base_dir: Path) -> str | None:
    """Relative working dirs resolve against the manifest's folder, stored absolute. With
    an artifact they resolve against the run's unpacked folder, made per run: stored
    relative (normalised), and an absolute one is refused (the problem is returned)."""
    if spec.artifact is not None:
        if spec.working_dir is None:
            return None
        if spec.working_dir.startswith(("/", "~")):
            return "with an artifact, workingDir is relative to the run's unpacked folder; an absolute path is refused"
        spec.working_dir = os.path.normpath(spec.working_dir)  # inside it: JobSpec checked that
        return None
    given = spec.working_dir or "."
    if given.startswith("~"):
        given = os.path.expanduser(given)  # not remembered: it depends on the environment
    spec.working_dir = _joined(str(base_dir), given)
    return None


@functools.lru_cache(maxsize=4096)
def _joined(base_dir: str, path: str) -> str:
    """`path` made absolute against `base_dir`, normalised: a folder's jobs mostly share one
    working dir, and the path functions were 5 us of each job's load."""
    return os.path.normpath(path if os.path.isabs(path) else os.path.join(base_dir, path))


def _files(path: Path, recursive: bool) -> list[Path]:
    if not path.is_dir():  # a file, or a stream read as one: a FIFO, <(cat x), /dev/stdin
        return [path]
    pattern = "**/*" if recursive else "*"
    # sorted as Paths sort (component by component), by a key that compares in C
    return sorted(
        (p for p in path.glob(pattern) if p.suffix in (".yaml", ".yml") and p.is_file()), key=lambda p: p.parts
    )


def _folder_of(file: Path, resolved: dict[Path, Path]) -> Path:
    """`file.resolve().parent`, with each folder resolved once rather than once per file (a
    symbolic link named as the file still resolves to its target's folder)."""
    if file.is_symlink():
        return file.resolve().parent
    parent = file.parent
    if parent not in resolved:
        resolved[parent] = Path(os.path.realpath(parent))
    return resolved[parent]


def _read(path: Path, display: str) -> str:
    with open(path, "rb") as f:  # sized through the open file: one path lookup, not two
        size = os.fstat(f.fileno()).st_size  # 0 for a stream: then the read is what is bounded
        data = f.read(MAX_FILE_BYTES + 1) if size <= MAX_FILE_BYTES else b""
    if size > MAX_FILE_BYTES or len(data) > MAX_FILE_BYTES:
        raise InvalidInput(f"{display}:1: file too large ({max(size, len(data))} bytes; at most {MAX_FILE_BYTES})")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{display}:1: not UTF-8 text ({exc.reason})") from None


def load(paths: list[str], *, recursive: bool = False, stdin: Any = None, verb: str = "apply") -> list[Manifest]:
    """Every manifest under `paths` ('-' reads stdin); raises InvalidInput naming every problem."""
    loaded = read(paths, recursive=recursive, stdin=stdin, verb=verb)
    if loaded.problems:
        raise invalid(loaded.problems)
    return loaded.manifests


def read(paths: list[str], *, recursive: bool = False, stdin: Any = None, verb: str = "apply") -> Loaded:
    """Every document under `paths`, with the problems of those that did not validate, so
    that a verb can report them together with its own checks. Raises InvalidInput for a
    path that does not exist, and when the paths hold no object at all (a wrong path must
    not look like an empty desired state: `apply --prune` would delete everything)."""
    with paused_gc():
        loaded = _load(paths, recursive=recursive, stdin=stdin, verb=verb)
    if not loaded.manifests and not loaded.problems:
        raise InvalidInput(f"no objects passed to {verb} ({', '.join(paths)} hold no manifest)")
    return loaded


def invalid(problems: list[str]) -> InvalidInput:
    """One InvalidInput naming every problem, in file and line order (the first
    MAX_PROBLEMS, then a count)."""
    ordered = sorted(problems, key=_place)
    return InvalidInput(_summary(ordered), ordered[:MAX_PROBLEMS] + _more(ordered))


_PLACE = re.compile(r"^(.*?):(\d+): ")


def _place(problem: str) -> tuple[str, int]:
    """(file, line) of a `FILE:LINE: ...` problem, for reporting them in order."""
    match = _PLACE.match(problem)
    return (match.group(1), int(match.group(2))) if match else (problem, 0)


def _load(paths: list[str], *, recursive: bool, stdin: Any, verb: str) -> Loaded:
    loaded = Loaded()
    problems = loaded.problems
    folders: dict[Path, Path] = {}
    for given in paths:
        if given == "-":
            stream = stdin or sys.stdin
            text = stream.read(MAX_FILE_BYTES + 1)
            if len(text) > MAX_FILE_BYTES:
                raise InvalidInput(f"<stdin>:1: input too large (at most {MAX_FILE_BYTES} bytes)")
            _parse(text, "<stdin>", Path.cwd(), loaded)
            continue
        path = Path(given)
        if not path.exists():
            raise InvalidInput(f"{given}: path does not exist")
        files = _files(path, recursive)
        if not files and path.is_dir():
            subfolders = "" if recursive else " (use -R for subfolders)"
            raise InvalidInput(f"no objects passed to {verb}: {given} has no *.yaml or *.yml files{subfolders}")
        stream = not path.is_dir() and not path.is_file()  # no folder: relative paths resolve as stdin's
        for file in files:
            try:
                text = _read(file, str(file))
            except InvalidInput as exc:
                problems.append(str(exc))
                continue
            _parse(text, str(file), Path.cwd() if stream else _folder_of(file, folders), loaded)
    return loaded


def _summary(problems: list[str]) -> str:
    return problems[0] if len(problems) == 1 else f"{len(problems)} problems in the manifests"


def _more(problems: list[str]) -> list[str]:
    extra = len(problems) - MAX_PROBLEMS
    return [f"... and {extra} more"] if extra > 0 else []
