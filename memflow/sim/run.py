"""What a simulation gives back (:class:`Evaluation`, :class:`Run`) and what the
:class:`~memflow.sim.simulator.Simulator` keeps per placement (:class:`Placement`) and per
set of layouts (:class:`ByLayouts`) and per strategy (:class:`Prepared`)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..memory.blocks import BlockTable, StepBlocks
from ..memory.records import Placed
from ..strategy.strategy import Strategy
from .expand import Tasks, Timing
from .ledger import Ledger, LedgerPlan
from .structure import Structure

__all__ = ["Evaluation", "Placement", "Run", "ByLayouts", "OfLayouts", "Prepared"]


@dataclass(frozen=True)
class Evaluation:
    """What a search needs from one simulation."""

    iteration_time: float
    peak: np.ndarray          # bytes per device, in cluster order
    capacity: np.ndarray
    feasible: bool
    host_over: float = 0.0    # offloaded bytes over memory on the worst host the strategy uses

    @property
    def over(self) -> float:
        """Bytes over capacity on the worst device or host (0 when feasible)."""
        return max(float(np.max(np.maximum(self.peak - self.capacity, 0.0), initial=0.0)),
                   self.host_over)


@dataclass
class Placement:
    """What the placement of every unit (with stages and micro-batches) decides."""

    placed: Placed
    blocks: BlockTable
    structure: Structure
    timing: Timing
    sets: tuple[np.ndarray, np.ndarray]     # CSR: channel classes of each channel set
    raw_sets: tuple[np.ndarray, np.ndarray]  # CSR: raw channel ids of each channel set
    n_channel_classes: int
    channel_class: np.ndarray
    device_class: np.ndarray
    layout_classes: list[np.ndarray]
    layout_hosts: list[np.ndarray]
    n_device_classes: int
    devices_used: np.ndarray
    mem_rate: np.ndarray                    # per layout, for compression speed
    launch: np.ndarray                      # per layout: seconds per kernel launch
    ledger: LedgerPlan | None = None        # the ledger's classes (rows: any plan's)


@dataclass
class Run:
    """Everything one simulation produced, as arrays (DataFrames are made by SimResult)."""

    strategy: Strategy
    tasks: Tasks
    blocks: StepBlocks
    start: np.ndarray
    end: np.ndarray
    placement: Placement
    device: Ledger
    host: Ledger
    iteration_time: float

    @property
    def duration(self) -> np.ndarray:
        return self.tasks.duration

    @property
    def device_class(self) -> np.ndarray:
        """Class of each device of the cluster (devices with identical ledgers share one)."""
        return self.placement.device_class

    @property
    def channel_class(self) -> np.ndarray:
        return self.placement.channel_class

    @property
    def devices_used(self) -> np.ndarray:
        """Positions of the devices the strategy uses."""
        return self.placement.devices_used

    @cached_property
    def task_channels(self) -> list[tuple[int, ...]]:
        """Channel classes each task occupies."""
        ptr, idx = self.placement.sets
        return [tuple(idx[ptr[s]:ptr[s + 1]].tolist()) for s in self.tasks.channel_set]


@dataclass(frozen=True)
class OfLayouts:
    """What a list of layouts alone fixes, whichever units take them: their costs, rates,
    channel sets and device classes."""

    numbers: np.ndarray                     # per layout: its number (LayoutTable)
    lcs: list                               # per layout: its LayoutCost
    rates: np.ndarray                       # per layout: its rates as one row (LayoutTable)
    channels: tuple[np.ndarray, np.ndarray]  # CSR: compute, comm, to-host, from-host sets
    device_class: np.ndarray
    layout_classes: list[np.ndarray]        # per layout: the device classes of its devices
    layout_hosts: list[np.ndarray]          # hosts of each layout's devices
    devices_used: np.ndarray
    mem_rate: np.ndarray                    # per layout
    launch: np.ndarray
    n_device_classes: int


@dataclass(frozen=True)
class ByLayouts:
    """What the units' layouts (degrees and devices) fix: copy times and the channel
    classes, kept when a move changes only model states or stages, and what the layouts fix
    whichever units take them (``of``)."""

    copy: np.ndarray                        # seconds of each copy
    back: np.ndarray                        # and of its gradient's way back
    raw: tuple[np.ndarray, np.ndarray]      # CSR: raw channel ids of each channel set
    channel_class: np.ndarray
    sets: tuple[np.ndarray, np.ndarray]
    of: OfLayouts
    n_channel_classes: int


@dataclass
class Prepared:
    """What a strategy's structure and the cluster fix before any timing."""

    blocks: StepBlocks
    tasks: Tasks
    placement: Placement
    ledger: LedgerPlan

