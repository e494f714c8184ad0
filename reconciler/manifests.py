"""Reading manifests: files, folders (optionally recursive), multi-document YAML and stdin.

Every problem is reported as `FILE:LINE: FIELD.PATH: message` and raised together as one
InvalidInput, so the user fixes a whole folder in one pass and nothing is stored meanwhile."""

from __future__ import annotations

import functools
import gc
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel

from .api.kinds import KINDS, KindInfo
from .api.meta import API_VERSION
from .errors import InvalidInput

MAX_FILE_BYTES = 8 * 2**20  # a manifest file larger than this is refused before parsing
MAX_NODES = 200_000  # YAML nodes in one document, counted with aliases expanded (alias bombs)
MAX_PROBLEMS = 50  # beyond this the user gets the count, not the list

Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


_PLAIN_TAGS: dict[str, str] = {}  # plain scalar text -> its implicit tag (shared by every file)
_PLAIN_TAGS_MAX = 50_000  # emptied when full: a bound on memory in a long-lived controller
_SCALAR, _MAPPING, _SEQUENCE = yaml.ScalarNode, yaml.MappingNode, yaml.SequenceNode
_STR_TAG = "tag:yaml.org,2002:str"
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_COLLECTION_TAGS = {_MAPPING: _MAP_TAG, _SEQUENCE: _SEQ_TAG}


class _ManifestLoader(Loader):  # type: ignore[misc, valid-type]
    """The safe loader, with the tag of each node resolved cheaply: libyaml calls back into
    Python for every node, and PyYAML resolves each plain scalar by trying its regular
    expressions in turn although manifests repeat the same keys and values over and over.
    With the safe loader's fixed implicit resolvers and no path resolvers, a plain scalar's
    tag depends on its text alone and a collection's is the default one."""

    yaml_path_resolvers: dict = {}  # its own and always empty: a node's place never changes its tag

    def descend_resolver(self, current_node: Any, current_index: Any) -> None:
        pass  # called around every node; only path resolvers need to follow the path

    def ascend_resolver(self) -> None:
        pass

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        if kind is not _SCALAR:
            return _COLLECTION_TAGS[kind]
        if not implicit[0]:  # quoted, or explicitly tagged: PyYAML's answer is always str
            return _STR_TAG
        tag = _PLAIN_TAGS.get(value)
        if tag is None:
            if len(_PLAIN_TAGS) >= _PLAIN_TAGS_MAX:
                _PLAIN_TAGS.clear()
            tag = _PLAIN_TAGS[value] = super().resolve(kind, value, implicit)
        return tag


class _Text:
    """One file's (or stdin's) text, whose node trees are composed again only when a message
    must name a line inside a document: a large apply keeps no node alive (all of them
    together would be most of its memory, and allocating and freeing them most of its time)."""

    __slots__ = ("text", "nodes")

    def __init__(self, text: str) -> None:
        self.text = text
        self.nodes: list[yaml.Node] = []

    def node(self, index: int) -> yaml.Node:
        """The `index`-th node of the stream, as `parse_text` saw it (the same loader)."""
        if index >= len(self.nodes):
            loader = _ManifestLoader(self.text)
            try:
                nodes = []
                while len(nodes) <= index and loader.check_node():
                    nodes.append(loader.get_node())
                self.nodes = nodes
            finally:
                loader.dispose()
        return self.nodes[index]


class Manifest:
    """One validated object and where it came from, so later checks can name the line: its
    node, or the text and index to compose that node again when it is asked for."""

    __slots__ = ("kind", "obj", "source", "name", "line", "ignored_status", "_node", "_origin")

    def __init__(self, kind: KindInfo, obj: Any, source: str, node: yaml.Node | None = None,
                 ignored_status: bool = False, *, origin: tuple[_Text, int, int] | None = None) -> None:
        self.kind = kind
        self.obj = obj  # the pydantic model of the kind
        self.source = source
        self.name: str = obj.metadata.name  # read thousands of times by apply: once here, not through pydantic
        self.ignored_status = ignored_status
        self._node = node
        self._origin = origin  # (text, index of the node in its stream, line of the document)
        self.line: int = node.start_mark.line + 1 if node is not None else origin[2]  # type: ignore[index]

    def __repr__(self) -> str:
        return f"Manifest({self.kind.kind}/{self.name} at {self.source}:{self.line})"

    @property
    def node(self) -> yaml.Node:
        if self._node is None:
            text, index, _ = self._origin  # type: ignore[misc]
            self._node = text.node(index)
        return self._node

    def where(self, *path: str | int) -> str:
        """`file:line: a.b[1].c` for a field path inside this document."""
        return f"{self.source}:{locate(self.node, path)}: {format_path(path)}"


