"""Recurrent cores with one set of weights for sequence training (TF) and per-step acting (numpy).

Weights use Keras' own cell layouts (``LSTMCell``: gates i, f, c, o; ``GRUCell``: z, r, h with a
``[2, 3U]`` bias when ``reset_after``), so a trained core can be loaded into ``keras.layers.LSTM`` or
``keras.layers.GRU`` (and their cuDNN kernels) unchanged. ``lstm_peephole`` adds the diagonal
peephole weights of the classic ``LSTMCell(use_peepholes=True)``. ``mlp`` is a dense layer with no
state: the memoryless baseline.

Two implementations share those weights:

* :meth:`RecurrentCore.unroll` (TF, for the learner): the input projection of all time steps is one
  large matmul, then the recurrence runs with the state zeroed wherever ``first`` marks an episode
  start, so a sampled sequence never carries memory across episodes. The recurrence has three
  implementations, equal to float32 round-off in values and gradients (tests/test_sequence_kernels.py,
  tests/test_native.py); :mod:`agents.kernels` chooses one per network from ``network.backend``:

  - ``native``: ``lstm`` only; one C++ op per direction (:mod:`agents.native`);
  - ``graph``: ``lstm`` and ``gru`` (``reset_after``): the recurrence unrolled in the TF graph with a
    hand-written gradient (:mod:`agents.sequence_kernels`). It needs a static length of at most
    :data:`MAX_STATIC_STEPS`; an unroll of unknown or greater length runs ``scan``;
  - ``scan``: every cell: the reference ``tf.scan`` over :meth:`_recur` with autodiff.
* :func:`numpy_core_step` (numpy, for the actor): one step for a batch of envs with no framework
  dispatch (an acting step costs microseconds, so TF's per-call overhead would dominate).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import keras
import numpy as np
import tensorflow as tf

from agents import sequence_kernels
from agents.kernels import graph_supports

CELLS = ("lstm", "gru", "lstm_peephole", "mlp")
# Longer sequences leave the graph kernel: it puts every step in the graph (trace time grows).
MAX_STATIC_STEPS = 256
State = tuple[tf.Tensor, ...]


def state_sizes(cell: str, units: int) -> tuple[int, ...]:
    """Sizes of the recurrent state tuple: ``(h, c)`` for LSTMs, ``(h,)`` for GRU, ``()`` for mlp."""
    return {"lstm": (units, units), "lstm_peephole": (units, units), "gru": (units,), "mlp": ()}[cell]


class RecurrentCore(keras.layers.Layer):
    """A recurrent (or memoryless) core mapping ``[B, T, F]`` inputs to ``[B, T, U]`` outputs."""

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

    def _project_inputs(self, inputs: tf.Tensor) -> tf.Tensor:
        """``[B, T, F] -> [B, T, G]`` (or time-major): every step's input projection in one matmul."""
        if self.cell_kind == "mlp":
            shape = tf.shape(inputs)
            proj = self.cell(tf.reshape(inputs, [-1, inputs.shape[-1]]))
            return tf.reshape(proj, tf.concat([shape[:2], [-1]], axis=0))
        bias = self.cell.bias
        if self.cell_kind == "gru" and self.reset_after:
            bias = bias[0]
        return sequence_kernels.project(inputs, self.cell.kernel, bias)

    def _recur(self, x_t: tf.Tensor, state: State) -> State:
        """One recurrence step from the projected input ``x_t`` ``[B, G]``; returns the new state."""
        u = self.units
        if self.cell_kind == "gru":
            (h,) = state
            rk = self.cell.recurrent_kernel
            x_z, x_r, x_h = tf.split(x_t, 3, axis=1)
            if self.reset_after:
                rec = tf.matmul(h, rk) + self.cell.bias[1]
                r_z, r_r, r_h = tf.split(rec, 3, axis=1)
                z, r = tf.sigmoid(x_z + r_z), tf.sigmoid(x_r + r_r)
                hh = tf.tanh(x_h + r * r_h)
            else:
                rec = tf.matmul(h, rk[:, : 2 * u])
                z, r = tf.sigmoid(x_z + rec[:, :u]), tf.sigmoid(x_r + rec[:, u:])
                hh = tf.tanh(x_h + tf.matmul(r * h, rk[:, 2 * u :]))
            return (z * h + (1.0 - z) * hh,)
        h, c = state
        z = x_t + tf.matmul(h, self.cell.recurrent_kernel)
        z_i, z_f, z_c, z_o = tf.split(z, 4, axis=1)
        if self.cell_kind == "lstm_peephole":
            z_i = z_i + self.peephole["i"] * c
            z_f = z_f + self.peephole["f"] * c
        c = tf.sigmoid(z_f) * c + tf.sigmoid(z_i) * tf.tanh(z_c)
        if self.cell_kind == "lstm_peephole":
            z_o = z_o + self.peephole["o"] * c
        return (tf.sigmoid(z_o) * tf.tanh(c), c)

    def unroll(self, inputs: tf.Tensor, state: State, first: tf.Tensor) -> tuple[tf.Tensor, State]:
        """Run the core over a sequence.

        Args:
            inputs: ``[B, T, F]``.
            state: tuple of ``[B, U]``, the state before step 0.
            first: ``[B, T]`` float, 1 where an episode starts: the state is zeroed before that step.

        Returns:
            outputs ``[B, T, U]`` and the state after the last step.
        """
        path = self.recurrence_for(inputs)
        if path in ("native", "graph"):
            return self._unroll_fused(inputs, state, first, native=path == "native")
        proj = self._project_inputs(inputs)
        if path == "none":
            return proj, ()
        return self._unroll_scan(proj, tf.transpose(1.0 - first)[:, :, None], state)

    def recurrence_for(self, inputs: tf.Tensor | tf.TensorSpec) -> str:
        """What an unroll of ``inputs`` ``[B, T, F]`` runs: the chosen :attr:`recurrence`, except that
        the graph kernel needs a static ``T`` of at most :data:`MAX_STATIC_STEPS` (else ``scan``)."""
        steps = inputs.shape[1]
        if self.recurrence == "graph" and not (steps is not None and 0 < steps <= MAX_STATIC_STEPS):
            return "scan"
        return self.recurrence

    def _unroll_fused(
        self, inputs: tf.Tensor, state: State, first: tf.Tensor, native: bool = False
    ) -> tuple[tf.Tensor, State]:
        """:mod:`agents.sequence_kernels` kernels (``native``: the C++ LSTM ops of :mod:`agents.native`, which
        read batch-major tensors in place); the graph kernels run time-major inside (the narrow
        inputs are transposed)."""
        rk = tf.convert_to_tensor(self.cell.recurrent_kernel)
        if self.cell_kind == "lstm":
            kernel, bias = (tf.convert_to_tensor(w) for w in (self.cell.kernel, self.cell.bias))
            keep = 1.0 - first  # the kernels take its complement: 0 where the state is zeroed
            hs, h, c = sequence_kernels.lstm_sequence(inputs, kernel, bias, keep, *state, rk, native=native)
            return hs, (h, c)
        proj = self._project_inputs(tf.transpose(inputs, [1, 0, 2]))  # [T, B, G]
        keep = tf.transpose(1.0 - first)[:, :, None]  # [T, B, 1]
        rb = tf.convert_to_tensor(self.cell.bias)[1]
        hs, h = sequence_kernels.gru_sequence(proj, keep, state[0], rk, rb)
        return hs, (h,)

    def _unroll_scan(self, proj: tf.Tensor, keep: tf.Tensor, state: State) -> tuple[tf.Tensor, State]:
        """The reference path: ``_recur`` under ``tf.scan``, autodiff for the gradient.

        ``proj`` ``[B, T, G]``, ``keep`` ``[T, B, 1]``.
        """

        def body(carry: State, step: tuple[tf.Tensor, tf.Tensor]) -> State:
            x_t, keep_t = step
            return self._recur(x_t, tuple(s * keep_t for s in carry))

        states = tf.scan(body, (tf.transpose(proj, [1, 0, 2]), keep), initializer=tuple(state))
        outputs = tf.transpose(states[0], [1, 0, 2])
        return outputs, tuple(s[-1] for s in states)


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
