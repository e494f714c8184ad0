"""Who may do what: the tokens file and the roles of API.md section 4.

One `TOKEN ROLE [NODE]` per line (`#` comments and blank lines allowed):
- `admin`: everything;
- `viewer`: GET only (lists, watches, logs, the registry);
- `agent NODE`: a node agent: its own Node (GET), and under `nodes/NODE/` its heartbeat,
  the runs placed on it and its reports of them; nothing of another node (403).

Tokens are kept as SHA-256 digests and compared in constant time against every known one,
so neither a token nor how much of it matched leaks through timing; none is ever logged."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from pathlib import Path

from ..api.meta import check_name
from ..errors import InvalidInput
from ..wire import PREFIX

ROLES = ("admin", "viewer", "agent")
MIN_TOKEN_LENGTH = 16  # shorter ones are guessable; `openssl rand -hex 32` makes a good one
READS = ("GET", "HEAD")


@dataclass(frozen=True)
class Identity:
    role: str
    node: str | None = None  # an agent's node


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


class Tokens:
    def __init__(self, entries: list[tuple[bytes, Identity]], agent_tokens: dict[str, str] | None = None):
        self._entries = entries
        # node -> its agent's token: the server shows it to that agent's log port, the one
        # place it fetches from a node (kept in memory only, never logged)
        self._agent_tokens = agent_tokens or {}

    @classmethod
    def load(cls, path: str) -> Tokens:
        """The tokens file; InvalidInput naming the file and line of each problem."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"--tokens {path}: cannot read it: {exc}") from None
        entries: list[tuple[bytes, Identity]] = []
        problems: list[str] = []
        seen: dict[bytes, int] = {}
        agent_tokens: dict[str, str] = {}
        for number, line in enumerate(text.splitlines(), 1):
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            where = f"{path}:{number}"
            found = _entry(words, where)
            if isinstance(found, str):
                problems.append(found)
                continue
            digest = _digest(words[0])
            if digest in seen:
                problems.append(f"{where}: the same token as line {seen[digest]}")
                continue
            seen[digest] = number
            entries.append((digest, found))
            if found.node is not None:
                agent_tokens.setdefault(found.node, words[0])
        if not entries and not problems:
            problems.append(f"{path}: no tokens: nobody could use the server (one `TOKEN ROLE [NODE]` per line)")
        if problems:
            raise InvalidInput(problems[0], problems)
        return cls(entries, agent_tokens)

    def agent_token(self, node: str) -> str | None:
        """The token of `node`'s agent, which its log port accepts."""
        return self._agent_tokens.get(node)

    def identify(self, token: str | None) -> Identity | None:
        """Whose token this is, or None; every known token is compared, each in constant time."""
        if not token:
            return None
        presented = _digest(token)
        found = None
        for digest, identity in self._entries:
            if hmac.compare_digest(presented, digest):
                found = identity
        return found


def _entry(words: list[str], where: str) -> Identity | str:
    """One line's identity, or the problem with it."""
    token, role, rest = words[0], words[1] if len(words) > 1 else None, words[2:]
    if role is None:
        return f"{where}: a role must follow the token ({', '.join(ROLES)})"
    if len(token) < MIN_TOKEN_LENGTH:
        return f"{where}: token too short: use at least {MIN_TOKEN_LENGTH} random characters (openssl rand -hex 32)"
    if role not in ROLES:
        return f"{where}: unknown role {role!r}: use {', '.join(ROLES)}"
    if role != "agent":
        return Identity(role) if not rest else f"{where}: only an agent token names a node"
    if len(rest) != 1:
        return f"{where}: an agent token names its node: TOKEN agent NODE"
    try:
        return Identity(role, check_name(rest[0]))
    except ValueError as exc:
        return f"{where}: {exc}"


def refusal(identity: Identity, method: str, path: str) -> str | None:
    """Why `identity` may not make this request, or None when it may."""
    if identity.role == "admin":
        return None
    if identity.role == "viewer":
        if method not in READS:
            return f"a viewer token may only read (GET), not {method}"
        if path.startswith(f"{PREFIX}/nodes/") and path.removeprefix(f"{PREFIX}/nodes/").split("/")[1:2] == ["runs"]:
            return "a node's runs, with their specs and environment, are its agent's to read (and an admin's)"
        return None
    own = f"{PREFIX}/nodes/{identity.node}"
    if (method in READS and path == own) or path == own + "/heartbeat" or path.startswith(own + "/runs"):
        return None  # not cordon, uncordon or drain of its node: those are an operator's
    return f"an agent token may only touch its own node ({identity.node}): its heartbeat, runs and reports"
