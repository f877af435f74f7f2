"""FusedAdam: the same trajectory as keras.optimizers.Adam, the same state, checkpoints interchange."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from agents.optim import FusedAdam

SHAPES = [(6, 8), (8,), (3, 5, 2)]


def _run(optimizer: keras.optimizers.Optimizer, steps: int = 60) -> list[np.ndarray]:
    """``steps`` compiled updates on fixed random weights and gradients (spanning 1e-4 to 10)."""
    rng = np.random.default_rng(0)
    variables = [keras.Variable(rng.normal(size=s).astype(np.float32)) for s in SHAPES]
    optimizer.build(variables)
    apply = tf.function(lambda grads: optimizer.apply(grads, variables))
    for _ in range(steps):
        apply([tf.constant(rng.normal(size=s) * 10 ** rng.uniform(-4, 1), tf.float32) for s in SHAPES])
    state = [*optimizer._momentums, *optimizer._velocities]
    return [np.asarray(v) for v in variables + state] + [np.asarray(optimizer.iterations)]


@pytest.mark.parametrize("lr", [1e-3, 0.05])
def test_fused_adam_follows_keras_adam(lr: float) -> None:
    ref, fused = _run(keras.optimizers.Adam(learning_rate=lr)), _run(FusedAdam(learning_rate=lr))
    assert len(ref) == len(fused) == 3 * len(SHAPES) + 1
    # Rounding differs (the kernel's operation order is not the graph's): a few ulps per step, so
    # 1e-3 of one step's size after 60 steps; a wrong formula would be off by about a step (lr).
    for a, b in zip(ref, fused, strict=True):
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=1e-3 * lr)
    # The weights moved: the comparison is not between two untouched copies.
    start = [np.random.default_rng(0).normal(size=s).astype(np.float32) for s in SHAPES]
    assert all(np.abs(w - s).max() > 10 * lr for w, s in zip(ref[: len(SHAPES)], start, strict=True))


def test_fused_adam_amsgrad_falls_back_to_keras() -> None:
    ref = _run(keras.optimizers.Adam(amsgrad=True), steps=5)
    fused = _run(FusedAdam(amsgrad=True), steps=5)
    for a, b in zip(ref, fused, strict=True):
        np.testing.assert_array_equal(a, b)


def test_fused_adam_float64_falls_back_to_keras() -> None:
    def run(optimizer: keras.optimizers.Optimizer) -> np.ndarray:
        variable = keras.Variable(np.ones(4), dtype="float64")
        optimizer.build([variable])
        for _ in range(3):
            optimizer.apply([tf.constant([0.5, -1.0, 2.0, 1e-3], tf.float64)], [variable])
        return np.asarray(variable)

    ref = run(keras.optimizers.Adam())
    np.testing.assert_array_equal(run(FusedAdam()), ref)
    assert ref.dtype == np.float64 and not np.array_equal(ref, np.ones(4))


def test_fused_adam_restores_a_keras_adam_checkpoint(tmp_path) -> None:
    variables = [keras.Variable(np.ones(s, np.float32)) for s in SHAPES]
    saved = keras.optimizers.Adam()
    saved.build(variables)
    saved.apply([tf.fill(s, 0.5) for s in SHAPES], variables)
    path = tf.train.Checkpoint(optimizer=saved).save(str(tmp_path / "ckpt"))
    restored = FusedAdam()
    restored.build([keras.Variable(np.zeros(s, np.float32)) for s in SHAPES])
    tf.train.Checkpoint(optimizer=restored).restore(path).assert_existing_objects_matched()
    for a, b in zip(saved.variables, restored.variables, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(restored.iterations) == 1
