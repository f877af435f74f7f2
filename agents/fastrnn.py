"""Fused LSTM / GRU sequence kernels with a hand-written gradient, for the learner's unrolls.

Autodiff through a step-by-step recurrence records every small op of every step twice (forward
and backward) and accumulates the recurrent-kernel gradient one ``[U, G]`` matmul per step. Here
the backward pass runs a sequential loop that only does what must be sequential (``dz_t @ U^T``),
then computes the kernel gradient as one large matmul over all steps::

    forward, per step:   h_{t-1} <- keep_t * h_{t-1};  z_t = x_t + h_{t-1} U;  gates; state_t
    backward, per step:  dz_t from the saved gates;  dh_{t-1} = keep_t * (dz_t U^T + ...)
    after the loop:      dU = sum_t h_{t-1}^T dz_t  (one [U, T*B] x [T*B, G] matmul)

Inputs are time-major and already projected (``x_t = inputs_t W + b``, one matmul done by the
caller, whose gradient autodiff handles). ``keep`` is ``1 - reset``: the state is zeroed before a
step that starts an episode. The loops are unrolled statically (the learner's sequence lengths are
fixed by its input signature), so the graph has no loop-control ops and grappler sees every step.

Both kernels equal :meth:`agents.cells.RecurrentCore._recur` under ``tf.scan`` (the reference
path, ``FAST=False``) in value and gradient to float32 round-off; ``tests/test_fastrnn.py`` checks it.
"""

from __future__ import annotations

import tensorflow as tf


def _stack(xs: list[tf.Tensor]) -> tf.Tensor:
    return tf.stack(xs, axis=0)


