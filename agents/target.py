"""Target networks: exact copies at build, then soft (tau) exponential-moving-average updates.

After every optimiser step (or every ``period`` steps)::

    target <- target + tau * (online - target)        # EMA with decay 1 - tau

for every trainable weight of every layer, recurrent kernels included. Variables are paired by
their path relative to the owning model (``online_q/core/cell/kernel`` <-> ``target_q/core/cell/
kernel``) and shape-checked, never by list position: a layer added in a different order on one side
fails loudly instead of averaging unrelated weights. Non-trainable float state is copied, not
averaged; integer RNG state (the seed variable Keras 3 keeps in recurrent cells) is left alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import tensorflow as tf


def _relative_path(model: keras.Model, variable: keras.Variable) -> str:
    prefix = model.name + "/"
    if not variable.path.startswith(prefix):
        raise ValueError(f"variable {variable.path!r} is not under model {model.name!r}")
    return variable.path[len(prefix) :]


def pair_variables(
    online: keras.Model, target: keras.Model, trainable: bool = True
) -> list[tuple[keras.Variable, keras.Variable]]:
    """``(online_var, target_var)`` pairs matched by relative path, with equal shapes and dtypes.

    ``trainable=False`` pairs the non-trainable floating-point variables instead (integer RNG
    state, which Keras 3 keeps outside the model's name scope, is never paired).
    """

    def collect(model: keras.Model) -> dict[str, keras.Variable]:
        variables = model.trainable_variables if trainable else model.non_trainable_variables
        return {
            _relative_path(model, v): v
            for v in variables
            if trainable or (v.dtype.startswith("float") and v.path.startswith(model.name + "/"))
        }

    src, dst = collect(online), collect(target)
    if src.keys() != dst.keys():
        missing = sorted(src.keys() ^ dst.keys())
        raise ValueError(f"online and target variables differ at {missing[:5]}")
    pairs = []
    for path in sorted(src):
        o, t = src[path], dst[path]
        if tuple(o.shape) != tuple(t.shape) or o.dtype != t.dtype:
            raise ValueError(f"{path}: online {o.shape}/{o.dtype} != target {t.shape}/{t.dtype}")
        pairs.append((o, t))
    return pairs


class TargetUpdater:
    """Fused soft update of one or more target networks toward their online twins.

    ``updater(tau)`` runs every EMA assignment in one compiled function (one dispatch instead of
    one per variable). ``updater.copy()`` makes the targets exact copies (used right after build).
    """

    def __init__(self, pairs: Sequence[tuple[keras.Model, keras.Model]]) -> None:
        self.soft_pairs: list[tuple[keras.Variable, keras.Variable]] = []
        self.copy_pairs: list[tuple[keras.Variable, keras.Variable]] = []
        for online, target in pairs:
            self.soft_pairs += pair_variables(online, target, trainable=True)
            self.copy_pairs += pair_variables(online, target, trainable=False)
        self._soft = tf.function(self._soft_update, input_signature=[tf.TensorSpec([], tf.float32)])

    def _soft_update(self, tau: tf.Tensor) -> None:
        # (1 - tau) * target + tau * online: the same EMA, but exact at tau=1 (copy) and tau=0.
        for online, target in self.soft_pairs:
            target.assign((1.0 - tau) * target + tau * online)
        for online, target in self.copy_pairs:
            target.assign(online)

    def __call__(self, tau: float | tf.Tensor) -> None:
        """EMA step: ``target <- target + tau * (online - target)`` for all paired weights."""
        self._soft(tf.convert_to_tensor(tau, tf.float32))

    def update_in_graph(self, tau: tf.Tensor) -> None:
        """The same update, for use inside another ``tf.function`` (no extra dispatch)."""
        self._soft_update(tau)

    def update_if(self, due: tf.Tensor, tau: tf.Tensor) -> tf.Tensor:
        """The update when the boolean ``due`` holds (a ``tf.cond`` inside another ``tf.function``:
        a target period > 1); returns whether it ran, for a control dependency."""

        def update() -> tf.Tensor:
            self._soft_update(tau)
            return tf.constant(True)

        return tf.cond(due, update, lambda: tf.constant(False))

    def copy(self) -> None:
        """Hard copy: every paired target weight becomes exactly equal to the online one."""
        for online, target in self.soft_pairs + self.copy_pairs:
            target.assign(online)
