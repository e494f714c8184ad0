"""reconciler/api/quantity.py: durations, sizes and CPU quantities, parsed and written back
in one canonical spelling (so that equal specs compare equal as text)."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from reconciler.api.quantity import (
    MAX_DURATION,
    MAX_SIZE,
    format_cpu,
    format_duration,
    format_size,
    parse_cpu,
    parse_duration,
    parse_size,
)

# --- durations ---------------------------------------------------------------------------------

DURATIONS = [
    ("500ms", 0.5),
    ("1ms", 0.001),
    ("30s", 30.0),
    ("1.5s", 1.5),
    ("5m", 300.0),
    ("1h", 3600.0),
    ("1h30m", 5400.0),
    ("1m30s", 90.0),
    ("90s", 90.0),
    ("2d", 172800.0),
    ("1d2h3m4s5ms", 93784.005),
    ("0s", 0.0),
    ("0.5h", 1800.0),
    (" 10s ", 10.0),
]


@pytest.mark.parametrize("text,seconds", DURATIONS, ids=[t for t, _ in DURATIONS])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds, abs=1e-9)


BAD_DURATIONS = [
    "30",
    "5x",
    "-1s",
    "",
    "   ",
    "s",
    "ms",
    "1.s",
    ".5s",
    "1 s",
    "1h 30m",
    "1S",
    "1e3s",
    "1w",
    "+1s",
    "1s-",
    "one second",
    "1,5s",
    30,
    1.5,
    True,
    None,
    ["1s"],
]


@pytest.mark.parametrize("value", BAD_DURATIONS, ids=[repr(v) for v in BAD_DURATIONS])
def test_parse_duration_refuses(value):
    with pytest.raises(ValueError):
        parse_duration(value)


FORMATTED_DURATIONS = [
    (0, "0s"),
    (0.0001, "0s"),
    (0.5, "500ms"),
    (1, "1s"),
    (59, "59s"),
    (60, "1m"),
    (90, "1m30s"),
    (3600, "1h"),
    (5400, "1h30m"),
    (86400, "1d"),
    (172800, "2d"),
    (3600.5, "1h500ms"),
    (93784.005, "1d2h3m4s5ms"),
]


@pytest.mark.parametrize("seconds,text", FORMATTED_DURATIONS, ids=[t for _, t in FORMATTED_DURATIONS])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize(
    "a,b",
    [
        ("60m", "1h"),
        ("90s", "1m30s"),
        ("1000ms", "1s"),
        ("24h", "1d"),
        ("0.5m", "30s"),
        ("1h60m", "2h"),
        ("30m1h", "1h30m"),
    ],
)
def test_equal_durations_share_one_spelling(a, b):
    assert format_duration(parse_duration(a)) == format_duration(parse_duration(b)) == b


_whole = st.integers(min_value=0, max_value=10**6)
_thousandths = st.integers(min_value=0, max_value=10**6).map(lambda n: f"{n // 1000}.{n % 1000:03d}")
_part = st.one_of(
    st.tuples(st.one_of(_whole.map(str), _thousandths), st.sampled_from(["s", "m", "h", "d"])),
    st.tuples(_whole.map(str), st.just("ms")),  # below a millisecond is below the precision kept
)
duration_text = (
    st.lists(_part, min_size=1, max_size=5)
    .map(lambda parts: "".join(n + u for n, u in parts))
    .filter(lambda text: _seconds(text) <= MAX_DURATION)
)


def _seconds(text: str) -> float:
    """The duration's seconds, unbounded (the generator keeps to the allowed range)."""
    import re

    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    return sum(float(n) * units[u] for n, u in re.findall(r"([\d.]+)(ms|s|m|h|d)", text))


@given(duration_text)
@example("1.001s")
@example("0.1m")
@example("123ms")
@example("1.005s")
def test_format_duration_reparses_to_the_same_value(text):
    value = parse_duration(text)
    canonical = format_duration(value)
    again = parse_duration(canonical)
    assert again == pytest.approx(value, rel=1e-12, abs=1e-9)
    assert round(again * 1000) == round(value * 1000)  # the same number of milliseconds
    assert format_duration(again) == canonical  # the canonical spelling is a fixed point


CANONICAL = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?")


@given(st.integers(min_value=0, max_value=int(MAX_DURATION * 1000)))
def test_format_duration_of_whole_milliseconds(ms):
    text = format_duration(ms / 1000)
    assert round(parse_duration(text) * 1000) == ms
    if ms:  # largest units first, each at most once, no zero parts, each below the next unit up
        match = CANONICAL.fullmatch(text)
        assert match, text
        limits = {"h": 24, "m": 60, "s": 60, "ms": 1000}
        for unit, number in zip(("d", "h", "m", "s", "ms"), match.groups(), strict=True):
            if number is not None:
                assert int(number) > 0 and int(number) < limits.get(unit, math.inf)


