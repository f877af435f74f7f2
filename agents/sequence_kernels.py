"""The learner's recurrence in TF: a :class:`agents.core.RecurrentCore`'s weights run over sequences.

:func:`unroll` (and :func:`unroll_segments`, for R2D2's burn-in / trace / n-step tail in one call)
runs the implementation the network chose once at build time (:mod:`agents.kernels`):

- ``native``: ``lstm`` only; one C++ op per direction (:mod:`agents.native`);
- ``graph``: ``lstm`` and ``gru`` (``reset_after``): the fused kernels below, the recurrence unrolled
  in the TF graph with a hand-written gradient. It needs a static length of at most
  :data:`MAX_STATIC_STEPS`; an unroll of unknown or greater length runs ``scan``;
- ``scan``: every cell: the reference ``tf.scan`` over :func:`cell_step` with autodiff;
- ``none``: the memoryless ``mlp`` core, one dense layer over every step.

Autodiff through a step-by-step recurrence replays every small op of every step and accumulates the
recurrent-kernel gradient with one ``[U, G]`` matmul per step. Here the backward pass runs a loop
that only does what must be sequential (``dz_t U^T`` and a few elementwise ops), then computes the
kernel gradient as one large matmul over all steps::

    forward, per step:   h' = keep_t h;  z_t = x_t + h' U;  gates;  h_t, c_t
    backward, per step:  dz_t from per-step factors;  dh' = keep_t (dz_t U^T + ...)
    after the loop:      dU = [h'_0 ... h'_T-1]^T [dz_0 ... dz_T-1]    (one [U, T*B] x [T*B, G] matmul)

The LSTM takes batch-major inputs (transposed to time-major inside the graph kernel; the native
ops read them in place). The input projection ``x_t = inputs_t W + b`` of all steps is one large
matmul (differentiated by autodiff for the graph kernels; for ``native`` the backward op computes
its gradients on a helper thread while its sequential loop runs). ``keep`` is ``1 - first``: the
state is zeroed before a step that starts an episode. Outputs are batch-major ``[B, T, U]``. Loops
are unrolled statically (the learner's sequence lengths are fixed by its input signature), so the
graph has no loop-control ops and the executor overlaps independent work (e.g. the target and
online unrolls) on both cores.

The forward pass only runs the recurrence (13 ops per LSTM step) and keeps its intermediate
tensors; the backward factors (sigmoid and tanh derivatives, ``[g, c', i, tanh c]`` and the like)
are built in the gradient function, held by a control dependency until the incoming gradient
exists. So the forward unrolls, all on the critical path (target, burn-in, trace), carry no
gradient work, and the factors run beside the backward loop. ``U^T`` for the backward loop is
materialised as a 3-D transpose (:func:`_transpose`): Grappler folds a plain 2-D transpose into the
matmul's ``transpose_b``, which oneDNN runs slower than a plain matmul at these shapes.

Both kernels equal the reference recurrence (``scan``: :func:`cell_step` under ``tf.scan``
plus autodiff) to float32 round-off in outputs and gradients (tests/test_sequence_kernels.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import tensorflow as tf

from agents import native as native_ops

if TYPE_CHECKING:
    from agents.core import RecurrentCore

State = tuple[tf.Tensor, ...]
# Longer sequences leave the graph kernel: it puts every step in the graph (trace time grows).
MAX_STATIC_STEPS = 256


def unroll(core: RecurrentCore, inputs: tf.Tensor, state: State, first: tf.Tensor) -> tuple[tf.Tensor, State]:
    """Run ``core``'s weights over a sequence with the recurrence its network chose.

    Args:
        core: the :class:`agents.core.RecurrentCore` whose weights run.
        inputs: ``[B, T, F]``.
        state: tuple of ``[B, U]``, the state before step 0.
        first: ``[B, T]`` float, 1 where an episode starts: the state is zeroed before that step.

    Returns:
        outputs ``[B, T, U]`` and the state after the last step.
    """
    outputs, final = unroll_segments(core, [inputs], state, [first])
    return outputs[0], final


def unroll_segments(
    core: RecurrentCore, inputs: Sequence[tf.Tensor], state: State, first: Sequence[tf.Tensor]
) -> tuple[list[tf.Tensor], State]:
    """Consecutive segments of one sequence (``inputs[k]`` ``[B, T_k, F]``, ``first[k]``
    ``[B, T_k]``): segment ``k`` starts from segment ``k - 1``'s final state with its gradient
    stopped, so no gradient runs back from one segment into the one before (R2D2's burn-in, trace
    and n-step tail). Returns each segment's outputs ``[B, T_k, U]`` and the final state."""
    outputs = []
    for k, (x, f) in enumerate(zip(inputs, first, strict=True)):
        if k:
            state = tuple(tf.stop_gradient(s) for s in state)
        path = recurrence_for(core, x)
        if path in ("native", "graph"):
            h, state = _unroll_fused(core, x, state, f, native=path == "native")
        elif path == "none":
            h, state = _project_inputs(core, x), ()
        else:
            h, state = _unroll_scan(core, _project_inputs(core, x), tf.transpose(1.0 - f)[:, :, None], state)
        outputs.append(h)
    return outputs, state


