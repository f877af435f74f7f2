"""Calling a learner's compiled update step with little Python around it.

Calling a ``tf.function`` with a dict of numpy arrays pays, on every call, for argument binding,
the trace-cache lookup and TensorFlow's conversion of each array; next to a learner update of a few
milliseconds that Python work is worth removing (figures: docs/performance.md, "Learner speed").
:class:`CompiledStep` traces the function once, converts each input with ``tf.constant`` and calls
the concrete function's flat call (``_call_flat``: inputs already flattened, no signature binding)
where this TensorFlow has it. ``_call_flat`` is a private method: TensorFlow is pinned, and where
the method is missing the concrete function's public call is used.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import tensorflow as tf


class CompiledStep:
    """Calls ``function`` (a ``tf.function`` whose input signature is one dict of ``TensorSpec``)
    through its concrete function; returns its dict of outputs as numpy arrays."""

    def __init__(self, function: tf.types.experimental.PolymorphicFunction) -> None:
        (spec,) = function.input_signature
        self.function = function
        self.spec: dict[str, tf.TensorSpec] = dict(spec)
        self._concrete = None  # traced on the first call

    def __call__(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``feed``: one array per key of the signature, of its dtype and shape (a mismatch raises)."""
        if self._concrete is None:
            self._concrete = self.function.get_concrete_function()
        tensors = {}
        for key, spec in self.spec.items():
            value = tf.constant(feed[key], dtype=spec.dtype)
            if not spec.shape.is_compatible_with(value.shape):
                raise ValueError(f"{key}: shape {tuple(value.shape)} does not match {spec.shape}")
            tensors[key] = value
        call_flat = getattr(self._concrete, "_call_flat", None)
        if call_flat is None:
            outputs = self._concrete(tensors)
        else:  # inputs in the order the function flattens its signature (tf.nest: sorted keys)
            outputs = call_flat(tf.nest.flatten(tensors), self._concrete.captured_inputs)
        result = {}
        for key, value in outputs.items():
            result[key] = value.numpy()
        return result
