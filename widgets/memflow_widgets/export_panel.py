"""ExportPanel: write the search's best strategy to a file, from a button.

The strategy is written as JSON, atomically, by the strategy's own ``to_json(path)`` (so
``memflow.Strategy.from_json(path)`` reads it back); the file name is typed in the panel.
"""
from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import ipywidgets

__all__ = ["ExportPanel"]


class ExportPanel(ipywidgets.HBox):
    """A path, an "Export best" button and a line saying what was written (or why not)."""

    def __init__(self, search: Any, *, path: str = "best_strategy.json") -> None:
        self.search = search
        self.path = ipywidgets.Text(value=path, description="export to",
                                    layout=ipywidgets.Layout(width="360px"))
        self.button = ipywidgets.Button(description="Export best", icon="download",
                                        button_style="info")
        self.status = ipywidgets.HTML()
        self.button.on_click(lambda _: self.export())
        super().__init__([self.path, self.button, self.status])

    def export(self) -> Path | None:
        """Write the best strategy to :attr:`path`; return the path (None if it failed)."""
        target = Path(self.path.value.strip() or "best_strategy.json").expanduser()
        try:
            self.search.best.to_json(target)
        except Exception as exc:   # a bad path or a strategy that cannot be written: say which
            self.status.value = (f"<span style='color:#d62728'>export to "
                                 f"{html.escape(str(target))} failed: "
                                 f"{html.escape(str(exc))}</span>")
            return None
        self.status.value = f"wrote <code>{html.escape(str(target))}</code>"
        return target
