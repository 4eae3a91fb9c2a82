"""HistoryFeed: history rows → stream batches; rolling acceptance; bounded points."""
import numpy as np
import pandas as pd
import pytest

from memflow_widgets.feed import HistoryFeed


def rows(start: int, n: int, accepted=None) -> pd.DataFrame:
    it = np.arange(start, start + n)
    return pd.DataFrame({"iteration": it, "cost": 2.0 + np.sin(it), "best_cost": 1.0,
                         "accepted": accepted if accepted is not None else it % 2 == 0})


def test_acceptance_window_spans_batches():
    feed = HistoryFeed(window=4)
    feed.take(rows(0, 2, accepted=[True, True]))
    batch = feed.take(rows(2, 3, accepted=[False, False, False]))
    # windows ending at 2, 3, 4: [T,T,F], [T,T,F,F], [T,F,F,F]
    assert batch["acceptance"]["rate"].tolist() == pytest.approx([2 / 3, 0.5, 0.25])
    assert feed.seen == 5


def test_points_stay_bounded_and_cover_the_whole_run():
    feed = HistoryFeed(max_points=100)
    streamed = []
    for start in range(0, 20_000, 500):
        batch = feed.take(rows(start, 500))
        if batch is not None:
            streamed += batch["cost"]["iteration"].tolist()
    assert feed.seen == 20_000
    assert len(streamed) < 1000                     # not 20,000 points
    assert streamed[0] == 0 and streamed[-1] > 19_000
    assert feed.stride > 1


def test_infinite_costs_become_gaps_and_best_cost_is_kept():
    feed = HistoryFeed()
    batch = feed.take(pd.DataFrame({"iteration": [0, 1], "cost": [np.inf, 2.0],
                                    "best_cost": [np.inf, 2.0], "accepted": [False, True]}))
    assert np.isnan(batch["cost"]["cost"][0]) and np.isnan(batch["cost"]["best_cost"][0])
    assert feed.best_cost == 2.0


def test_missing_columns_are_named():
    with pytest.raises(ValueError, match=r"lacks columns \['best_cost'\]"):
        HistoryFeed().take(pd.DataFrame({"iteration": [0], "cost": [1.0], "accepted": [True]}))
    with pytest.raises(ValueError, match="window must be >= 1"):
        HistoryFeed(window=0)
