"""Done-when of issue 4: pause, pin, resume — pinned units never change afterwards and the
history continues without a gap. Also unpin, pinned configurations and bad pins."""
import pytest

from memflow.errors import SearchError, StrategyError
from memflow.search import MCMCSearch

from .helpers import FOUR, V100, chain

PINNED = ["l2", "l3", "l4"]


def test_pause_pin_resume():
    g = chain(8)
    search = MCMCSearch(g, V100, memory_limit=0.8 * 250e6, seed=5)
    search.run(iterations=200)                     # ... paused here
    search.pin(PINNED, policy="recompute")
    assert [search.current.policies[g.names.index(u)] for u in PINNED] == ["recompute"] * 3
    assert [search.best.policies[g.names.index(u)] for u in PINNED] == ["recompute"] * 3
    seen = []
    search.run(iterations=200, callback=lambda s: seen.append((s.current, s.best)))
    assert len(seen) == 200
    for current, best in seen:
        for s in (current, best):
            assert [s.policies[g.names.index(u)] for u in PINNED] == ["recompute"] * 3
    h = search.history
    assert h["iteration"].tolist() == list(range(400))
    assert search.pins == {u: "recompute" for u in PINNED}
    assert not h.iloc[200:]["unit"].isin(PINNED).any()


def test_unpin_frees_the_units_again():
    g = chain(6)
    search = MCMCSearch(g, V100, seed=1)
    search.pin("l0", policy="offload").unpin()
    assert search.pins == {}
    search.run(iterations=300)
    assert "l0" in set(search.history["unit"])


def test_pinned_configuration_on_several_gpus():
    g = chain(6, batch=64)
    search = MCMCSearch(g, FOUR, seed=2)
    search.pin(["l1"], config={"sample": 2, "devices": ["gpu2", "gpu3"]})
    search.run(iterations=150, callback=lambda s: s.current.devices[1] == ("gpu2", "gpu3"))
    assert search.iteration == 150
    assert search.best.devices[1] == ("gpu2", "gpu3") and search.pins["l1"] == "keep"


def test_bad_pins_name_what_is_wrong():
    search = MCMCSearch(chain(4), V100)
    with pytest.raises(SearchError, match="'l9' is not a unit of the graph"):
        search.pin(["l9"], policy="recompute")
    with pytest.raises(SearchError, match="pin config key 'speed' is unknown"):
        search.pin(["l1"], config={"speed": 2})
    with pytest.raises(StrategyError, match="unknown memory policy 'swap'"):
        search.pin(["l1"], policy="swap")
    with pytest.raises(StrategyError, match="device 'gpu7' is not in the cluster"):
        search.pin(["l1"], config={"devices": ["gpu7"]})