def lstm_sequence(
    x: tf.Tensor, keep: tf.Tensor, h0: tf.Tensor, c0: tf.Tensor, rk: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Keras-layout LSTM (gates i, f, c, o) over a sequence.

    Args:
        x: ``[T, B, 4U]`` projected inputs (bias included); ``T`` must be static.
        keep: ``[T, B, 1]``, 0 where the state is zeroed before the step.
        h0, c0: ``[B, U]`` state before step 0.
        rk: ``[U, 4U]`` recurrent kernel.

    Returns:
        ``h`` ``[T, B, U]`` for every step, and the final ``h``, ``c``.
    """
    return _lstm(x, keep, h0, c0, rk)


@tf.custom_gradient
def _lstm(x, keep, h0, c0, rk):
    steps, units = x.shape[0], rk.shape[0]
    # tanh(a) = 2 sigmoid(2a) - 1: one sigmoid over all four gates per step instead of four ops.
    scale = tf.concat([tf.ones([2 * units]), tf.fill([units], 2.0), tf.ones([units])], 0)
    xs, rks = tf.unstack(x * scale), rk * scale
    keeps = tf.unstack(keep)
    h, c = h0, c0
    hm_all, cm_all, s_all, tc_all, h_all = [], [], [], [], []
    for t in range(steps):
        hm, cm = h * keeps[t], c * keeps[t]
        s = tf.sigmoid(xs[t] + tf.matmul(hm, rks))  # [B, 4U]: i, f, (g+1)/2, o
        i, f, sg, o = tf.split(s, 4, axis=1)
        g = 2.0 * sg - 1.0
        c = f * cm + i * g
        tc = tf.tanh(c)
        h = o * tc
        hm_all.append(hm)
        cm_all.append(cm)
        s_all.append(s)
        tc_all.append(tc)
        h_all.append(h)
    hs = _stack(h_all)

    def grad(dhs, dh_last, dc_last):
        s_ = _stack(s_all)  # [T, B, 4U]
        i_, f_, sg_, o_ = tf.split(s_, 4, axis=2)
        g_ = 2.0 * sg_ - 1.0
        tc_, cm_ = _stack(tc_all), _stack(cm_all)
        # Everything that does not depend on the backward carry, for all steps at once.
        dpre = tf.concat([i_ * (1.0 - i_), f_ * (1.0 - f_), 1.0 - g_ * g_, o_ * (1.0 - o_)], 2)
        dc_from_h = o_ * (1.0 - tc_ * tc_)  # [T, B, U]
        by_c = tf.concat([g_, cm_, i_], 2)  # dc multiplies these to give d(i), d(f), d(g)
        dpre, dc_from_h, by_c = tf.unstack(dpre), tf.unstack(dc_from_h), tf.unstack(by_c)
        f_u, tc_u, dhs_u = tf.unstack(f_), tf.unstack(tc_), tf.unstack(_zeros_if_none(dhs, hs))
        dh = _zeros_if_none(dh_last, h0)
        dc = _zeros_if_none(dc_last, c0)
        rk_t = tf.transpose(rk)
        dz_all = [None] * steps
        for t in reversed(range(steps)):
            dh = dh + dhs_u[t]
            dc = dc + dh * dc_from_h[t]
            dact = tf.concat([tf.tile(dc, [1, 3]) * by_c[t], dh * tc_u[t]], 1)
            dz = dact * dpre[t]  # [B, 4U]
            dz_all[t] = dz
            dh = tf.matmul(dz, rk_t) * keeps[t]
            dc = dc * f_u[t] * keeps[t]
        dz = _stack(dz_all)
        hm = _stack(hm_all)
        drk = tf.matmul(tf.reshape(hm, [-1, units]), tf.reshape(dz, [-1, 4 * units]), transpose_a=True)
        return dz, tf.zeros_like(keep), dh, dc, drk

    return (hs, h, c), grad


def gru_sequence(
    x: tf.Tensor, keep: tf.Tensor, h0: tf.Tensor, rk: tf.Tensor, rb: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor]:
    """Keras-layout GRU with ``reset_after=True`` (gates z, r, h) over a sequence.

    Args:
        x: ``[T, B, 3U]`` projected inputs (input bias included); ``T`` must be static.
        keep: ``[T, B, 1]``, 0 where the state is zeroed before the step.
        h0: ``[B, U]`` state before step 0.
        rk: ``[U, 3U]`` recurrent kernel; rb: ``[3U]`` recurrent bias.

    Returns:
        ``h`` ``[T, B, U]`` for every step, and the final ``h``.
    """
    return _gru(x, keep, h0, rk, rb)


@tf.custom_gradient
def _gru(x, keep, h0, rk, rb):
    steps, units = x.shape[0], rk.shape[0]
    xs, keeps = tf.unstack(x), tf.unstack(keep)
    x_zr, x_h = tf.split(x, [2 * units, units], axis=2)
    xzr_u, xh_u = tf.unstack(x_zr), tf.unstack(x_h)
    h = h0
    hm_all, zr_all, rec_h_all, hh_all, h_all = [], [], [], [], []
    for t in range(steps):
        hm = h * keeps[t]
        rec = tf.matmul(hm, rk) + rb  # [B, 3U]
        rec_zr, rec_h = tf.split(rec, [2 * units, units], axis=1)
        zr = tf.sigmoid(xzr_u[t] + rec_zr)
        z, r = tf.split(zr, 2, axis=1)
        hh = tf.tanh(xh_u[t] + r * rec_h)
        h = hh + z * (hm - hh)
        hm_all.append(hm)
        zr_all.append(zr)
        rec_h_all.append(rec_h)
        hh_all.append(hh)
        h_all.append(h)
    del xs
    hs = _stack(h_all)

    def grad(dhs, dh_last):
        zr_, hm_, hh_, rec_h_ = _stack(zr_all), _stack(hm_all), _stack(hh_all), _stack(rec_h_all)
        z_, r_ = tf.split(zr_, 2, axis=2)
        # Carry-independent factors for all steps at once: dz, dr and da (pre-tanh) per unit dh.
        dzr_pre = zr_ * (1.0 - zr_)
        dhh = (1.0 - z_) * (1.0 - hh_ * hh_)  # d h / d a_h
        by_dh = tf.concat([(hm_ - hh_) * dzr_pre[..., :units], dhh * rec_h_ * dzr_pre[..., units:], dhh], 2)
        by_dh_u, z_u, r_u = tf.unstack(by_dh), tf.unstack(z_), tf.unstack(r_)
        dhs_u = tf.unstack(_zeros_if_none(dhs, hs))
        dh = _zeros_if_none(dh_last, h0)
        rk_t = tf.transpose(rk)
        dx_all, drec_all = [None] * steps, [None] * steps
        for t in reversed(range(steps)):
            dh = dh + dhs_u[t]
            dx = tf.tile(dh, [1, 3]) * by_dh_u[t]  # [B, 3U]: d(x_z), d(x_r), d(x_h)
            dzr, da = tf.split(dx, [2 * units, units], axis=1)
            drec = tf.concat([dzr, da * r_u[t]], 1)
            dx_all[t], drec_all[t] = dx, drec
            dh = (tf.matmul(drec, rk_t) + dh * z_u[t]) * keeps[t]
        dx, drec = _stack(dx_all), _stack(drec_all)
        flat_rec = tf.reshape(drec, [-1, 3 * units])
        drk = tf.matmul(tf.reshape(hm_, [-1, units]), flat_rec, transpose_a=True)
        return dx, tf.zeros_like(keep), dh, drk, tf.reduce_sum(flat_rec, 0)

    return (hs, h), grad


def _zeros_if_none(g: tf.Tensor | None, like: tf.Tensor) -> tf.Tensor:
    return tf.zeros_like(like) if g is None else g
