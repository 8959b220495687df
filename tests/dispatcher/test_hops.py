"""The dispatcher's hop log (dispatcher/hops.py): what it writes, and what it forgets."""

import json

from dispatcher import hops


def test_a_followed_task_is_written_once_sent(tmp_path):
    log = hops.HopLog(str(tmp_path / "hops.jsonl"))
    log.notified("a")
    log.claimed(["a", "b"], began=1.0)
    log.sent("a")
    log.sent("b")  # no NOTIFY named it: not followed
    lines = [json.loads(line) for line in (tmp_path / "hops.jsonl").read_text().splitlines()]
    assert [line["task_id"] for line in lines] == ["a"]
    assert lines[0]["notified"] <= lines[0]["sent"] and lines[0]["claim_began"] == 1.0


def test_tasks_that_never_reach_their_next_hop_are_forgotten(tmp_path, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(hops.time, "time", lambda: now[0])
    log = hops.HopLog(str(tmp_path / "hops.jsonl"))
    log.notified("claimed elsewhere")
    log.notified("put back")
    log.claimed(["put back"], began=now[0])
    now[0] += hops.STALE + 1
    log.notified("new")  # prunes
    log.claimed(["claimed elsewhere", "new"], began=now[0])
    for task_id in ("claimed elsewhere", "put back", "new"):
        log.sent(task_id)
    lines = [json.loads(line) for line in (tmp_path / "hops.jsonl").read_text().splitlines()]
    assert [line["task_id"] for line in lines] == ["new"]