def recurrence_for(core: RecurrentCore, inputs: tf.Tensor | tf.TensorSpec) -> str:
    """What an unroll of ``inputs`` ``[B, T, F]`` runs: the core's chosen ``recurrence``, except that
    the graph kernel needs a static ``T`` of at most :data:`MAX_STATIC_STEPS` (else ``scan``)."""
    steps = inputs.shape[1]
    if core.recurrence == "graph" and not (steps is not None and 0 < steps <= MAX_STATIC_STEPS):
        return "scan"
    return core.recurrence


def _unroll_fused(
    core: RecurrentCore, inputs: tf.Tensor, state: State, first: tf.Tensor, native: bool = False
) -> tuple[tf.Tensor, State]:
    """The fused kernels below (``native``: the C++ LSTM ops of :mod:`agents.native`, which read
    batch-major tensors in place); the graph kernels run time-major inside (the narrow inputs are
    transposed)."""
    cell = core.cell
    rk = tf.convert_to_tensor(cell.recurrent_kernel)
    if core.cell_kind == "lstm":
        kernel, bias = tf.convert_to_tensor(cell.kernel), tf.convert_to_tensor(cell.bias)
        keep = 1.0 - first  # the kernels take its complement: 0 where the state is zeroed
        hs, h, c = lstm_sequence(inputs, kernel, bias, keep, *state, rk, native=native)
        return hs, (h, c)
    proj = _project_inputs(core, tf.transpose(inputs, [1, 0, 2]))  # [T, B, G]
    keep = tf.transpose(1.0 - first)[:, :, None]  # [T, B, 1]
    rb = tf.convert_to_tensor(cell.bias)[1]
    hs, h = gru_sequence(proj, keep, state[0], rk, rb)
    return hs, (h,)


def _project_inputs(core: RecurrentCore, inputs: tf.Tensor) -> tf.Tensor:
    """``[B, T, F] -> [B, T, G]`` (or time-major): every step's input projection in one matmul."""
    if core.cell_kind == "mlp":
        shape = tf.shape(inputs)
        proj = core.cell(tf.reshape(inputs, [-1, inputs.shape[-1]]))
        return tf.reshape(proj, tf.concat([shape[:2], [-1]], axis=0))
    bias = core.cell.bias
    if core.cell_kind == "gru" and core.reset_after:
        bias = bias[0]
    return project(inputs, core.cell.kernel, bias)


def _unroll_scan(
    core: RecurrentCore, proj: tf.Tensor, keep: tf.Tensor, state: State
) -> tuple[tf.Tensor, State]:
    """The reference path: :func:`cell_step` under ``tf.scan``, autodiff for the gradient.

    ``proj`` ``[B, T, G]``, ``keep`` ``[T, B, 1]``.
    """

    def body(carry: State, step: tuple[tf.Tensor, tf.Tensor]) -> State:
        x_t, keep_t = step
        return cell_step(core, x_t, tuple(s * keep_t for s in carry))

    states = tf.scan(body, (tf.transpose(proj, [1, 0, 2]), keep), initializer=tuple(state))
    outputs = tf.transpose(states[0], [1, 0, 2])
    return outputs, tuple(s[-1] for s in states)


