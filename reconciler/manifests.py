"""Reading manifests: files, folders (optionally recursive), multi-document YAML and stdin.

Every problem is reported as `FILE:LINE: FIELD.PATH: message` and raised together as one
InvalidInput, so the user fixes a whole folder in one pass and nothing is stored meanwhile."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
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


@dataclass
class Manifest:
    """One validated object and where it came from, so later checks can name the line."""

    kind: KindInfo
    obj: Any  # the pydantic model of the kind
    source: str
    node: yaml.Node = field(repr=False)
    ignored_status: bool = False

    @property
    def name(self) -> str:
        return self.obj.metadata.name

    @property
    def line(self) -> int:
        return self.node.start_mark.line + 1

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
    identity), so a billion-laughs document is measured in microseconds and refused."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if done:
            sizes[id(node)] = min(1 + sum(sizes[id(c)] for c in children), MAX_NODES + 1)
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def _duplicate_keys(node: yaml.Node, source: str) -> list[str]:
    problems, stack = [], [node]
    while stack:
        current = stack.pop()
        if isinstance(current, yaml.MappingNode):
            seen: set[str] = set()
            for key, value in current.value:
                if isinstance(key, yaml.ScalarNode):
                    if key.value in seen:
                        problems.append(f"{source}:{key.start_mark.line + 1}: {key.value}: duplicate key")
                    seen.add(key.value)
                stack.append(value)
        elif isinstance(current, yaml.SequenceNode):
            stack.extend(current.value)
    return problems


def parse_text(text: str, source: str, base_dir: Path) -> tuple[list[Manifest], list[str]]:
    """All documents of one file: the manifests that validated, and the problems of the rest."""
    manifests: list[Manifest] = []
    problems: list[str] = []
    loader = Loader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None or (isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null")):
                continue
            line = node.start_mark.line + 1
            if _expanded_size(node) > MAX_NODES:
                problems.append(f"{source}:{line}: document too large: more than {MAX_NODES} YAML nodes (aliases expanded)")
                continue
            if dupes := _duplicate_keys(node, source):
                problems.extend(dupes)
                continue
            data = loader.construct_document(node)
            manifest, found = _to_manifest(data, source, node, base_dir)
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


def _to_manifest(data: Any, source: str, node: yaml.Node, base_dir: Path) -> tuple[Manifest | None, list[str]]:
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
    return Manifest(info, obj, source, node, ignored_status), []


def resolve_working_dir(spec: Any, base_dir: Path) -> None:
    """Relative working dirs resolve against the manifest's folder, stored absolute."""
    wd = Path(os.path.expanduser(spec.working_dir or "."))
    spec.working_dir = os.path.normpath(wd if wd.is_absolute() else base_dir / wd)


def _files(path: Path, recursive: bool) -> list[Path]:
    if path.is_file():
        return [path]
    pattern = "**/*" if recursive else "*"
    return sorted(p for p in path.glob(pattern) if p.suffix in (".yaml", ".yml") and p.is_file())


def _read(path: Path, display: str) -> str:
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise InvalidInput(f"{display}:1: file too large ({size} bytes; at most {MAX_FILE_BYTES})")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{display}:1: not UTF-8 text ({exc.reason})") from None


def load(paths: list[str], *, recursive: bool = False, stdin: Any = None) -> list[Manifest]:
    """Every manifest under `paths` ('-' reads stdin); raises InvalidInput naming every problem."""
    manifests: list[Manifest] = []
    problems: list[str] = []
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
            found, bad = parse_text(text, str(file), file.resolve().parent)
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
