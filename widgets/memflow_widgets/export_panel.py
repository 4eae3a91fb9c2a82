"""ExportPanel: write the search's best strategy to files, from buttons.

* "Export best": the strategy as JSON, written atomically by the strategy's own
  ``to_json(path)`` (``memflow.Strategy.from_json(path)`` reads it back).
* "Export script": a ``torchrun`` training script that runs the best strategy, by
  :func:`memflow.export.script`, next to the JSON path with ``.py`` (the script writes its
  strategy JSON beside it). It needs the model: a :mod:`memflow.zoo` name or
  ``path/to/file.py:factory``; the field starts with the graph's model name, which is the zoo
  name for zoo graphs (``memflow.export`` names the valid ones when it is not).

A dashboard passes ``call`` (its runner's :meth:`~memflow_widgets.runner.SearchRunner.call`) so
that a click reads the best strategy between two chunks of steps, not during one.
"""
from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Callable

import ipywidgets

import memflow

__all__ = ["ExportPanel"]


class ExportPanel(ipywidgets.VBox):
    """Paths, the two export buttons and a line saying what was written (or why not)."""

    def __init__(self, search: Any, *, path: str = "best_strategy.json",
                 call: Callable[..., None] | None = None) -> None:
        self.search = search
        self._call = call or (lambda fn, *args: fn(*args))
        self.path = ipywidgets.Text(value=path, description="export to",
                                    layout=ipywidgets.Layout(width="360px"))
        self.button = ipywidgets.Button(description="Export best", icon="download",
                                        button_style="info")
        self.model = ipywidgets.Text(value=str(search.graph.meta.get("model", "")),
                                     description="model",
                                     placeholder="zoo name or path/to/file.py:factory",
                                     layout=ipywidgets.Layout(width="360px"))
        self.script_button = ipywidgets.Button(description="Export script", icon="file-code-o",
                                               button_style="info")
        self.status = ipywidgets.HTML()
        self.button.on_click(lambda _: self._call(self.export))
        self.script_button.on_click(lambda _: self._call(self.export_script))
        super().__init__([ipywidgets.HBox([self.path, self.button]),
                          ipywidgets.HBox([self.model, self.script_button]), self.status])

    def _json_path(self) -> Path:
        return Path(self.path.value.strip() or "best_strategy.json").expanduser()

    def _attempt(self, what: str, target: Path, write: Callable[[], Any]) -> Path | None:
        try:
            write()
        except Exception as exc:   # a bad path, model or strategy: say which, do not raise
            self.status.value = (f"<span style='color:#d62728'>{what} to "
                                 f"{html.escape(str(target))} failed: "
                                 f"{html.escape(str(exc))}</span>")
            return None
        self.status.value = f"wrote <code>{html.escape(str(target))}</code>"
        return target

    def export(self) -> Path | None:
        """Write the best strategy as JSON to :attr:`path`; return the path (None on failure)."""
        target = self._json_path()
        return self._attempt("export", target, lambda: self.search.best.to_json(target))

    def export_script(self) -> Path | None:
        """Write a training script of the best strategy (``.py`` beside the JSON path) for
        :attr:`model`; return its path (None on failure)."""
        target = self._json_path().with_suffix(".py")
        model = self.model.value.strip()
        if not model:
            self.status.value = ("<span style='color:#d62728'>Export script: give the model "
                                 "(a memflow.zoo name or path/to/file.py:factory)</span>")
            return None
        meta = self.search.graph.meta
        return self._attempt("script export", target, lambda: memflow.export.script(
            self.search.best, target, model=model, batch_size=int(meta["batch_size"]),
            optimizer=self.search.settings["optimizer"]))
