"""Write one benchmark's table into its own section of benchmarks/RESULTS.md.

Each benchmark owns a section between ``<!-- begin NAME -->`` and ``<!-- end NAME -->``; running
it again replaces only that section and stamps it with the machine and the date, so figures from
different scripts live side by side. The file is written atomically.
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import sys
from pathlib import Path

import pandas as pd

RESULTS = Path(__file__).with_name("RESULTS.md")
_HEADER = ("# memflow benchmark results\n\n"
           "Each section is written by the script it names; run it again to refresh it.\n")


def machine() -> str:
    """A one-line description of this machine (CPU, cores, Python, torch)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import torch
        tv = torch.__version__
    except ImportError:  # pragma: no cover
        tv = "none"
    return (f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"torch {tv}")


def table(df: pd.DataFrame, floatfmt: str = ".4g") -> str:
    """A DataFrame as a Markdown table (no extra dependency)."""
    cols = [str(c) for c in df.columns]
    idx = df.index.name is not None or not isinstance(df.index, pd.RangeIndex)
    head = ([str(df.index.name or "")] if idx else []) + cols
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, row in df.iterrows():
        cells = [str(key)] if idx else []
        for v in row:
            if isinstance(v, float):
                cells.append(format(v, floatfmt) if v == v else "")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_section(name: str, body: str, *, title: str | None = None,
                  command: str | None = None) -> Path:
    """Replace (or add) section ``name`` of RESULTS.md with ``body`` (Markdown)."""
    command = command or "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:])
    stamp = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    block = (f"<!-- begin {name} -->\n## {title or name}\n\n"
             f"`{command}` — {stamp}, {machine()}\n\n{body.strip()}\n<!-- end {name} -->")
    text = RESULTS.read_text() if RESULTS.exists() else _HEADER
    pattern = re.compile(rf"<!-- begin {re.escape(name)} -->.*?<!-- end {re.escape(name)} -->",
                         re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else \
        text.rstrip() + "\n\n" + block + "\n"
    tmp = RESULTS.with_suffix(".md.tmp")
    tmp.write_text(text)
    os.replace(tmp, RESULTS)
    return RESULTS


def refine_columns(r: dict) -> dict:
    """The columns every planner's table gives for ``memflow.search.refine``'s answer ``r``."""
    return {"plan time (s)": r["plan_time"], "search best (s)": r["search_time"],
            "speedup": r["speedup"], "search fits": r["search_fits"],
            "never worse": r["never_worse"]}
