"""One YAML document to plain data, fast and bounded: the loader (tags resolved once per
text), the constructor for the plain maps, sequences and scalars manifests consist of (PyYAML
builds anything else), the alias-bomb bound and the duplicate-key check. `manifests.py`
turns the data into validated objects and names files and lines."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import yaml
from pydantic.alias_generators import to_camel

MAX_NODES = 200_000  # YAML nodes in one document, counted with aliases expanded (alias bombs)

Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_PLAIN_TAGS: dict[str, str] = {}  # plain scalar text -> its implicit tag (shared by every file)
_PLAIN_TAGS_MAX = 50_000  # emptied when full: a bound on memory in a long-lived controller
_SCALAR, _MAPPING, _SEQUENCE = yaml.ScalarNode, yaml.MappingNode, yaml.SequenceNode
_STR_TAG = "tag:yaml.org,2002:str"
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_COLLECTION_TAGS = {_MAPPING: _MAP_TAG, _SEQUENCE: _SEQ_TAG}


class ManifestLoader(Loader):  # type: ignore[misc, valid-type]
    """The safe loader, with the tag of each node resolved cheaply: libyaml calls back into
    Python for every node, and PyYAML resolves each plain scalar by trying its regular
    expressions in turn although manifests repeat the same keys and values over and over.
    With the safe loader's fixed implicit resolvers and no path resolvers, a plain scalar's
    tag depends on its text alone and a collection's is the default one."""

    yaml_path_resolvers: ClassVar[dict[Any, Any]] = {}  # its own and always empty: a node's place never changes its tag

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


def format_path(path: Iterable[str | int]) -> str:
    """A field path as users spell it: `spec.dependsOn[1].job`."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += ("." if text else "") + (to_camel(part) if "_" in part else part)
    return text


def expanded_size(root: yaml.Node) -> int:
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


def surely_small(node: yaml.Node, text_has_alias: bool) -> bool:
    """True when the document cannot exceed MAX_NODES, decided without walking it: with no
    alias in the text the nodes form a tree, and a tree has at most about two nodes per
    character (an empty value still needs its key or its `-`)."""
    return not text_has_alias and node.end_mark.index - node.start_mark.index < MAX_NODES // 2 - 2


def items_node(node: yaml.Node) -> yaml.SequenceNode | None:
    """The `items` sequence of a mapping node, if it has one (a List's)."""
    if not isinstance(node, yaml.MappingNode):
        return None
    found = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == "items"), None)
    return found if isinstance(found, yaml.SequenceNode) else None


def says_list(node: yaml.Node) -> bool:
    """Whether a document's node says `kind: List` (or `JobList`...), before it is constructed."""
    if not isinstance(node, yaml.MappingNode):
        return False
    kind = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == "kind"), None)
    return isinstance(kind, yaml.ScalarNode) and kind.value.endswith("List")


_SCALAR_CONSTRUCTORS = {  # the SafeConstructor methods for plain scalar tags, called directly
    "tag:yaml.org,2002:null": "construct_yaml_null",
    "tag:yaml.org,2002:bool": "construct_yaml_bool",
    "tag:yaml.org,2002:int": "construct_yaml_int",
    "tag:yaml.org,2002:float": "construct_yaml_float",
    "tag:yaml.org,2002:timestamp": "construct_yaml_timestamp",
}


class _Unusual(Exception):
    """A node the fast constructor leaves to PyYAML (merge keys, other tags, complex keys)."""


def construct(loader: Any, root: yaml.Node, source: str) -> tuple[Any, list[str]]:
    """The document's data, as `loader.construct_document(root)` would build it, or the
    duplicate-key problems that refuse it (as `duplicate_keys` names them). Several times
    faster for the plain maps, sequences and scalars manifests consist of, and one walk
    instead of two; anything else is handed to PyYAML whole, so results and errors stay PyYAML's."""
    try:
        state = _BuildState()
        data = _build(loader, root, state)
        if not state.duplicates:
            return data, []
    except _Unusual:
        pass
    if problems := duplicate_keys(root, source) + refused_tags(root, source):
        return None, problems
    return loader.construct_document(root), []


class _BuildState:
    __slots__ = ("built", "duplicates")

    def __init__(self) -> None:
        self.built: dict[int, Any] = {}  # by node identity: an alias yields the very same object, as in PyYAML
        self.duplicates = False  # a mapping spells one key twice (by its YAML text, as duplicate_keys)


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
        value = [
            item.value if item.__class__ is _SCALAR and item.tag == _STR_TAG else _build(loader, item, state)
            for item in node.value
        ]
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


# Tags the safe loader accepts that no manifest field can mean: PyYAML would hand a bytes
# object or a set to the models, which coerce some of them silently (a set to a list).
REFUSED_TAGS = {f"tag:yaml.org,2002:{name}": f"!!{name}" for name in ("binary", "set", "omap", "pairs")}


def refused_tags(node: yaml.Node, source: str) -> list[str]:
    """`!!binary`, `!!set` and the like, each named with its line and field path."""
    problems: list[str] = []
    stack: list[tuple[yaml.Node, tuple[str | int, ...]]] = [(node, ())]
    while stack:
        current, path = stack.pop()
        if current.tag in REFUSED_TAGS:
            where = format_path(path) or "(document)"
            problems.append(
                f"{source}:{current.start_mark.line + 1}: {where}: "
                f"the YAML tag {REFUSED_TAGS[current.tag]} is not allowed in a manifest"
            )
        elif isinstance(current, yaml.MappingNode):
            stack.extend((v, (*path, k.value)) for k, v in current.value if isinstance(k, yaml.ScalarNode))
        elif isinstance(current, yaml.SequenceNode):
            stack.extend((item, (*path, i)) for i, item in enumerate(current.value))
    return sorted(problems)


def duplicate_keys(node: yaml.Node, source: str) -> list[str]:
    """PyYAML keeps the last of two equal keys silently; Kubernetes refuses them, so do we."""
    problems: list[str] = []
    stack: list[tuple[yaml.Node, tuple[str | int, ...]]] = [(node, ())]
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
