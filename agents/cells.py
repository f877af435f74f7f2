"""Recurrent cores with one set of weights for sequence training (TF) and per-step acting (numpy).

Weights use Keras' own cell layouts (``LSTMCell``: gates i, f, c, o; ``GRUCell``: z, r, h with a
``[2, 3U]`` bias when ``reset_after``), so a trained core can be loaded into ``keras.layers.LSTM`` or
``keras.layers.GRU`` (and their cuDNN kernels) unchanged. ``lstm_peephole`` adds the diagonal
peephole weights of the classic ``LSTMCell(use_peepholes=True)``. ``mlp`` is a dense layer with no
state: the memoryless baseline.

Two implementations share those weights:

* :meth:`RecurrentCore.unroll` (TF, for the learner): the input projection of all time steps is one
  large matmul, then the recurrence runs under ``tf.scan`` with the state zeroed wherever ``reset``
  marks an episode start, so a sampled sequence never carries memory across episodes.
* :func:`numpy_core_step` (numpy, for the actor): one step for a batch of envs with no framework
  dispatch, about 30 us for 8 envs and 128 units.
"""

from __future__ import annotations

from collections.abc import Mapping

import keras
import numpy as np
import tensorflow as tf

from agents import fastrnn

CELLS = ("lstm", "gru", "lstm_peephole", "mlp")
# Use the fused kernels of agents/fastrnn.py where they apply (static length, lstm or gru with
# reset_after); False forces the reference tf.scan path everywhere (tests compare the two).
FAST = True
# Longer static sequences fall back to tf.scan: the fused kernels unroll every step into the graph.
MAX_STATIC_STEPS = 512
State = tuple[tf.Tensor, ...]


def state_sizes(cell: str, units: int) -> tuple[int, ...]:
    """Sizes of the recurrent state tuple: ``(h, c)`` for LSTMs, ``(h,)`` for GRU, ``()`` for mlp."""
    return {"lstm": (units, units), "lstm_peephole": (units, units), "gru": (units,), "mlp": ()}[cell]


class RecurrentCore(keras.layers.Layer):
    """A recurrent (or memoryless) core mapping ``[B, T, F]`` inputs to ``[B, T, U]`` outputs."""

    def __init__(self, cell: str, units: int, reset_after: bool = True, **kwargs) -> None:
        super().__init__(**kwargs)
        if cell not in CELLS:
            raise ValueError(f"unknown cell {cell!r}; allowed: {', '.join(CELLS)}")
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
        shape = tf.shape(inputs)
        flat = tf.reshape(inputs, [-1, inputs.shape[-1]])
        if self.cell_kind == "mlp":
            proj = self.cell(flat)
        else:
            bias = self.cell.bias
            if self.cell_kind == "gru" and self.reset_after:
                bias = bias[0]
            proj = tf.matmul(flat, self.cell.kernel) + bias
        return tf.reshape(proj, tf.concat([shape[:2], [-1]], axis=0))

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

    def unroll(self, inputs: tf.Tensor, state: State, reset: tf.Tensor) -> tuple[tf.Tensor, State]:
        """Run the core over a sequence.

        Args:
            inputs: ``[B, T, F]``.
            state: tuple of ``[B, U]``, the state before step 0.
            reset: ``[B, T]`` float, 1 where an episode starts: the state is zeroed before that step.

        Returns:
            outputs ``[B, T, U]`` and the state after the last step.
        """
        if FAST and self._fast_ok(inputs):
            return self._unroll_fused(inputs, state, reset)
        proj = self._project_inputs(inputs)
        if self.cell_kind == "mlp":
            return proj, ()
        return self._unroll_scan(proj, tf.transpose(1.0 - reset)[:, :, None], state)

    def _fast_ok(self, inputs: tf.Tensor) -> bool:
        steps = inputs.shape[1]
        kind_ok = self.cell_kind == "lstm" or (self.cell_kind == "gru" and self.reset_after)
        return kind_ok and steps is not None and 0 < steps <= MAX_STATIC_STEPS

    def _unroll_fused(self, inputs: tf.Tensor, state: State, reset: tf.Tensor) -> tuple[tf.Tensor, State]:
        """:mod:`agents.fastrnn` kernels; time-major inside (the narrow inputs are transposed)."""
        proj = self._project_inputs(tf.transpose(inputs, [1, 0, 2]))  # [T, B, G]
        keep = tf.transpose(1.0 - reset)[:, :, None]  # [T, B, 1]
        rk = tf.convert_to_tensor(self.cell.recurrent_kernel)
        if self.cell_kind == "lstm":
            hs, h, c = fastrnn.lstm_sequence(proj, keep, state[0], state[1], rk)
            return hs, (h, c)
        rb = tf.convert_to_tensor(self.cell.bias)[1]
        hs, h = fastrnn.gru_sequence(proj, keep, state[0], rk, rb)
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


def numpy_core_step(
    cell: str,
    w: Mapping[str, np.ndarray],
    x: np.ndarray,
    state: tuple[np.ndarray, ...],
    reset_after: bool = True,
) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """One step of the core in numpy: ``x`` ``[B, F]``, state tuple of ``[B, U]`` -> (``[B, U]``, state)."""
    if cell == "mlp":
        return np.maximum(x @ w["kernel"] + w["bias"], 0.0), ()
    if cell == "gru":
        (h,) = state
        rk = w["recurrent_kernel"]
        u = h.shape[1]
        if reset_after:
            xp = x @ w["kernel"] + w["bias"][0]
            rec = h @ rk + w["bias"][1]
            z = _sigmoid(xp[:, :u] + rec[:, :u])
            r = _sigmoid(xp[:, u : 2 * u] + rec[:, u : 2 * u])
            hh = np.tanh(xp[:, 2 * u :] + r * rec[:, 2 * u :])
        else:
            xp = x @ w["kernel"] + w["bias"]
            rec = h @ rk[:, : 2 * u]
            z = _sigmoid(xp[:, :u] + rec[:, :u])
            r = _sigmoid(xp[:, u : 2 * u] + rec[:, u:])
            hh = np.tanh(xp[:, 2 * u :] + (r * h) @ rk[:, 2 * u :])
        h = z * h + (1.0 - z) * hh
        return h, (h,)
    h, c = state
    u = h.shape[1]
    z = x @ w["kernel"] + h @ w["recurrent_kernel"] + w["bias"]
    z_i, z_f, z_c, z_o = z[:, :u], z[:, u : 2 * u], z[:, 2 * u : 3 * u], z[:, 3 * u :]
    if cell == "lstm_peephole":
        z_i = z_i + w["peephole_i"] * c
        z_f = z_f + w["peephole_f"] * c
    c = _sigmoid(z_f) * c + _sigmoid(z_i) * np.tanh(z_c)
    if cell == "lstm_peephole":
        z_o = z_o + w["peephole_o"] * c
    h = _sigmoid(z_o) * np.tanh(c)
    return h, (h, c)
