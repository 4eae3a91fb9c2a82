"""PinTable: pages of units; a tick pins in the search, an untick unpins; errors are shown."""
from memflow_widgets.pins import PinTable


def names(table):
    return [r.pin.description for r in table.rows if r.box.layout.display != "none"]


def test_pages_and_filter(search):
    table = PinTable(search, page_size=4)
    assert names(table) == ["layer0", "layer1", "layer2", "layer3"]
    assert table.where.value == "1–4 of 10" and table.page.max == 3
    table.next_page.click()
    assert names(table) == ["layer4", "layer5", "layer6", "layer7"]
    table.next_page.click()
    table.next_page.click()                         # past the end: stays on the last page
    assert names(table) == ["layer8", "layer9"] and table.page.value == 3
    table.filter.value = "layer1"
    assert names(table) == ["layer1"] and table.page.value == 1
    table.filter.value = "zzz"
    assert names(table) == [] and table.where.value == "no unit matches"


def test_tick_pins_untick_unpins_and_policy_repins(search):
    table = PinTable(search, page_size=4)
    row = table.rows[2]
    row.pin.value = True
    assert search.pins == {"layer2": "recompute"}
    assert "pinned <code>layer2</code> to recompute, shard none" in table.status.value
    row.policy.value = "offload"
    assert search.pins == {"layer2": "offload"}
    table.next_page.click()
    table.prev_page.click()                         # the tick is read back from the search
    assert table.rows[2].pin.value and table.rows[2].policy.value == "offload"
    table.rows[2].pin.value = False
    assert search.pins == {}
    assert not table.rows[2].pin.value


def test_policy_change_of_an_unticked_unit_pins_nothing(search):
    table = PinTable(search)
    table.rows[0].policy.value = "compress"
    assert search.pins == {}


def test_a_refused_pin_is_explained_and_undone(search, monkeypatch):
    def refuse(units, policy, config=None):
        raise ValueError("unit 'layer1' cannot be offloaded on this cluster")
    monkeypatch.setattr(search, "pin", refuse)
    table = PinTable(search)
    table.rows[1].policy.value = "offload"
    table.rows[1].pin.value = True
    assert "cannot pin layer1: unit &#x27;layer1&#x27; cannot be offloaded" in table.status.value
    assert not table.rows[1].pin.value


def test_rows_show_saved_bytes_and_best_policy(search):
    table = PinTable(search)
    assert "Linear, saves 1.00 KiB; best: keep" in table.rows[0].info.value
    table.rows[0].pin.value = True              # the search re-checks its best with the pin
    assert "best: recompute" in table.rows[0].info.value
    table.set_enabled(False)
    assert all(r.pin.disabled and r.policy.disabled and r.shard.disabled and r.place.disabled
               for r in table.rows) and table.precision.disabled


def test_a_compress_pin_reads_back_as_compress(search):
    table = PinTable(search)
    table.rows[4].policy.value = "compress"
    table.rows[4].pin.value = True
    assert search.pins["layer4"].startswith("compress:")     # with the default error bound
    table.refresh()
    assert table.rows[4].pin.value and table.rows[4].policy.value == "compress"


def test_model_state_pins_shard_level_optimizer_place_and_precision(search):
    """A tick pins the unit's shard level and optimizer place beside its policy; the search
    keeps them (and the pinned precision) through its steps; one export cannot run is refused."""
    table = PinTable(search, page_size=4)
    row = table.rows[1]
    row.shard.value, row.place.value = "parameters", "host"
    assert search.pin_configs == {}                 # nothing pinned before the tick
    row.pin.value = True
    assert search.pin_configs == {"layer1": {"shard": "parameters", "optimizer_place": "host"}}
    table.precision.value = "bf16"
    assert search.pinned_precision == "bf16" and "pinned precision bf16" in table.status.value
    search.run(iterations=30)
    for s in (search.current, search.best):
        i = list(s.units).index("layer1")
        assert s.shard_levels[i] == "parameters" and s.offload_optimizer[i]
        assert s.precision == "bf16"
    table.refresh()                                 # read back from the search
    assert (row.pin.value, row.shard.value, row.place.value) == (True, "parameters", "host")
    assert table.precision.value == "bf16"
    # ZeRO-1 cannot shard bf16's fp32 master weights in export: refused, the tick undone
    other = table.rows[2]
    other.shard.value = "optimizer"
    other.pin.value = True
    assert "cannot pin layer2" in table.status.value and "ZeroRedundancyOptimizer" in \
        table.status.value
    assert not other.pin.value and "layer2" not in search.pin_configs
    table.precision.value = ""                      # the search chooses again
    assert search.pinned_precision is None
    row.pin.value = False
    assert search.pin_configs == {} and search.pins == {}
