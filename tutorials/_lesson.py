"""Small helpers shared by the lessons in ``tutorials/`` (everything else is memflow's own API).

* :func:`line_chart` — a quick bokeh line chart for numbers that no memflow view draws
  (a trade-off curve, acceptance rate against temperature);
* :func:`show_hints` — a check that fails shows its hint alone, not a Python traceback;
* :func:`profile_step` and :func:`cuda_profile_step` — a real training step's memory after
  every operation, measured with PyTorch's own tools (MemTracker on any machine, the CUDA
  caching allocator's memory snapshots on a GPU), and :func:`measured_chart` to draw it;
* :func:`student_copy` — the teacher's tool: copies of the lessons with every reference answer
  blanked, the teacher's model answers left out and the outputs cleared, for students to fill
  in (``python tutorials/_lesson.py --student OUT_DIR``).

A reference answer is an assignment or a ``return`` in a code cell whose last line ends in
``# reference answer``::

    adam_bytes = 2 * trainable  # reference answer

In the student copy it becomes ``adam_bytes = ...  # your answer`` (a statement spread over
several lines becomes one line), so the check cell below it fails until the student writes an
answer. The lessons' text names the marker as the teacher's copy shows it (`` `# reference
answer` ``); the student copy names it `` `# your answer` ``, as its cells show it. A markdown
cell that starts with ``**Model answer`` answers an *explain why* question for the teacher and
is left out of the student copy.

>>> print(blank_answers("x = 2 * y  # reference answer\\nprint(x)"))
x = ...  # your answer
print(x)
>>> print(blank_answers("def f(a):\\n    return min(a,\\n               0)  # reference answer"))
def f(a):
    return ...  # your answer
"""
from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = ["line_chart", "show_hints", "profile_step", "cuda_profile_step", "allocator_timeline",
           "measured_chart", "blank_answers", "student_text", "student_copy",
           "LESSONS", "MODEL_ANSWER"]

LESSONS = sorted(p.name for p in Path(__file__).parent.glob("[0-9][0-9]_*.ipynb"))
"""The lesson notebooks, in order."""

_MARK = re.compile(r"#\s*reference answer\s*$")
MODEL_ANSWER = "**Model answer"
"""How a teacher-only markdown cell (the answer to an *explain why* question) starts."""
CATEGORY_ORDER = ("weights", "optimizer", "gradients", "activations", "transient")
"""The memory categories a measured step shows, bottom of the stack first (memflow's order)."""
_PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#64b5cd", "#8172b3", "#937860", "#da8bc3")


def line_chart(data: Any, x: str, ys: Sequence[str] | Mapping[str, str], *, title: str = "",
               x_label: str | None = None, y_label: str = "", log_x: bool = False,
               log_y: bool = False, width: int = 640, height: int = 300, show: bool = True):
    """One line (with markers) per column of ``ys`` against column ``x`` of ``data``.

    ``data`` is a DataFrame or a dict of columns; ``ys`` a list of column names or a mapping
    column -> legend label. The figure is shown (bokeh must have been set up in the notebook,
    e.g. by ``memflow_widgets.setup()``) and returned.
    """
    import pandas as pd
    from bokeh.models import ColumnDataSource
    from bokeh.plotting import figure

    frame = pd.DataFrame(data).reset_index(drop=isinstance(data, dict))
    labels = dict(ys) if isinstance(ys, Mapping) else {c: c for c in ys}
    fig = figure(width=width, height=height, title=title, x_axis_label=x_label or x,
                 y_axis_label=y_label, x_axis_type="log" if log_x else "linear",
                 y_axis_type="log" if log_y else "linear", tools="pan,wheel_zoom,reset,save")
    source = ColumnDataSource(frame)
    for i, (col, label) in enumerate(labels.items()):
        color = _PALETTE[i % len(_PALETTE)]
        fig.line(x, col, source=source, color=color, line_width=2, legend_label=label)
        fig.scatter(x, col, source=source, color=color, size=6, legend_label=label)
    return _finish(fig, show, location="top_right", click_policy="hide")


