"""Durations (`500ms`, `1h30m`, `2d`), sizes (`512Mi`) and CPU quantities (`500m`), parsed
into plain numbers and written back in one canonical spelling so that specs compare exactly."""

from __future__ import annotations

import functools
import math
import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, PlainSerializer, WithJsonSchema

_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_SIZE_UNITS = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "P": 10**15,
    "Pi": 2**50,
}
_SIZE = re.compile(r"(\d+)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P|)")
_CPU = re.compile(r"(\d+(?:\.\d+)?)(m?)")

# Bounds: no value a manifest can carry may overflow a timer, a database integer or a
# cgroup file, and none is larger than any real use.
MAX_DURATION = 3650 * 86400.0  # ten years, far below threading.TIMEOUT_MAX (~292 years)
MAX_SIZE = 2**50  # 1Pi
MAX_CPU = 10_000.0
MIN_POLL = 0.1  # a poll interval below this would make a waiting job spin
MIN_LOG_LIMIT = 4 * 2**10  # a run log kept smaller would hold a line or two


def parse_duration(value: object) -> float:
    """Seconds from a duration string such as `1h30m` or `250ms`; bare numbers are refused
    because `timeout: 30` is ambiguous."""
    if isinstance(value, bool) or not isinstance(value, str):
        raise ValueError("must be a duration string such as 500ms, 30s, 5m, 1h30m or 2d")
    return _duration_seconds(value)


# Manifests spell the same few durations over and over, and defaults (`1s`, `5m`, `10s`) are
# parsed again for every object: parse and format each spelling once (errors are not cached).
@functools.lru_cache(maxsize=4096)
def _duration_seconds(value: str) -> float:
    text = value.strip()
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if not text or pos != len(text):
        raise ValueError(f"invalid duration {value!r}: use forms like 500ms, 30s, 5m, 1h30m, 2d")
    if total > MAX_DURATION:
        raise ValueError(f"duration {value!r} is longer than the longest allowed, {format_duration(MAX_DURATION)}")
    return total


def _poll_interval(seconds: float) -> float:
    if seconds < MIN_POLL:
        raise ValueError(f"must be at least {format_duration(MIN_POLL)}: a shorter poll would spin")
    return seconds


def _log_limit(size: int) -> int:
    if size < MIN_LOG_LIMIT:
        raise ValueError(f"must be at least {format_size(MIN_LOG_LIMIT)}: a smaller log would keep a line or two")
    return size


@functools.lru_cache(maxsize=4096)
def format_duration(seconds: float) -> str:
    """The canonical spelling: largest units first, e.g. 5400 -> `1h30m`."""
    ms = round(seconds * 1000)
    if ms == 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        count, ms = divmod(ms, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def format_left(seconds: float) -> str:
    """A time still to go, as messages say it: a duration's spelling, to the tenth of a
    second below ten seconds and to the second above (`59m59s`, never `3.6e+03s`)."""
    return format_duration(round(seconds, 1) if seconds < 10 else round(seconds))


def spelled(text: str) -> Any:
    """A field's default in its canonical spelling (`"5s"`, `"4Ki"`): the models validate
    their defaults, so the field's own parser turns it into its number, as it would the same
    text in a manifest, and the schema shows it as users write it."""
    return text


def parse_size(value: object) -> int:
    if isinstance(value, bool):
        raise ValueError("must be a size such as 512Mi or 1Gi")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.fullmatch(str(value).strip()) if isinstance(value, str) else None
        if not match:
            raise ValueError(f"invalid size {value!r}: use forms like 4096, 4Ki, 512Mi, 1Gi")
        size = int(match.group(1)) * _SIZE_UNITS[match.group(2)]
    if size < 0:
        raise ValueError("must not be negative")
    if size > MAX_SIZE:
        raise ValueError(f"size {value!r} is larger than the largest allowed, {format_size(MAX_SIZE)}")
    return size


def format_size(size: int) -> str:
    for unit in ("Pi", "Ti", "Gi", "Mi", "Ki"):
        if size and size % _SIZE_UNITS[unit] == 0:
            return f"{size // _SIZE_UNITS[unit]}{unit}"
    return str(size)


def parse_cpu(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError("must be a CPU quantity such as 1, 0.5 or 500m")
    if isinstance(value, (int, float)):
        number = float(value)
    else:
        match = _CPU.fullmatch(str(value).strip())
        if not match:
            raise ValueError(f"invalid CPU quantity {value!r}: use forms like 1, 0.5 or 500m")
        number = float(match.group(1)) / (1000 if match.group(2) else 1)
    if number < 0 or not math.isfinite(number):
        raise ValueError("must be a finite, non-negative CPU quantity")
    if number > MAX_CPU:
        raise ValueError(f"CPU quantity {value!r} is more than the most allowed, {format_cpu(MAX_CPU)}")
    return number


def format_cpu(cpu: float) -> str:
    if cpu == int(cpu):
        return str(int(cpu))
    return f"{round(cpu * 1000)}m"


_STR_SCHEMA = {"type": "string"}
_INT_OR_STR_SCHEMA = {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}

Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str),
    WithJsonSchema({"type": "string", "pattern": r"^(\d+(\.\d+)?(ms|s|m|h|d))+$"}),
]
# A poll interval (probes, path waits): a duration of at least MIN_POLL.
PollInterval = Annotated[Duration, AfterValidator(_poll_interval)]
Size = Annotated[
    int,
    BeforeValidator(parse_size),
    PlainSerializer(format_size, return_type=str),
    WithJsonSchema(_INT_OR_STR_SCHEMA),
]
# The bytes of a run log kept on disk: a size of at least MIN_LOG_LIMIT.
LogLimit = Annotated[Size, AfterValidator(_log_limit)]
CPU = Annotated[
    float,
    BeforeValidator(parse_cpu),
    PlainSerializer(format_cpu, return_type=str),
    WithJsonSchema(_INT_OR_STR_SCHEMA),
]