def format_path(path: Iterable[str | int]) -> str:
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += ("." if text else "") + (to_camel(part) if "_" in part else part)
    return text


def locate(node: yaml.Node, path: Iterable[str | int]) -> int:
    """Line (1-based) of the deepest node along `path`; parts that are not in the YAML (a
    missing field, a union branch's tag) stop the walk at the nearest enclosing node."""
    line = node.start_mark.line + 1
    for part in path:
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            keys = (part, to_camel(part))
            match = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value in keys), None)
            if match is None:
                break
            line, node = match[0].start_mark.line + 1, match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            continue
    return line


def _message(error: dict[str, Any]) -> str:
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required field is missing"
    if kind == "literal_error":
        return "must be one of " + ctx.get("expected", "").replace("'", "").replace(" or ", ", ")
    message = error["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    return message.replace("Input should be", "must be").replace("Input should have", "must have")


def _clean_loc(loc: tuple) -> tuple:
    """Drop pydantic's union-branch tags (`constrained-int`, `function-after[...]`) from a path."""
    return tuple(p for p in loc if isinstance(p, int) or ("[" not in p and "-" not in p and p != "str"))


def validation_problems(error: ValidationError, source: str, node: yaml.Node) -> list[str]:
    by_place: dict[str, list[str]] = {}  # a union's branches fail at one place: say it once
    for item in error.errors():
        loc = _clean_loc(item["loc"])
        place = f"{source}:{locate(node, loc)}: {format_path(loc) or '(document)'}"
        messages = by_place.setdefault(place, [])
        if (message := _message(item)) not in messages:
            messages.append(message)
    return [f"{place}: {', or '.join(messages)}" for place, messages in by_place.items()]


def _expanded_size(root: yaml.Node) -> int:
    """Nodes in the document with aliases expanded, computed without expanding them (memo by
    identity), so a billion-laughs document is measured in microseconds and refused. A node
    that contains itself (`&a [*a]`) expands forever: it counts as MAX_NODES + 1."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # started, not finished: exactly the ancestors of the node in hand
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if done:
            sizes[key] = min(1 + sum(sizes[id(c)] for c in children), MAX_NODES + 1)
            open_nodes.discard(key)
        elif key in open_nodes:
            return MAX_NODES + 1
        else:
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def _surely_small(node: yaml.Node, text_has_alias: bool) -> bool:
    """True when the document cannot exceed MAX_NODES, decided without walking it: with no
    alias in the text the nodes form a tree, and a tree has at most about two nodes per
    character (an empty value still needs its key or its `-`)."""
    return not text_has_alias and node.end_mark.index - node.start_mark.index < MAX_NODES // 2 - 2


_SCALAR_CONSTRUCTORS = {  # the SafeConstructor methods for plain scalar tags, called directly
    "tag:yaml.org,2002:null": "construct_yaml_null",
    "tag:yaml.org,2002:bool": "construct_yaml_bool",
    "tag:yaml.org,2002:int": "construct_yaml_int",
    "tag:yaml.org,2002:float": "construct_yaml_float",
    "tag:yaml.org,2002:timestamp": "construct_yaml_timestamp",
}


class _Unusual(Exception):
    """A node the fast constructor leaves to PyYAML (merge keys, other tags, complex keys)."""


def _construct(loader: Any, root: yaml.Node, source: str) -> tuple[Any, list[str]]:
    """The document's data, as `loader.construct_document(root)` would build it, or the
    duplicate-key problems that refuse it (as `_duplicate_keys` names them). Several times
    faster for the plain maps, sequences and scalars manifests consist of, and one walk
    instead of two; anything else is handed to PyYAML whole, so results and errors stay PyYAML's."""
    try:
        state = _BuildState()
        data = _build(loader, root, state)
        if not state.duplicates:
            return data, []
    except _Unusual:
        pass
    if dupes := _duplicate_keys(root, source):
        return None, dupes
    return loader.construct_document(root), []


class _BuildState:
    __slots__ = ("built", "duplicates")

    def __init__(self) -> None:
        self.built: dict[int, Any] = {}  # by node identity: an alias yields the very same object, as in PyYAML
        self.duplicates = False  # a mapping spells one key twice (by its YAML text, as _duplicate_keys)


def _build(loader: Any, node: yaml.Node, state: _BuildState) -> Any:
    """A module-level function, not a recursive closure: that would be a reference cycle
    per document, which only the cyclic collector could free. Plain string scalars, most of
    a manifest, are taken inline rather than through a call each (a scalar's value is
    immutable, so an aliased one needs no memo)."""
    built = state.built
    key = id(node)
    if key in built:
        value = built[key]
        if value is _Unusual:  # still being built: a node that contains itself
            raise _Unusual
        return value
    tag = node.tag
    cls = node.__class__
    if cls is _SCALAR:
        return _scalar(loader, node)
    if cls is _MAPPING and tag == _MAP_TAG:
        built[key] = _Unusual
        value = {}
        spelled: set[str] = set()
        for key_node, value_node in node.value:
            key_tag = key_node.tag
            if key_node.__class__ is not _SCALAR or key_tag not in _PLAIN_KEY_TAGS:
                raise _Unusual  # merge (<<), value (=), complex or tagged keys
            text = key_node.value
            if text in spelled:
                state.duplicates = True
            spelled.add(text)
            if value_node.__class__ is _SCALAR and value_node.tag == _STR_TAG:
                item = value_node.value
            else:
                item = _build(loader, value_node, state)
            value[text if key_tag == _STR_TAG else _scalar(loader, key_node)] = item
    elif cls is _SEQUENCE and tag == _SEQ_TAG:
        built[key] = _Unusual
        value = [item.value if item.__class__ is _SCALAR and item.tag == _STR_TAG else _build(loader, item, state)
                 for item in node.value]
    else:
        raise _Unusual
    built[key] = value
    return value


def _scalar(loader: Any, node: yaml.Node) -> Any:
    tag = node.tag
    if tag == _STR_TAG:
        return node.value
    if tag in _SCALAR_CONSTRUCTORS:
        return getattr(loader, _SCALAR_CONSTRUCTORS[tag])(node)
    raise _Unusual


_PLAIN_KEY_TAGS = frozenset((_STR_TAG, *_SCALAR_CONSTRUCTORS))


@contextmanager
def paused_gc():
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


def _duplicate_keys(node: yaml.Node, source: str) -> list[str]:
    """PyYAML keeps the last of two equal keys silently; Kubernetes refuses them, so do we."""
    problems: list[str] = []
    stack: list[tuple[yaml.Node, tuple]] = [(node, ())]
    while stack:
        current, path = stack.pop()
        if isinstance(current, yaml.MappingNode):
            seen: set[str] = set()
            for key, value in current.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in seen:
                        where = format_path((*path, key.value))
                        problems.append(f"{source}:{key.start_mark.line + 1}: {where}: duplicate key")
                    seen.add(key.value)
                    stack.append((value, (*path, key.value)))
        elif isinstance(current, yaml.SequenceNode):
            stack.extend((item, (*path, i)) for i, item in enumerate(current.value))
    return problems


def parse_text(text: str, source: str, base_dir: Path) -> tuple[list[Manifest], list[str]]:
    """All documents of one file: the manifests that validated, and the problems of the rest."""
    manifests: list[Manifest] = []
    problems: list[str] = []
    loader = _ManifestLoader(text)
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
            if not _surely_small(node, text_has_alias) and _expanded_size(node) > MAX_NODES:
                problems.append(f"{source}:{line}: document too large: more than {MAX_NODES} YAML nodes (aliases expanded)")
                continue
            data, dupes = _construct(loader, node, source)
            if dupes:
                problems.extend(dupes)
                continue
            manifest, found = _to_manifest(data, source, node, base_dir, (held, index, line))
            problems.extend(found)
            if manifest is not None:
                manifests.append(manifest)
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
    return manifests, problems


def _to_manifest(data: Any, source: str, node: yaml.Node, base_dir: Path,
                 origin: tuple[_Text, int, int]) -> tuple[Manifest | None, list[str]]:
    line = node.start_mark.line + 1
    if not isinstance(data, dict):
        return None, [f"{source}:{line}: (document): must be a mapping with apiVersion, kind, metadata and spec"]
    if data.get("apiVersion") != API_VERSION:
        return None, [f"{source}:{locate(node, ['apiVersion'])}: apiVersion: must be {API_VERSION}"]
    info = KINDS.get(data.get("kind")) if isinstance(data.get("kind"), str) else None
    if info is None:
        return None, [f"{source}:{locate(node, ['kind'])}: kind: must be one of {', '.join(KINDS)}"]
    ignored_status = data.pop("status", None) is not None
    try:
        obj: BaseModel = info.model.model_validate(data)
    except ValidationError as exc:
        return None, validation_problems(exc, source, node)
    if info.kind == "Job":
        resolve_working_dir(obj.spec, base_dir)
    return Manifest(info, obj, source, ignored_status=ignored_status, origin=origin), []


def resolve_working_dir(spec: Any, base_dir: Path) -> None:
    """Relative working dirs resolve against the manifest's folder, stored absolute."""
    given = spec.working_dir or "."
    if given.startswith("~"):
        given = os.path.expanduser(given)  # not remembered: it depends on the environment
    spec.working_dir = _joined(str(base_dir), given)


@functools.lru_cache(maxsize=4096)
def _joined(base_dir: str, path: str) -> str:
    """`path` made absolute against `base_dir`, normalised: a folder's jobs mostly share one
    working dir, and the path functions were 5 us of each job's load."""
    return os.path.normpath(path if os.path.isabs(path) else os.path.join(base_dir, path))


def _files(path: Path, recursive: bool) -> list[Path]:
    if path.is_file():
        return [path]
    pattern = "**/*" if recursive else "*"
    # sorted as Paths sort (component by component), by a key that compares in C
    return sorted((p for p in path.glob(pattern) if p.suffix in (".yaml", ".yml") and p.is_file()),
                  key=lambda p: p.parts)


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
    with open(path, encoding="utf-8") as f:  # sized through the open file: one path lookup, not two
        size = os.fstat(f.fileno()).st_size
        if size > MAX_FILE_BYTES:
            raise InvalidInput(f"{display}:1: file too large ({size} bytes; at most {MAX_FILE_BYTES})")
        try:
            return f.read()
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"{display}:1: not UTF-8 text ({exc.reason})") from None


