"""What the policy's replies looked like (gateway/replies.py), as hand-computed tables: each row is a set of
model calls (sampled ids, finish reason) and the three figures a reader can check by hand."""

from __future__ import annotations

import pytest

from harnessrl.gateway.replies import ReplyCounts, ReplyFigures, reply_counts


@pytest.mark.parametrize(
    ("calls", "figures"),
    [
        pytest.param([], ReplyFigures(None, None, None), id="no-call"),
        # 4 tokens, 3 bigrams, all distinct
        pytest.param([([1, 2, 3, 4], "stop")], ReplyFigures(4.0, 0.0, 1.0), id="one-clean-reply"),
        # a reply looping on one token until the budget cut it: bigrams (5,5) x 4, one distinct
        pytest.param([([5, 5, 5, 5, 5], "length")], ReplyFigures(5.0, 1.0, 0.25), id="loop-cut-by-budget"),
        # (7,8),(8,7),(7,8): 2 distinct of 3 | (1,2): 1 of 1  -> 3 of 4; 6 tokens over 2 calls; 1 cut of 2
        pytest.param(
            [([7, 8, 7, 8], "length"), ([1, 2], "stop")],
            ReplyFigures(3.0, 0.5, 0.75),
            id="pooled-over-replies",
        ),
        # bigrams never span two replies: (1,2) in each reply counts once per reply, both distinct in theirs
        pytest.param(
            [([1, 2], "stop"), ([1, 2], "stop")], ReplyFigures(2.0, 0.0, 1.0), id="within-each-reply"
        ),
        # one-token and empty replies have no bigram: tokens count, distinct-2 has nothing to count
        pytest.param([([9], "stop"), ([], "length")], ReplyFigures(0.5, 0.5, None), id="no-bigram"),
        # an aborted generation is continued by the gateway and never journalled as "abort"; were one, it is
        # not a budget cut
        pytest.param([([1, 2], "abort"), ([3], "stop")], ReplyFigures(1.5, 0.0, 1.0), id="abort-is-no-cut"),
    ],
)
def test_reply_figures(calls: list[tuple[list[int], str]], figures: ReplyFigures):
    assert reply_counts(calls).figures() == figures


def test_counts_add_up_across_groups_and_rows_read_back():
    """A step's figures are its groups' counts summed (not the mean of the groups' ratios); a row written
    before the figures existed reads back as None for each."""
    a, b = reply_counts([([1, 1, 1], "length")]), reply_counts([([1, 2], "stop"), ([3, 4], "stop")])
    total = sum([a, b], ReplyCounts())
    assert total == ReplyCounts(calls=3, tokens=7, length_finishes=1, bigrams=4, distinct_bigrams=3)
    assert total.figures() == ReplyFigures(7 / 3, 1 / 3, 0.75)
    assert ReplyFigures.from_row(total.figures().row()) == total.figures()
    assert ReplyFigures.from_row({"step": 3, "loss": 0.1}) == ReplyFigures()