# --- sizes -------------------------------------------------------------------------------------

SIZES = [
    ("512Mi", 512 * 2**20),
    ("1Gi", 2**30),
    ("4Ki", 4096),
    ("2Ti", 2 * 2**40),
    ("4096", 4096),
    ("1k", 1000),
    ("1M", 10**6),
    ("3G", 3 * 10**9),
    ("1T", 10**12),
    ("0", 0),
    (4096, 4096),
    (0, 0),
]


@pytest.mark.parametrize("value,size", SIZES, ids=[repr(v) for v, _ in SIZES])
def test_parse_size(value, size):
    assert parse_size(value) == size


BAD_SIZES = ["12Qi", "1.5Gi", "Gi", "", "-1", "1 Gi", "1gi", "1KI", "1K", "lots", -1, True, None, 1.5]


@pytest.mark.parametrize("value", BAD_SIZES, ids=[repr(v) for v in BAD_SIZES])
def test_parse_size_refuses(value):
    with pytest.raises(ValueError):
        parse_size(value)


@pytest.mark.parametrize(
    "size,text",
    [
        (0, "0"),
        (1, "1"),
        (1000, "1000"),
        (1024, "1Ki"),
        (1536, "1536"),
        (2**20, "1Mi"),
        (512 * 2**20, "512Mi"),
        (2**30, "1Gi"),
        (1024 * 2**30, "1Ti"),
        (10**6, "1000000"),
        (3 * 2**40, "3Ti"),
    ],
)
def test_format_size(size, text):
    assert format_size(size) == text


size_text = st.tuples(
    st.integers(min_value=0, max_value=1024), st.sampled_from(["", "k", "M", "G", "T", "Ki", "Mi", "Gi", "Ti"])
).map(lambda p: f"{p[0]}{p[1]}")


@given(size_text)
@example("1Pi")
@example("1024Mi")
@example("1000k")
def test_format_size_reparses_to_the_same_value(text):
    value = parse_size(text)
    canonical = format_size(value)
    assert parse_size(canonical) == value
    assert format_size(parse_size(canonical)) == canonical


@given(st.integers(min_value=0, max_value=MAX_SIZE))
def test_format_size_round_trips_every_integer(n):
    assert parse_size(format_size(n)) == n


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (parse_duration, "3650d1ms", "longest allowed, 3650d"),
        (parse_duration, "110000d", "longest allowed"),
        (parse_size, "1025Ti", "largest allowed, 1Pi"),
        (parse_size, 2**63, "largest allowed"),
        (parse_cpu, "10001", "most allowed"),
    ],
)
def test_values_past_their_bound_are_refused(parse, text, message):
    """Past these no timer, database integer or cgroup file could hold the value."""
    with pytest.raises(ValueError, match=message):
        parse(text)


def test_the_bounds_themselves_are_allowed():
    assert parse_duration("3650d") == MAX_DURATION
    assert parse_size("1Pi") == MAX_SIZE
    assert parse_cpu("10000") == 10_000


# --- CPU ---------------------------------------------------------------------------------------

CPUS = [
    ("1", 1.0),
    ("0.5", 0.5),
    ("500m", 0.5),
    ("250m", 0.25),
    ("2", 2.0),
    ("1.5", 1.5),
    ("0", 0.0),
    (2, 2.0),
    (0.5, 0.5),
    ("1000m", 1.0),
]


@pytest.mark.parametrize("value,cpu", CPUS, ids=[repr(v) for v, _ in CPUS])
def test_parse_cpu(value, cpu):
    assert parse_cpu(value) == pytest.approx(cpu)


BAD_CPUS = ["two", "-1", "1e3", "", "m", "1 m", "1M", -1, -0.5, True, math.inf, math.nan]


@pytest.mark.parametrize("value", BAD_CPUS, ids=[repr(v) for v in BAD_CPUS])
def test_parse_cpu_refuses(value):
    with pytest.raises(ValueError):
        parse_cpu(value)


@pytest.mark.parametrize("cpu,text", [(1.0, "1"), (2, "2"), (0.5, "500m"), (1.5, "1500m"), (0.25, "250m"), (0, "0")])
def test_format_cpu(cpu, text):
    assert format_cpu(cpu) == text


@given(st.integers(min_value=0, max_value=10**7))
def test_format_cpu_reparses_to_the_same_millicores(millicores):
    for spelled in (f"{millicores}m", str(millicores / 1000)):
        value = parse_cpu(spelled)
        canonical = format_cpu(value)
        assert round(parse_cpu(canonical) * 1000) == millicores
        assert format_cpu(parse_cpu(canonical)) == canonical
