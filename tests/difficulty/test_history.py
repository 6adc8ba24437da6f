from __future__ import annotations

import json

import pytest

from harnessrl.difficulty.history import PassRateHistory


def test_history_rounds_recent_rate_and_skip(tmp_path):
    path = tmp_path / "history.jsonl"
    h = PassRateHistory(path)
    h.record_round(0, {"a": (4, 0), "b": (4, 2), "c": (4, 4), "d": (0, 0)})
    h.record_round(1, {"a": (4, 1), "b": (4, 4), "c": (4, 4)})
    h.record_round(2, {"a": (4, 0), "b": (4, 4)})
    h = PassRateHistory(path)  # reload from disk
    assert h.rounds == [0, 1, 2]
    rates = h.recent_pass_rates(last_k=2)
    assert rates == {"a": 1 / 8, "b": 1.0, "c": 1.0}  # c: its last 2 recorded rounds; d never finished one
    assert h.recent_pass_rates(last_k=3)["b"] == 10 / 12
    assert h.skip_for_dynamic_sampling(last_k=2) == {"b", "c"}
    assert h.skip_for_dynamic_sampling(last_k=1) == {"a", "b", "c"}
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[0] == {"group_id": "a", "round": 0, "n": 4, "passes": 0}
    assert set(rows[0]) == {"group_id", "round", "n", "passes"}


def test_rerunning_a_round_replaces_it(tmp_path):
    h = PassRateHistory(tmp_path / "h.jsonl")
    h.record_round(0, {"a": (4, 1)})
    h.record_round(0, {"a": (4, 3)})
    assert len(PassRateHistory(tmp_path / "h.jsonl").rows) == 1
    assert h.recent_pass_rates() == {"a": 0.75}


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"group_id": "a", "round": 0, "n": 4}', "missing field 'passes'"),
        ('{"group_id": "a", "round": 0, "n": 2, "passes": 3}', "0 <= passes <= n"),
        ('{"group_id": "a", "round": "x", "n": 2, "passes": 1}', "must be integers"),
        (
            '{"group_id": "a", "round": 0, "n": 2, "passes": 1}\n{"group_id": "a", "round": 0, "n": 2, "passes": 1}',
            "duplicate",
        ),
        ('{"group_id": "a", "round": 0', "malformed JSON"),
    ],
)
def test_bad_history_rows_name_file_and_row(tmp_path, line, message):
    path = tmp_path / "h.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=message) as e:
        PassRateHistory(path)
    assert str(path) in str(e.value)


def test_rates_before_a_round_ignore_that_round_and_later(tmp_path):
    h = PassRateHistory(tmp_path / "h.jsonl")
    h.record_round(0, {"a": (4, 0), "b": (4, 2)})
    h.record_round(1, {"a": (4, 4), "b": (4, 4)})
    assert h.recent_pass_rates(3, before_round=1) == {"a": 0.0, "b": 0.5}
    assert h.skip_for_dynamic_sampling(3, before_round=1) == {"a"}
    assert h.recent_pass_rates(3) == {"a": 0.5, "b": 0.75}
