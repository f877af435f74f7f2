"""Recurrent cores with one set of weights for sequence training (TF) and per-step acting (numpy).

Weights use Keras' own cell layouts (``LSTMCell``: gates i, f, c, o; ``GRUCell``: z, r, h with a
``[2, 3U]`` bias when ``reset_after``), so a trained core can be loaded into ``keras.layers.LSTM`` or
``keras.layers.GRU`` (and their cuDNN kernels) unchanged. ``lstm_peephole`` adds the diagonal
peephole weights of the classic ``LSTMCell(use_peepholes=True)``. ``mlp`` is a dense layer with no
state: the memoryless baseline.

Two implementations share those weights:

* :func:`agents.sequence_kernels.unroll` (TF, for the learner): the input projection of all time
  steps is one large matmul, then the recurrence runs with the state zeroed wherever ``first`` marks
  an episode start, so a sampled sequence never carries memory across episodes. The recurrence has
  three implementations (native, graph, scan), equal to float32 round-off in values and gradients
  (tests/test_sequence_kernels.py, tests/test_native.py); :mod:`agents.kernels` chooses one per
  network from ``network.backend`` and the core records it as ``recurrence``.
* :func:`numpy_core_step` (numpy, for the actor): one step for a batch of envs with no framework
  dispatch (an acting step costs microseconds, so TF's per-call overhead would dominate).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import keras
import numpy as np
import tensorflow as tf

from agents.kernels import graph_supports
from agents.sequence_kernels import State

CELLS = ("lstm", "gru", "lstm_peephole", "mlp")


def state_sizes(cell: str, units: int) -> tuple[int, ...]:
    """Sizes of the recurrent state tuple: ``(h, c)`` for LSTMs, ``(h,)`` for GRU, ``()`` for mlp."""
    return {"lstm": (units, units), "lstm_peephole": (units, units), "gru": (units,), "mlp": ()}[cell]


class RecurrentCore(keras.layers.Layer):
    """The weights of a recurrent (or memoryless) core mapping ``[B, T, F]`` inputs to ``[B, T, U]``
    outputs; :func:`agents.sequence_kernels.unroll` runs them in TF, :func:`numpy_core_step` in numpy."""

    def __init__(
        self, cell: str, units: int, reset_after: bool = True, recurrence: str = "scan", **kwargs
    ) -> None:
        """``recurrence``: native | graph | scan, as decided by :mod:`agents.kernels` (ignored for mlp)."""
        super().__init__(**kwargs)
        if cell not in CELLS:
            raise ValueError(f"unknown cell {cell!r}; allowed: {', '.join(CELLS)}")
        allowed = ["scan"] + ["graph"] * graph_supports(cell, reset_after) + ["native"] * (cell == "lstm")
        if cell != "mlp" and recurrence not in allowed:
            raise ValueError(f"recurrence {recurrence!r} for cell {cell!r}; allowed: {'|'.join(allowed)}")
        self.recurrence = "none" if cell == "mlp" else recurrence
        self.cell_kind = cell
        self.units = int(units)
        self.reset_after = bool(reset_after)
        self.state_sizes = state_sizes(cell, self.units)
        if cell in ("lstm", "lstm_peephole"):
            self.cell = keras.layers.LSTMCell(self.units, name="cell")
        elif cell == "gru":
            self.cell = keras.layers.GRUCell(self.units, reset_after=self.reset_after, name="cell")
        else:
            self.cell = keras.layers.Dense(self.units, activation="relu", name="cell")

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        features = int(input_shape[-1])
        with keras.name_scope(self.name, caller=self):
            self.cell.build((None, features))
            if self.cell_kind == "lstm_peephole":
                self.peephole = {
                    g: self.add_weight(shape=(self.units,), initializer="zeros", name=f"peephole_{g}")
                    for g in ("i", "f", "o")
                }
        self.built = True

    def initial_state(self, batch_size: int) -> State:
        """Zeros: a tuple of ``[B, U]`` tensors."""
        return tuple(tf.zeros([batch_size, s]) for s in self.state_sizes)


def core_weights(core: RecurrentCore) -> dict[str, np.ndarray]:
    """The core's weights as numpy arrays, keyed ``kernel``/``recurrent_kernel``/``bias``/``peephole_*``."""
    out = {"kernel": np.asarray(core.cell.kernel), "bias": np.asarray(core.cell.bias)}
    if core.cell_kind != "mlp":
        out["recurrent_kernel"] = np.asarray(core.cell.recurrent_kernel)
    if core.cell_kind == "lstm_peephole":
        out.update({f"peephole_{g}": np.asarray(w) for g, w in core.peephole.items()})
    return out


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1.0)  # overflow-free and as fast as exp


