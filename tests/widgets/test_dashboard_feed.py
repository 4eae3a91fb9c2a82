"""ProgressFeed on the real search: one chart row per call, only when the search moved."""
import math

import pytest

from memflow_widgets.feed import COLUMNS, ProgressFeed


def test_one_row_per_move_of_the_search(search):
    feed = ProgressFeed(window=50)
    first = feed.take(search)
    assert set(first) == set(COLUMNS) and first["iteration"] == [0]
    assert math.isnan(first["rate"][0])                 # no proposal yet
    assert feed.take(search) is None
    search.step(30)
    row = feed.take(search)
    assert row["iteration"] == [30]
    assert row["cost"] == [pytest.approx(search.current_cost)]
    assert row["best_cost"] == [pytest.approx(search.best_cost)]
    assert row["rate"] == [pytest.approx(search.acceptance_rate(50))]


def test_window_must_be_positive():
    with pytest.raises(ValueError, match="ProgressFeed: window must be >= 1"):
        ProgressFeed(window=0)