def _finish(fig, show: bool, **legend: Any):
    """``fig`` with its legend's ``legend`` settings and no logo, shown if ``show``."""
    from bokeh.io import show as bokeh_show

    for name, value in legend.items():
        setattr(fig.legend, name, value)
    fig.toolbar.logo = None
    if show:
        bokeh_show(fig)
    return fig


# MemTracker's categories in memflow's words (memflow.report.style.CATEGORIES). "Other" is what
# track_external counts beyond modules and optimizers: nothing in the lessons' steps.
MEMTRACKER_CATEGORIES = {"Parameter": "weights", "Buffer": "weights", "Gradient": "gradients",
                         "Optstate": "optimizer", "Activation": "activations",
                         "Temp": "transient", "Other": "transient"}


def _training_step(module, inputs: Sequence[Any], optimizer, loss):
    def step() -> None:
        loss(module(*inputs)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def profile_step(module, inputs: Sequence[Any], optimizer, loss):
    """Memory after every operation of one training step (``loss(module(*inputs))``, backward,
    ``optimizer.step()``, ``zero_grad``), measured by PyTorch's MemTracker.

    A first step runs untracked (it creates the optimizer's state: the steady state starts at
    the second). Returns a DataFrame, one row per operation: ``op`` (its index), ``name`` (the
    aten operator), ``phase`` (forward, backward or optimizer), ``bytes`` and one column per
    memflow category (:data:`MEMTRACKER_CATEGORIES`). MemTracker counts every tensor storage
    as PyTorch allocates and frees it, on any device, CPU included.

    >>> import torch
    >>> layer = torch.nn.Linear(4, 2)
    >>> sgd = torch.optim.SGD(layer.parameters(), lr=0.1)
    >>> step = profile_step(layer, (torch.ones(8, 4),), sgd, lambda y: y.sum())
    >>> int(step["weights"].max()), sorted(set(step["phase"]))     # 4 * (4*2 + 2) bytes
    (40, ['backward', 'forward', 'optimizer'])
    >>> measured_chart(step, show=False).title.text
    'measured'
    """
    import pandas as pd
    from torch.distributed._tools.mem_tracker import MemTracker

    class Recorder(MemTracker):
        """MemTracker that also keeps its running totals after each operation (read from its
        private state, as of torch 2.13: MemTracker offers only the current and peak totals)."""

        rows: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            snap = next(iter(self._curr_mem_snap.values()), {})
            row = dict.fromkeys(CATEGORY_ORDER, 0)
            for ref, n in snap.items():
                if ref in MEMTRACKER_CATEGORIES:      # skips the "Total" key
                    row[MEMTRACKER_CATEGORIES[ref]] += n
            phase = ("optimizer" if self._in_opt else
                     "backward" if self._mod_tracker.is_bw else "forward")
            self.rows.append({"name": str(func.overloadpacket.__name__), "phase": phase, **row})
            return out

    step = _training_step(module, inputs, optimizer, loss)
    step()
    tracker = Recorder()
    tracker.rows = []
    tracker.track_external(module, optimizer)
    with tracker:
        step()
    frame = pd.DataFrame(tracker.rows)
    frame.insert(0, "op", range(len(frame)))
    frame.insert(3, "bytes", frame[list(CATEGORY_ORDER)].sum(axis=1))
    return frame


def cuda_profile_step(module, inputs: Sequence[Any], optimizer, loss):
    """Memory after every allocation and free of one training step on a GPU, from the CUDA
    caching allocator's own record (``torch.cuda.memory._record_memory_history``).

    A first step runs unrecorded, as in :func:`profile_step`. Returns a DataFrame, one row per
    event: ``event``, ``action`` (``alloc``, ``free_completed``...), ``allocated`` (bytes in live
    blocks, each rounded up by the allocator) and ``reserved`` (bytes of the segments it holds
    from the driver). The allocator records no categories.

    >>> trace = cuda_profile_step(layer.cuda(), (torch.ones(8, 4, device="cuda"),),
    ...                           sgd, lambda y: y.sum())      # doctest: +SKIP
    >>> bool((trace["reserved"] >= trace["allocated"]).all())  # doctest: +SKIP
    True
    """
    import torch

    step = _training_step(module, inputs, optimizer, loss)
    step()
    torch.cuda.synchronize()
    base_allocated = torch.cuda.memory_allocated()
    base_reserved = torch.cuda.memory_reserved()
    # clear_history: only this step's events, not those of an earlier call
    torch.cuda.memory._record_memory_history(max_entries=200_000, clear_history=True)
    try:
        step()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return allocator_timeline(snapshot["device_traces"][torch.cuda.current_device()],
                              base_allocated, base_reserved)


# How each allocator event changes (allocated, reserved); segment_map/unmap are how expandable
# segments grow and shrink. free_requested changes nothing until its free_completed.
_ALLOCATOR_CHANGE = {"alloc": (1, 0), "free_completed": (-1, 0), "segment_alloc": (0, 1),
                     "segment_free": (0, -1), "segment_map": (0, 1), "segment_unmap": (0, -1)}


def allocator_timeline(trace: Sequence[Mapping[str, Any]], allocated: int = 0,
                       reserved: int = 0):
    """:func:`cuda_profile_step`'s table from one device's trace of a CUDA memory snapshot
    (``torch.cuda.memory._snapshot()["device_traces"][device]``), starting from ``allocated``
    and ``reserved`` bytes.

    >>> trace = [{"action": "segment_alloc", "size": 2 << 20}, {"action": "alloc", "size": 512},
    ...          {"action": "free_requested", "size": 512}, {"action": "free_completed", "size": 512}]
    >>> allocator_timeline(trace)[["allocated", "reserved"]].values.tolist()
    [[0, 2097152], [512, 2097152], [512, 2097152], [0, 2097152]]
    """
    import pandas as pd

    rows = []
    for event in trace:
        da, dr = _ALLOCATOR_CHANGE.get(event["action"], (0, 0))
        allocated += da * event["size"]
        reserved += dr * event["size"]
        rows.append({"action": event["action"], "allocated": allocated, "reserved": reserved})
    frame = pd.DataFrame(rows, columns=["action", "allocated", "reserved"])
    frame.insert(0, "event", range(len(frame)))
    return frame


def measured_chart(frame, *, x: str = "op", title: str = "measured", width: int = 800,
                   height: int = 260, show: bool = True):
    """A measured profile drawn as memflow draws a predicted one: :func:`profile_step`'s
    categories stacked in memflow's colours, or :func:`cuda_profile_step`'s ``allocated`` and
    ``reserved`` as lines. Shown (bokeh set up in the notebook) and returned."""
    from bokeh.models import ColumnDataSource, HoverTool
    from bokeh.plotting import figure
    from memflow.report.style import CATEGORY_COLORS

    data = frame.assign(**{c: frame[c] / 2**20 for c in frame.columns
                           if c in (*CATEGORY_ORDER, "bytes", "allocated", "reserved")})
    source = ColumnDataSource(data)
    fig = figure(width=width, height=height, title=title, y_axis_label="MiB",
                 x_axis_label="operations run" if x == "op" else "allocator events",
                 tools="xpan,xwheel_zoom,reset,save")
    if "bytes" in frame:
        cats = [c for c in CATEGORY_ORDER if frame[c].any()]
        fig.varea_stack(stackers=cats, x=x, source=source, alpha=0.85,
                        color=[CATEGORY_COLORS[c] for c in cats], legend_label=cats)
        line = fig.line(x, "bytes", source=source, color="#222222", line_width=1)
        tips = [("op", "@name (@phase)"), ("memory", "@bytes{0,0.00} MiB"),
                *[(c, f"@{c}{{0,0.00}} MiB") for c in cats]]
    else:
        fig.line(x, "reserved", source=source, color=_PALETTE[4], line_width=2,
                 legend_label="reserved (segments)")
        line = fig.line(x, "allocated", source=source, color=_PALETTE[2], line_width=2,
                        legend_label="allocated (blocks)")
        tips = [("event", "@action"), ("allocated", "@allocated{0,0.00} MiB"),
                ("reserved", "@reserved{0,0.00} MiB")]
    fig.add_tools(HoverTool(mode="vline", renderers=[line], tooltips=tips))
    return _finish(fig, show, location="top_left", orientation="horizontal")


def show_hints() -> None:
    """Make a failed check show its hint in one line, not a traceback: an ``AssertionError``
    raised in a notebook cell prints ``Not yet: <its message>``; other errors are untouched.
    Outside IPython it does nothing.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return

    def hint(shell, etype, value, tb, tb_offset=None):
        stb = [f"\x1b[1;31mNot yet:\x1b[0m {value or 'this check does not hold yet'}"]
        shell._showtraceback(etype, value, stb)   # published as the cell's error, like any
        return stb

    shell.set_custom_exc((AssertionError,), hint)


def student_text(markdown: str) -> str:
    """A markdown cell as the student copy shows it: the answer marker as its cells show it.

    >>> student_text("write it on the line ending in `# reference answer`")
    'write it on the line ending in `# your answer`'
    """
    return markdown.replace("# reference answer", "# your answer")


def blank_answers(source: str) -> str:
    """``source`` (a code cell) with every reference answer replaced by ``...``."""
    lines = source.splitlines()
    try:
        tree = ast.parse(source)
    except SyntaxError:        # IPython magics: leave the cell as it is
        return source
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.Return)) and \
                _MARK.search(lines[node.end_lineno - 1]):
            first = lines[node.lineno - 1]
            indent = first[:len(first) - len(first.lstrip())]
            if isinstance(node, ast.Return):
                head = "return"
            else:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                head = " = ".join(ast.get_source_segment(source, t) for t in targets) + " ="
            spans.append((node.lineno, node.end_lineno, f"{indent}{head} ...  # your answer"))
    for start, end, text in sorted(spans, reverse=True):
        lines[start - 1:end] = [text]
    return "\n".join(lines)


def student_copy(out_dir: str | Path, lessons: Sequence[str] | None = None) -> list[Path]:
    """Write the lessons (file names, or paths to lessons in ``tutorials/``) to ``out_dir`` with
    reference answers blanked, model answers left out and outputs cleared.

    Returns the paths written. ``_lesson.py`` is copied too, so the copies run on their own.
    """
    import shutil

    import nbformat

    here = Path(__file__).parent
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for lesson in lessons or LESSONS:
        # a lesson is named by its file name or by a path to it (tutorials/02_...ipynb); the copy
        # always goes into out_dir, never over the lesson
        name = Path(lesson).name
        nb = nbformat.read(here / name, as_version=4)
        nb.cells = [c for c in nb.cells
                    if not (c.cell_type == "markdown" and c.source.startswith(MODEL_ANSWER))]
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = student_text(cell.source)
            elif cell.cell_type == "code":
                cell.source = blank_answers(cell.source)
                cell.outputs, cell.execution_count = [], None
        nb.metadata.pop("widgets", None)
        nbformat.write(nb, out / name)
        written.append(out / name)
    shutil.copy(here / "_lesson.py", out / "_lesson.py")
    return written


def _main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="memflow tutorials: teacher's tools")
    parser.add_argument("--student", metavar="OUT_DIR", required=True,
                        help="write student copies of the lessons (answers blanked) here")
    parser.add_argument("lessons", nargs="*", help="lesson notebooks (default: all)")
    args = parser.parse_args(argv)
    for path in student_copy(args.student, args.lessons or None):
        print(path)


if __name__ == "__main__":
    _main()
