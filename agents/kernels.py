"""The one place that decides which implementation runs a network's recurrence and dense layers.

``network.backend`` (``auto|native|graph|scan``) is resolved once, when a network is built, into a
:class:`KernelChoice`; the layers follow it and never re-decide while tracing.

* ``native``: the C++ ops of :mod:`agents.native` (CPU only): the LSTM recurrence, and every
  LayerNorm dense layer as one fused op each way.
* ``graph``: the recurrence unrolled in the TF graph with a hand-written gradient
  (:mod:`agents.sequence_kernels`; ``lstm``, and ``gru`` with ``reset_after``); TF ops for the dense layers.
* ``scan``: the reference ``tf.scan`` recurrence with autodiff; every cell.
* ``auto``: ``native`` for what it covers where the ops load and TF sees no GPU, ``graph`` for the
  recurrence where the cell allows, else ``scan``. Without the ops it logs one warning and goes on.

All of them give the same values and gradients to float32 round-off (tests/test_sequence_kernels.py,
tests/test_native.py).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import TYPE_CHECKING

from agents import native

if TYPE_CHECKING:
    from agents.networks import NetworkConfig

log = logging.getLogger(__name__)

BACKENDS = ("auto", "native", "graph", "scan")
RECURRENCES = ("native", "graph", "scan", "none")  # none: the mlp core has no recurrence
DENSE = ("native", "tf")


@dataclasses.dataclass(frozen=True)
class KernelChoice:
    """What runs a network: ``recurrence`` in :data:`RECURRENCES`, ``dense`` (the LayerNorm dense
    layers) in :data:`DENSE`, and a one-line ``reason`` for the record (summary, TensorBoard)."""

    recurrence: str
    dense: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        """``{"recurrence": ..., "dense": ..., "reason": ...}`` for summary.json."""
        return dataclasses.asdict(self)


def graph_supports(cell: str, reset_after: bool = True) -> bool:
    """Whether :mod:`agents.sequence_kernels` has a graph kernel for this cell."""
    return cell == "lstm" or (cell == "gru" and reset_after)


def gpu_visible() -> bool:
    """Whether TensorFlow sees a GPU (the native ops are CPU-only)."""
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


@functools.cache
def _warn_once(reason: str) -> None:
    log.warning(
        "network.backend=auto: native ops unavailable (%s); using the graph kernel and TF ops", reason
    )


def resolve(
    cell: str, backend: str = "auto", reset_after: bool = True, layer_norm: bool = False
) -> KernelChoice:
    """The implementation for a network with this ``cell`` and ``network.backend``.

    Loads (building if needed) the native ops only when ``backend`` could use them.

    Raises:
        ValueError: an unknown ``backend``, or ``native`` for a cell other than ``lstm``.
        agents.native.NativeUnavailable: ``backend="native"`` where the ops cannot load.
    """
    if backend not in BACKENDS:
        raise ValueError(f"network.backend={backend!r}; allowed: {'|'.join(BACKENDS)}")
    if backend == "native" and cell != "lstm":
        raise ValueError(f"network.backend=native supports cell=lstm, not {cell!r}; allowed: auto|graph|scan")
    fallback = "graph" if graph_supports(cell, reset_after) else "scan"
    if cell == "mlp":
        fallback = "none"
    if backend == "native":
        native.load()
        return KernelChoice("native", "native" if layer_norm else "tf", "network.backend=native")
    if backend in ("graph", "scan"):
        recurrence = fallback if backend == "graph" or cell == "mlp" else "scan"
        why = f"network.backend={backend}"
        if backend == "graph" and recurrence == "scan":
            why += f": no graph kernel for cell={cell}, so tf.scan"
        return KernelChoice(recurrence, "tf", why)
    if not (cell == "lstm" or layer_norm):  # nothing here has a native op: no need to load them
        return KernelChoice(fallback, "tf", f"auto: no native op for cell={cell} without layer_norm")
    if gpu_visible():
        return KernelChoice(fallback, "tf", "auto: TF sees a GPU and the native ops are CPU-only")
    ok, reason = native.available()
    if not ok:
        _warn_once(reason)
        return KernelChoice(fallback, "tf", f"auto: native ops unavailable ({reason})")
    recurrence = "native" if cell == "lstm" else fallback
    return KernelChoice(recurrence, "native" if layer_norm else "tf", "auto: native ops loaded")


def for_network(config: NetworkConfig) -> KernelChoice:
    """The decision for a :class:`agents.networks.NetworkConfig` (what its networks will run)."""
    return resolve(config.cell, config.backend, config.reset_after, config.layer_norm)


def build_native_ahead(config: NetworkConfig) -> tuple[bool, str]:
    """Build (or find) the native ops before training if ``config`` may use them: ``(ok, reason)``.

    Logs "building native ops, about 40 s, once per machine" when it compiles. ``(True, reason)``
    also when the config does not need them (``reason`` says so); an explicit
    ``network.backend=native`` that returns ``(False, reason)`` should stop the run.
    """
    if config.backend in ("graph", "scan"):
        return True, f"network.backend={config.backend} does not use the native ops"
    if config.backend == "auto" and not (config.cell == "lstm" or config.layer_norm):
        return True, f"auto: no native op for cell={config.cell} without layer_norm"
    if config.backend == "auto" and gpu_visible():
        return True, "auto: TF sees a GPU and the native ops are CPU-only"
    return native.available()