def cell_step(core: RecurrentCore, x_t: tf.Tensor, state: State) -> State:
    """One recurrence step of any cell from the projected input ``x_t`` ``[B, G]``; returns the new
    state (the reference the fused kernels are tested against)."""
    u, cell = core.units, core.cell
    if core.cell_kind == "gru":
        (h,) = state
        rk = cell.recurrent_kernel
        x_z, x_r, x_h = tf.split(x_t, 3, axis=1)
        if core.reset_after:
            rec = tf.matmul(h, rk) + cell.bias[1]
            r_z, r_r, r_h = tf.split(rec, 3, axis=1)
            z, r = tf.sigmoid(x_z + r_z), tf.sigmoid(x_r + r_r)
            hh = tf.tanh(x_h + r * r_h)
        else:
            rec = tf.matmul(h, rk[:, : 2 * u])
            z, r = tf.sigmoid(x_z + rec[:, :u]), tf.sigmoid(x_r + rec[:, u:])
            hh = tf.tanh(x_h + tf.matmul(r * h, rk[:, 2 * u :]))
        return (z * h + (1.0 - z) * hh,)
    h, c = state
    z = x_t + tf.matmul(h, cell.recurrent_kernel)
    z_i, z_f, z_c, z_o = tf.split(z, 4, axis=1)
    if core.cell_kind == "lstm_peephole":
        z_i = z_i + core.peephole["i"] * c
        z_f = z_f + core.peephole["f"] * c
    c = tf.sigmoid(z_f) * c + tf.sigmoid(z_i) * tf.tanh(z_c)
    if core.cell_kind == "lstm_peephole":
        z_o = z_o + core.peephole["o"] * c
    return (tf.sigmoid(z_o) * tf.tanh(c), c)


