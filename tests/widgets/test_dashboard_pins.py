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
    assert "pinned <code>layer2</code> to recompute" in table.status.value
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
    def refuse(units, policy):
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
    assert all(r.pin.disabled and r.policy.disabled for r in table.rows)


def test_a_compress_pin_reads_back_as_compress(search):
    table = PinTable(search)
    table.rows[4].policy.value = "compress"
    table.rows[4].pin.value = True
    assert search.pins["layer4"].startswith("compress:")     # with the default error bound
    table.refresh()
    assert table.rows[4].pin.value and table.rows[4].policy.value == "compress"
