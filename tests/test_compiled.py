"""CompiledStep: the learners' update step called through its concrete function."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from agents.compiled import CompiledStep

SPEC = {"x": tf.TensorSpec([2, 3], tf.float32), "n": tf.TensorSpec([2], tf.int32)}


def make() -> tuple[tf.types.experimental.PolymorphicFunction, tf.Variable]:
    total = tf.Variable(0.0)

    def step(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        y = tf.reduce_sum(batch["x"], axis=1) * tf.cast(batch["n"], tf.float32)  # [2]
        total.assign_add(tf.reduce_sum(y))
        return {"y": y, "total": tf.identity(total)}

    return tf.function(step, input_signature=[SPEC]), total


def test_same_outputs_and_side_effects_as_the_function_traced_once() -> None:
    fn, total = make()
    run = CompiledStep(fn)
    feed = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.array([1, 2], np.int32)}
    got = run(feed)
    assert isinstance(got["y"], np.ndarray)
    np.testing.assert_array_equal(got["y"], [3.0, 24.0])
    want = {k: v.numpy() for k, v in fn(feed).items()}
    np.testing.assert_array_equal(got["y"], want["y"])
    assert float(total.numpy()) == 54.0 and want["total"] == 54.0  # both calls updated the variable
    assert fn.experimental_get_tracing_count() == 1


def test_a_wrong_shape_is_refused_naming_the_key() -> None:
    run = CompiledStep(make()[0])
    with pytest.raises(ValueError, match="x: shape \\(2, 4\\)"):
        run({"x": np.zeros((2, 4), np.float32), "n": np.zeros(2, np.int32)})
