"""ModelStates: what every GPU of a simulated step holds in weights, gradients and optimizer
state, with the strategy's precision, optimizer, shard levels and optimizer placement.

The text is :func:`memflow.report.states.model_states_html` (the HTML report shows the same);
the view keeps no state of its own: :meth:`update` redraws it from another result.

>>> import memflow
>>> g = memflow.zoo.graph("chain", batch_size=8, n=3, width=16)
>>> two = memflow.Cluster.preset("2xV100-16GB")
>>> s = memflow.Strategy.data_parallel(g, two, shard="optimizer")
>>> view = ModelStates(memflow.simulate(g, s, two, optimizer="adam"))
>>> "optimizer (ZeRO-1)" in view.value
True
>>> view._repr_mimebundle_()["text/html"] == view.value
True
"""
from __future__ import annotations

from typing import Any

import ipywidgets

from memflow.report.states import model_states_html

__all__ = ["ModelStates"]


class ModelStates(ipywidgets.HTML):
    """Model states per GPU of ``result`` (a :class:`memflow.SimResult`) as an HTML widget."""

    def __init__(self, result: Any, **kwargs: Any) -> None:
        super().__init__(model_states_html(result), **kwargs)

    def update(self, result: Any) -> None:
        """Show ``result``'s model states instead."""
        self.value = model_states_html(result)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        # the same HTML as text/html too: what nbconvert and notebook viewers show, where no
        # widget state is saved (a static page would otherwise show nothing)
        data = super()._repr_mimebundle_(**kwargs)
        data["text/html"] = self.value
        return data
