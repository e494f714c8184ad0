"""Times as status writes them: `from_epoch` spells what datetime would, without it."""

from datetime import UTC, datetime

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from reconciler.api.meta import format_time, from_epoch, to_epoch


def _by_datetime(epoch: float) -> str:
    return format_time(datetime.fromtimestamp(epoch, UTC))


@given(st.floats(min_value=0, max_value=253_402_300_799.9, allow_nan=False))  # 1970 to 9999
@example(1764950000.0005)  # half a millisecond: cut, not rounded
@example(1764950000.9999995)  # rounds up to the next second
@example(1764950000.0000005)  # half a microsecond: to even
@example(0.0)
def test_from_epoch_spells_the_time_as_datetime_does(epoch):
    assert from_epoch(epoch) == _by_datetime(epoch)


@given(st.floats(min_value=-2_208_988_800, max_value=-1e-9, allow_nan=False))  # before 1970
def test_from_epoch_before_1970_is_spelled_as_datetime_does(epoch):
    assert from_epoch(epoch) == _by_datetime(epoch)


def test_a_time_past_year_9999_is_refused_as_datetime_refuses_it():
    with pytest.raises((ValueError, OverflowError)):
        _by_datetime(253_402_300_800.0)
    with pytest.raises((ValueError, OverflowError)):
        from_epoch(253_402_300_800.0)


def test_a_written_time_reads_back_to_the_millisecond():
    assert to_epoch(from_epoch(1764950000.123456)) == 1764950000.123
