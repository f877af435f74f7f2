"""The acting policy as a TensorFlow SavedModel that needs neither recurrl nor its native ops.

The SavedModel has two signatures (and the same two functions as attributes of the loaded object)::

    initial_state(batch_size: int32 [])            -> {"state": [B, S]}
    step(observation: [B, O], state: [B, S])        -> {"action": [B] int32 (rdqn) or [B, A] (rddpg),
                                                        "q_values": [B, A] (rdqn) | "action_mean": [B, A],
                                                        "state": [B, S]}

``state`` is the recurrent state flattened as in replay (``(h, c)`` for an LSTM, ``h`` for a GRU),
followed by the previous action when the network reads it (``network.inputs=[prev_action]``).
Zero it (or call ``initial_state``) where an episode starts. rdqn acts greedily (argmax Q);
rddpg/rtd3 deterministically (the actor's mean, in the env's action units).
"""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf

from agents.saved_run import SavedRun
from envs.config import ConfigError


class PolicyModule(tf.Module):
    """The greedy policy of a :class:`SavedRun` as a ``tf.Module`` with flat-tensor signatures."""

    def __init__(self, saved: SavedRun, network: str = "online") -> None:
        super().__init__(name="recurrl_policy")
        inputs = list(saved.config.network.inputs)
        if any(i != "prev_action" for i in inputs):
            raise ConfigError(
                f"network.inputs={inputs} cannot be exported: allowed [] or [prev_action] "
                "(the previous reward is not an input of step)"
            )
        if network not in ("online", "target"):
            raise ConfigError(f"network={network!r} is invalid: allowed online|target")
        self.net = saved.learner.eval_network(network)
        self.discrete = saved.spec.discrete
        self.num_actions = saved.spec.num_actions
        self.obs_dim = saved.spec.obs_dim
        self.state_sizes = tuple(self.net.state_sizes)
        self.prev_action = "prev_action" in inputs
        self.state_dim = sum(self.state_sizes) + (self.num_actions if self.prev_action else 0)
        if not self.discrete:
            low, high = saved.spec.action_low, saved.spec.action_high
            self.center = tf.constant((high + low) / 2, tf.float32)
            self.half = tf.constant((high - low) / 2, tf.float32)
        self.initial_state = tf.function(self._initial_state, input_signature=[tf.TensorSpec([], tf.int32)])
        spec = [
            tf.TensorSpec([None, self.obs_dim], tf.float32),
            tf.TensorSpec([None, self.state_dim], tf.float32),
        ]
        self.step = tf.function(self._step, input_signature=spec)

    def _initial_state(self, batch_size: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"state": tf.zeros(tf.stack([batch_size, self.state_dim]), tf.float32)}

    def _step(self, observation: tf.Tensor, state: tf.Tensor) -> dict[str, tf.Tensor]:
        parts, start = [], 0
        for size in self.state_sizes:
            parts.append(state[:, start : start + size])
            start += size
        x = observation
        if self.prev_action:
            x = tf.concat([x, state[:, start:]], axis=-1)
        x = x[:, None, :]  # [B, 1, F]
        reset = tf.zeros(tf.shape(x)[:2], tf.float32)
        if self.discrete:
            q, new_state = self.net.unroll(x, tuple(parts), reset)
            q = q[:, 0]
            action = tf.argmax(q, axis=-1, output_type=tf.int32)
            taken = tf.one_hot(action, self.num_actions)
            out = {"action": action, "q_values": q}
        else:
            h, new_state = self.net.encode(x, tuple(parts), reset)
            taken = self.net.policy(h)[:, 0]  # [-1, 1]
            mean = self.center + self.half * taken
            out = {"action": mean, "action_mean": mean}
        flat = list(new_state) + ([taken] if self.prev_action else [])
        out["state"] = tf.concat(flat, axis=-1) if flat else tf.zeros([tf.shape(x)[0], 0])
        return out


def export_saved_model(saved: SavedRun, out: str | Path, network: str = "online") -> Path:
    """Write the policy of ``saved`` as a SavedModel directory ``out``; returns its path."""
    module = PolicyModule(saved, network)
    out = Path(out)
    signatures = {
        "initial_state": module.initial_state.get_concrete_function(),
        "step": module.step.get_concrete_function(),
    }
    tf.saved_model.save(module, str(out), signatures=signatures)
    return out
