"""A node agent's run records (agent.json in each run's folder), as a restarted agent reads
them back: what it cannot report is not its to act on."""

from __future__ import annotations

import json

from reconciler.nodeagent.records import RECORD, Record, load


def test_a_saved_record_reads_back_whole(tmp_path):
    record = Record("job", "uid-1", 2, 7, str(tmp_path), pid=123, process_start_time=1.5, exit_code=3)
    record.save()
    assert load(tmp_path) == record


def test_a_record_holding_an_integer_no_report_may_carry_is_not_read(tmp_path):
    """The run can write its own folder: an integer past 64 bits would have the server refuse
    (422) every batch of reports it was in, and the agent send that batch again and again."""
    Record("job", "uid-1", 2, 7, str(tmp_path), exit_code=0).save()
    document = json.loads((tmp_path / RECORD).read_text())
    for field, value in (("exit_code", 2**64), ("signal", -(2**63) - 1), ("peak_memory", 2**63)):
        (tmp_path / RECORD).write_text(json.dumps({**document, field: value}))
        assert load(tmp_path) is None, field
    (tmp_path / RECORD).write_text(json.dumps({**document, "peak_memory": 2**63 - 1}))
    loaded = load(tmp_path)
    assert loaded is not None and loaded.peak_memory == 2**63 - 1


def test_a_record_that_is_not_json_is_not_read(tmp_path):
    (tmp_path / RECORD).write_text("{")
    assert load(tmp_path) is None