def load(paths: list[str], *, recursive: bool = False, stdin: Any = None) -> list[Manifest]:
    """Every manifest under `paths` ('-' reads stdin); raises InvalidInput naming every problem."""
    with paused_gc():
        return _load(paths, recursive=recursive, stdin=stdin)


def _load(paths: list[str], *, recursive: bool, stdin: Any) -> list[Manifest]:
    manifests: list[Manifest] = []
    problems: list[str] = []
    folders: dict[Path, Path] = {}
    for given in paths:
        if given == "-":
            stream = stdin or sys.stdin
            text = stream.read(MAX_FILE_BYTES + 1)
            if len(text) > MAX_FILE_BYTES:
                raise InvalidInput(f"<stdin>:1: input too large (at most {MAX_FILE_BYTES} bytes)")
            found, bad = parse_text(text, "<stdin>", Path.cwd())
            manifests += found
            problems += bad
            continue
        path = Path(given)
        if not path.exists():
            raise InvalidInput(f"{given}: path does not exist")
        files = _files(path, recursive)
        if not files and path.is_dir():
            raise InvalidInput(f"{given}: no *.yaml or *.yml files" + ("" if recursive else " (use -R for subfolders)"))
        for file in files:
            try:
                text = _read(file, str(file))
            except InvalidInput as exc:
                problems.append(str(exc))
                continue
            found, bad = parse_text(text, str(file), _folder_of(file, folders))
            manifests += found
            problems += bad
    if problems:
        raise InvalidInput(_summary(problems), problems[:MAX_PROBLEMS] + _more(problems))
    return manifests


def _summary(problems: list[str]) -> str:
    return problems[0] if len(problems) == 1 else f"{len(problems)} problems in the manifests"


def _more(problems: list[str]) -> list[str]:
    extra = len(problems) - MAX_PROBLEMS
    return [f"... and {extra} more"] if extra > 0 else []