@functools.lru_cache(maxsize=16)
def _lstm_gate_scale(units: int) -> np.ndarray:
    """``[4U]``: 1/2 on the sigmoid gates (i, f, o), 1 on the cell input (c), for one tanh over all."""
    scale = np.full(4 * units, 0.5, np.float32)
    scale[2 * units : 3 * units] = 1.0
    return scale


def numpy_core_step(
    cell: str,
    w: Mapping[str, np.ndarray],
    x: np.ndarray,
    state: tuple[np.ndarray, ...],
    reset_after: bool = True,
) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """One step of the core in numpy: ``x`` ``[B, F]``, state tuple of ``[B, U]`` -> (``[B, U]``, state).

    Written for few numpy calls (each costs microseconds at acting batch sizes): in-place updates
    and one ``tanh`` over all LSTM gates, with ``sigmoid(a) = (1 + tanh(a / 2)) / 2``.
    """
    if cell == "mlp":
        return np.maximum(x @ w["kernel"] + w["bias"], 0.0), ()
    if cell == "gru":
        return _numpy_gru_step(w, x, state[0], reset_after)
    h, c = state
    u = h.shape[1]
    z = x @ w["kernel"]
    z += h @ w["recurrent_kernel"]
    z += w["bias"]
    if cell == "lstm_peephole":
        z_i, z_f, z_c, z_o = z[:, :u], z[:, u : 2 * u], z[:, 2 * u : 3 * u], z[:, 3 * u :]
        c = _sigmoid(z_f + w["peephole_f"] * c) * c + _sigmoid(z_i + w["peephole_i"] * c) * np.tanh(z_c)
        h = _sigmoid(z_o + w["peephole_o"] * c) * np.tanh(c)
        return h, (h, c)
    z *= _lstm_gate_scale(u)
    np.tanh(z, out=z)
    g = z[:, 2 * u : 3 * u].copy()
    z *= 0.5
    z += 0.5  # i, f, o are now sigmoids (the c block is overwritten; g holds it)
    c = z[:, u : 2 * u] * c
    c += z[:, :u] * g
    h = z[:, 3 * u :] * np.tanh(c)
    return h, (h, c)


def _numpy_gru_step(
    w: Mapping[str, np.ndarray], x: np.ndarray, h: np.ndarray, reset_after: bool
) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    u = h.shape[1]
    rk = w["recurrent_kernel"]
    if reset_after:
        xp = x @ w["kernel"]
        xp += w["bias"][0]
        rec = h @ rk
        rec += w["bias"][1]
        zr = _sigmoid(xp[:, : 2 * u] + rec[:, : 2 * u])
        hh = np.tanh(xp[:, 2 * u :] + zr[:, u:] * rec[:, 2 * u :])
    else:
        xp = x @ w["kernel"]
        xp += w["bias"]
        zr = _sigmoid(xp[:, : 2 * u] + h @ rk[:, : 2 * u])
        hh = np.tanh(xp[:, 2 * u :] + (zr[:, u:] * h) @ rk[:, 2 * u :])
    h = hh + zr[:, :u] * (h - hh)  # z h + (1 - z) hh
    return h, (h,)
