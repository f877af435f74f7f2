"""n-step and lambda-return TD targets for sequences, shared by every agent.

For a trace step ``t`` with ``n`` steps of lookahead (all ``[B, T]``)::

    y_t = sum_{k<m} gamma^k r_{t+k}  +  gamma^m V(s_{t+m}) * bootstrap

where ``m = n`` if the episode goes on past ``t + n - 1``; otherwise the episode ended at step
``t + m - 1`` and ``bootstrap`` is 0 if it *terminated* (a true end: no value after it) and 1 if it
was *truncated* (a time limit: the state still has value, read from the final-observation row at
``t + m``, which the replay keeps for exactly this purpose).
"""

from __future__ import annotations

import tensorflow as tf


def n_step_targets(
    reward: tf.Tensor,
    terminated: tf.Tensor,
    truncated: tf.Tensor,
    next_value: tf.Tensor,
    gamma: float,
    n_step: int,
) -> tf.Tensor:
    """n-step targets for the first ``T = L - n_step`` steps of a window.

    Args:
        reward, terminated, truncated: ``[B, L]`` float, outcome of the action at each row.
        next_value: ``[B, L]`` bootstrap value ``V(s_j)`` of the observation at each row ``j``.
        gamma: discount.
        n_step: lookahead ``n >= 1``; ``L`` must be at least ``T + n``.

    Returns:
        ``[B, T]`` targets (no gradient flows through them).
    """
    length = reward.shape[1]
    trace = length - n_step
    # A step that is both terminated and truncated is a true end: never bootstrap from it.
    truncated = truncated * (1.0 - terminated)
    ended = tf.minimum(terminated + truncated, 1.0)
    alive = tf.ones_like(reward[:, :trace])
    ret = tf.zeros_like(alive)
    boot = tf.zeros_like(alive)
    for k in range(n_step):
        ret += alive * (gamma**k) * reward[:, k : k + trace]
        end_k = alive * ended[:, k : k + trace]
        boot += (
            end_k * truncated[:, k : k + trace] * (gamma ** (k + 1)) * next_value[:, k + 1 : k + 1 + trace]
        )
        alive = alive * (1.0 - end_k)
    boot += alive * (gamma**n_step) * next_value[:, n_step : n_step + trace]
    return tf.stop_gradient(ret + boot)


def lambda_targets(
    reward: tf.Tensor,
    terminated: tf.Tensor,
    truncated: tf.Tensor,
    next_value: tf.Tensor,
    gamma: float,
    lam: float,
    trace: int,
) -> tf.Tensor:
    """Peng's Q(lambda) targets for the first ``trace`` steps of a window, truncated at its end.

    Computed backwards over the window's ``L`` rows (no off-policy correction, as in Peng's Q(lambda))::

        G_{L-1} = V(s_{L-1})
        G_j     = r_j + gamma * ((1 - lambda) V(s_{j+1}) + lambda G_{j+1})

    so ``G_t = (1 - lambda) sum_n lambda^(n-1) y_t^(n)`` over the n-step targets that fit in the
    window, with the remaining weight on the longest one. ``lambda = 0`` gives one-step targets;
    ``lambda = 1`` the discounted rewards to the window's end plus its last bootstrap value.
    Episode ends cut the recursion as in :func:`n_step_targets`: after a termination nothing is
    added; after a truncation only ``gamma V`` of the final-observation row.

    Args:
        reward, terminated, truncated: ``[B, L]`` float, outcome of the action at each row.
        next_value: ``[B, L]`` bootstrap value ``V(s_j)`` of the observation at each row ``j``.
        gamma: discount.
        lam: lambda in ``[0, 1]``.
        trace: number of leading rows to return targets for, ``1 <= trace < L``.

    Returns:
        ``[B, trace]`` targets (no gradient flows through them).
    """
    length = reward.shape[1]
    truncated = truncated * (1.0 - terminated)  # both at once is a true end
    ret = next_value[:, length - 1]  # [B]
    out = []
    for j in range(length - 2, -1, -1):
        v_next = next_value[:, j + 1]
        mixed = (1.0 - lam) * v_next + lam * ret
        carry = truncated[:, j] * v_next + (1.0 - truncated[:, j]) * mixed
        ret = reward[:, j] + gamma * (1.0 - terminated[:, j]) * carry
        if j < trace:
            out.append(ret)
    return tf.stop_gradient(tf.stack(out[::-1], axis=1))


def td_targets(
    reward: tf.Tensor,
    terminated: tf.Tensor,
    truncated: tf.Tensor,
    next_value: tf.Tensor,
    gamma: float,
    n_step: int,
    td_lambda: float | None,
    trace: int,
) -> tf.Tensor:
    """The learners' TD targets: :func:`n_step_targets` or, with ``td_lambda`` set,
    :func:`lambda_targets` over the same window.

    Args:
        reward, terminated, truncated, next_value: ``[B, L]`` as in :func:`n_step_targets`, with
            ``L = trace + n_step``.
        gamma: discount.
        n_step: lookahead of the n-step targets (of the last trace step with ``td_lambda``).
        td_lambda: lambda in ``[0, 1]``, or None for n-step targets.
        trace: trace steps to return targets for.

    Returns:
        ``[B, trace]`` targets (no gradient flows through them).
    """
    if td_lambda is None:
        return n_step_targets(reward, terminated, truncated, next_value, gamma, n_step)
    return lambda_targets(reward, terminated, truncated, next_value, gamma, td_lambda, trace)


def masked_mean(x: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """Mean of ``x`` over entries where ``mask`` is 1 (0 if none): ``[B, T] -> []``.

    Averaging over valid steps only keeps the loss scale independent of how many sampled steps
    fell on episode boundaries or final-observation rows.
    """
    return tf.reduce_sum(x * mask) / tf.maximum(tf.reduce_sum(mask), 1.0)


def huber(x: tf.Tensor, delta: float) -> tf.Tensor:
    """Elementwise Huber loss of the TD error ``x``."""
    a = tf.abs(x)
    quad = tf.minimum(a, delta)
    return 0.5 * quad**2 + delta * (a - quad)


def rescale(x: tf.Tensor, eps: float = 1e-3) -> tf.Tensor:
    """R2D2's invertible value rescaling ``h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x`` (elementwise).

    Q-values learnt in ``h``-space keep one learning rate workable across reward scales.
    """
    return tf.sign(x) * (tf.sqrt(tf.abs(x) + 1.0) - 1.0) + eps * x


def unrescale(x: tf.Tensor, eps: float = 1e-3) -> tf.Tensor:
    """The closed-form inverse of :func:`rescale` (elementwise)::

    h^-1(x) = sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)
    """
    root = (tf.sqrt(1.0 + 4.0 * eps * (tf.abs(x) + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return tf.sign(x) * (tf.square(root) - 1.0)