def lstm_sequence(
    inputs: tf.Tensor,
    kernel: tf.Tensor,
    bias: tf.Tensor,
    keep: tf.Tensor,
    h0: tf.Tensor,
    c0: tf.Tensor,
    rk: tf.Tensor,
    native: bool = False,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Keras-layout LSTM (gates i, f, c, o) over a sequence, input projection included.

    Args:
        inputs: ``[B, T, F]``; ``T`` static unless ``native``.
        kernel: ``[F, 4U]`` input kernel; bias: ``[4U]``. Every step's projection
            ``inputs_t kernel + bias`` is one large matmul.
        keep: ``[B, T]``, 0 where the state is zeroed before the step.
        h0, c0: ``[B, U]`` state before step 0.
        rk: ``[U, 4U]`` recurrent kernel.
        native: run the C++ ops of :mod:`agents.native` (one op per direction; the backward op
            also computes the projection's gradients) instead of the unrolled TF graph; raises
            :class:`agents.native.NativeUnavailable` if they cannot load.

    Returns:
        ``h`` of every step ``[B, T, U]``, and the final ``h``, ``c`` ``[B, U]``.
    """
    if native:
        return _lstm_native(inputs, kernel, bias, keep, h0, c0, rk)
    x = project(tf.transpose(inputs, [1, 0, 2]), kernel, bias)  # time-major [T, B, 4U]
    return _lstm(x, tf.transpose(keep)[:, :, None], h0, c0, rk)


def project(inputs: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor) -> tf.Tensor:
    """``[N, T, F] -> [N, T, G]``: ``inputs kernel + bias`` for every step in one matmul."""
    shape = tf.shape(inputs)
    flat = tf.matmul(tf.reshape(inputs, [-1, inputs.shape[-1]]), kernel) + bias
    return tf.reshape(flat, tf.concat([shape[:2], [-1]], axis=0))


def _lstm_native(inputs, kernel, bias, keep, h0, c0, rk):
    ops = native_ops.load()

    @tf.custom_gradient
    def run(inputs, kernel, bias, keep, h0, c0, rk):
        x = project(inputs, kernel, bias)  # batch-major, like everything TF sees of the ops
        hs, h, c, cs, act, hm, cm = ops.recurrl_lstm_forward(x, keep, h0, c0, rk)

        def grad(dhs, dh_last, dc_last):
            dhs, dh, dc = (_zeros_if_none(g, v) for g, v in ((dhs, hs), (dh_last, h0), (dc_last, c0)))
            dxin, dh0, dc0, drk, dkernel, dbias = ops.recurrl_lstm_backward(
                dhs, dh, dc, keep, rk, cs, act, cm, hm, inputs, kernel
            )
            return dxin, dkernel, dbias, tf.zeros_like(keep), dh0, dc0, drk

        return (hs, h, c), grad

    return run(inputs, kernel, bias, keep, h0, c0, rk)


@tf.custom_gradient
def _lstm(x, keep, h0, c0, rk):
    steps, units = x.shape[0], rk.shape[0]
    # tanh(a) = 2 sigmoid(2a) - 1: one sigmoid covers all four gates of a step.
    scale = tf.constant([1.0] * (2 * units) + [2.0] * units + [1.0] * units)
    xs, keeps, rks = tf.unstack(x * scale), tf.unstack(keep), rk * scale
    h, c = h0, c0
    saved, h_all = [], []  # saved[t]: what step t's backward factors are built from
    for t in range(steps):
        hm, cm = h * keeps[t], c * keeps[t]
        s = tf.sigmoid(xs[t] + tf.matmul(hm, rks))  # [B, 4U]: i, f, (g + 1) / 2, o
        i, f, sg, o = tf.split(s, 4, axis=1)
        g = 2.0 * sg - 1.0
        c = f * cm + i * g
        tc = tf.tanh(c)
        h = o * tc
        saved.append((hm, cm, s, i, f, g, o, tc))
        h_all.append(h)
    hs = tf.stack(h_all, axis=1)

    def grad(dhs, dh_last, dc_last):
        dh = _zeros_if_none(dh_last, h0)
        dc = _zeros_if_none(dc_last, c0)
        dhs_t = tf.unstack(_zeros_if_none(dhs, hs), axis=1)
        rk_t = _transpose(rk)
        deriv_scale = tf.constant([1.0] * (2 * units) + [4.0] * units + [1.0] * units)

        with tf.control_dependencies(_gate(dhs, dh_last, dc_last)):
            fac = {}  # dz = [dc dc dc dh] * w, dc += dh * by_dc, carry dc' = dc * fk
            for t in reversed(range(steps)):
                _, cm, s, i, f, g, o, tc = saved[t]
                dpre = s * (1.0 - s) * deriv_scale  # sigmoid'(z) for i, f, o; tanh'(z) = 4 sg (1 - sg) for g
                fac[t] = tf.concat([g, cm, i, tc], 1) * dpre, o * (1.0 - tc * tc), f * keeps[t]
        dz_all = [None] * steps
        for t in reversed(range(steps)):
            w, by_dc, fk = fac[t]
            dh = dh + dhs_t[t]
            dc = dc + dh * by_dc
            dz_all[t] = tf.concat([dc, dc, dc, dh], 1) * w  # [B, 4U]
            dh = tf.matmul(dz_all[t], rk_t) * keeps[t]
            dc = dc * fk
        dz, drk = _kernel_grad([m[0] for m in saved], dz_all)
        return dz, tf.zeros_like(keep), dh, dc, drk

    return (hs, h, c), grad


def gru_sequence(
    x: tf.Tensor, keep: tf.Tensor, h0: tf.Tensor, rk: tf.Tensor, rb: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor]:
    """Keras-layout GRU with ``reset_after=True`` (gates z, r, h) over a sequence.

    Args:
        x: ``[T, B, 3U]`` projected inputs (input bias included); ``T`` static.
        keep: ``[T, B, 1]``, 0 where the state is zeroed before the step.
        h0: ``[B, U]`` state before step 0.
        rk: ``[U, 3U]`` recurrent kernel; rb: ``[3U]`` recurrent bias.

    Returns:
        ``h`` of every step ``[B, T, U]``, and the final ``h`` ``[B, U]``.
    """
    return _gru(x, keep, h0, rk, rb)


@tf.custom_gradient
def _gru(x, keep, h0, rk, rb):
    steps, units = x.shape[0], rk.shape[0]
    x_zr, x_h = tf.split(x, [2 * units, units], axis=2)
    xzr, xh, keeps = tf.unstack(x_zr), tf.unstack(x_h), tf.unstack(keep)
    h = h0
    saved, h_all = [], []  # saved[t]: what step t's backward factors are built from
    for t in range(steps):
        hm = h * keeps[t]
        rec = tf.nn.bias_add(tf.matmul(hm, rk), rb)  # [B, 3U]
        rec_zr, rec_h = tf.split(rec, [2 * units, units], axis=1)
        zr = tf.sigmoid(xzr[t] + rec_zr)
        z, r = tf.split(zr, 2, axis=1)
        hh = tf.tanh(xh[t] + r * rec_h)
        h = hh + z * (hm - hh)
        saved.append((hm, rec_h, zr, z, r, hh))
        h_all.append(h)
    hs = tf.stack(h_all, axis=1)

    def grad(dhs, dh_last):
        dh = _zeros_if_none(dh_last, h0)
        dhs_t = tf.unstack(_zeros_if_none(dhs, hs), axis=1)
        rk_t = _transpose(rk)

        with tf.control_dependencies(_gate(dhs, dh_last)):
            fac = {}  # d(x) = [dh dh dh] * by_dx, d(rec) = [dh dh dh] * by_rec, dh' = d(rec) U^T keep + dh zk
            for t in reversed(range(steps)):
                hm, rec_h, zr, z, r, hh = saved[t]
                da = (1.0 - z) * (1.0 - hh * hh)  # dh_t / d(pre-tanh candidate)
                dzr = zr * (1.0 - zr) * tf.concat([hm - hh, da * rec_h], 1)
                fac[t] = tf.concat([dzr, da], 1), tf.concat([dzr, da * r], 1), z * keeps[t]
        dx_all, drec_all = [None] * steps, [None] * steps
        for t in reversed(range(steps)):
            by_dx, by_rec, zk = fac[t]
            dh = dh + dhs_t[t]
            dh3 = tf.concat([dh, dh, dh], 1)
            dx_all[t] = dh3 * by_dx
            drec_all[t] = dh3 * by_rec  # [B, 3U]
            dh = tf.matmul(drec_all[t], rk_t) * keeps[t] + dh * zk
        drec, drk = _kernel_grad([m[0] for m in saved], drec_all)
        drb = tf.reduce_sum(tf.reshape(drec, [-1, 3 * units]), 0)
        return tf.stack(dx_all), tf.zeros_like(keep), dh, drk, drb

    return (hs, h), grad


def _kernel_grad(hm_all: list[tf.Tensor], dz_all: list[tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
    """``dz`` stacked ``[T, B, G]`` and ``dU = sum_t hm_t^T dz_t`` ``[U, G]`` (one large matmul)."""
    units, gates = hm_all[0].shape[-1], dz_all[0].shape[-1]
    dz = tf.stack(dz_all)
    hm = tf.reshape(tf.stack(hm_all), [-1, units])
    return dz, tf.matmul(hm, tf.reshape(dz, [-1, gates]), transpose_a=True)


def _transpose(kernel: tf.Tensor) -> tf.Tensor:
    """``[U, G] -> [G, U]``, materialised: the backward loop's ``dz U^T`` stays a plain matmul.

    A 2-D ``tf.transpose`` feeding a matmul is folded by Grappler into ``transpose_b=True``, which
    oneDNN runs slower than a plain matmul at these shapes (``[B, G] x [G, U]``); the same
    permutation written as a 3-D transpose of ``[U, G / U, U]`` is left alone.
    """
    units, gates = kernel.shape
    blocks = tf.reshape(kernel, [units, gates // units, units])
    return tf.reshape(tf.transpose(blocks, [1, 2, 0]), [gates, units])


def _gate(*grads: tf.Tensor | None) -> list[tf.Tensor]:
    """Control inputs that hold the backward factors until the incoming gradients exist.

    Built in the forward pass, the factors would compete with the forward unrolls (all of which
    are on the critical path); held back, they run beside the sequential backward loop.
    """
    return [g for g in grads if g is not None]


def _zeros_if_none(g: tf.Tensor | None, like: tf.Tensor) -> tf.Tensor:
    return tf.zeros_like(like) if g is None else g
