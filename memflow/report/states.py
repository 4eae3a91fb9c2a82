"""Model states for people: what a simulated step's GPUs hold in weights, gradients and
optimizer state (:attr:`memflow.SimResult.model_states`), and the strategy's settings that
decide them — precision, optimizer, shard level per unit, optimizer on the host. The HTML
report and ``memflow_widgets.ModelStates`` show the same text.

>>> import memflow
>>> g = memflow.zoo.graph("chain", batch_size=8, n=3, width=16)
>>> four = memflow.Cluster.preset("4xV100-16GB")
>>> s = memflow.Strategy.data_parallel(g, four, shard="parameters", precision="bf16")
>>> r = memflow.simulate(g, s, four, optimizer="adam")
>>> model_states_settings(r)
'precision bf16 · optimizer adam · shard level: parameters (ZeRO-3 / FSDP) on 6 units · optimizer on the host: no unit'
>>> model_states_table(r)["devices"].tolist()
['gpu0,gpu1,gpu2,gpu3']
"""
from __future__ import annotations

import html

import pandas as pd

from .style import device_list, format_bytes

__all__ = ["model_states_table", "model_states_settings", "model_states_html", "SHARD_NAMES",
           "MODEL_STATES_CAPTION"]

SHARD_NAMES = {"none": "none (DDP)", "optimizer": "optimizer (ZeRO-1)",
               "gradients": "gradients (ZeRO-2)", "parameters": "parameters (ZeRO-3 / FSDP)"}
"""How the report names each shard level (:data:`memflow.strategy.SHARD_LEVELS`)."""
MODEL_STATES_CAPTION = (
    "Per GPU, each category's largest size over the step. A sharded state counts the shard the "
    "GPU owns; parameters gathered for a unit's use and a gradient before its reduce-scatter "
    "are communication buffers, and an optimizer on the host is not on the GPU. Master "
    "weights count as optimizer state, as ZeRO counts them (bf16 with Adam: 2 + 2 + 12 bytes "
    "per parameter).")


def model_states_table(result) -> pd.DataFrame:
    """One row per group of GPUs holding the same model states: ``devices`` (shortened),
    ``weights``, ``gradients``, ``optimizer`` and ``total`` bytes."""
    ms = result.model_states.assign(total=lambda d: d.sum(axis=1))
    rows = [{"devices": device_list(list(group.index)), **group.iloc[0].to_dict()}
            for _, group in ms.groupby(list(ms.columns), sort=False)]
    return pd.DataFrame(rows, columns=["devices", *ms.columns])


def model_states_settings(result) -> str:
    """The strategy's model-state settings in one line of text."""
    s = result.strategy
    levels = pd.Series(s.shard_levels).value_counts()
    shard = ", ".join(f"{SHARD_NAMES[lv]} on {n} unit{'s' if n != 1 else ''}"
                      for lv, n in levels.items())
    hosted = int(s.offload_optimizer.sum())
    host = "no unit" if not hosted else f"{hosted} of {len(s)} units"
    return (f"precision {result.precision} · optimizer {result.optimizer} · shard level: "
            f"{shard} · optimizer on the host: {host}")


def model_states_html(result) -> str:
    """:func:`model_states_settings` and :func:`model_states_table` as HTML."""
    table = model_states_table(result)
    for c in table.columns[1:]:
        table[c] = table[c].map(format_bytes)
    return (f"<p>{html.escape(model_states_settings(result))}</p>"
            + table.to_html(index=False, classes="units", border=0)
            + f"<p class='note'>{html.escape(MODEL_STATES_CAPTION)}</p>")
