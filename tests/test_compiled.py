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


def test_inputs_reach_their_keys_by_the_flat_call_and_the_public_one() -> None:
    """Same-dtype inputs given out of sorted order land on their own keys, both through the flat
    call and through the public call the step falls back to where TF lacks ``_call_flat``."""
    spec = {"b": tf.TensorSpec([2], tf.float32), "a": tf.TensorSpec([2], tf.float32)}
    fn = tf.function(lambda batch: {"d": batch["a"] - 10.0 * batch["b"]}, input_signature=[spec])
    feed = {"b": np.array([1.0, 2.0], np.float32), "a": np.array([5.0, 7.0], np.float32)}
    run = CompiledStep(fn)
    np.testing.assert_array_equal(run(feed)["d"], [-5.0, -13.0])

    class Public:  # the concrete function without its private flat call
        def __init__(self, concrete) -> None:
            self.concrete = concrete

        def __call__(self, tensors):
            return self.concrete(tensors)

    run._concrete = Public(run._concrete)
    np.testing.assert_array_equal(run(feed)["d"], [-5.0, -13.0])
