"""What a run checkpoints besides its TensorBoard and CSV history: counters, learner, replay,
observation statistics and the acting policy's random state; and how it is put back."""

from __future__ import annotations

import dataclasses
import json

import keras
import numpy as np

from agents.checkpoint import Checkpointer


@dataclasses.dataclass
class Counters:
    """Progress counters, checkpointed with the run."""

    env_steps: int = 0
    updates: int = 0
    episodes: int = 0
    evaluations: int = 0
    update_budget: float = 0.0
    wall_time_s: float = 0.0


def state_part(extra: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """The arrays of a checkpoint's run state saved under ``prefix`` (``obs_norm/``, ...), unprefixed."""
    return {k[len(prefix) :]: v for k, v in extra.items() if k.startswith(prefix)}


def save_run_state(ckpt: Checkpointer, counters: Counters, replay, policy, learner, normalizer) -> None:
    """Checkpoint everything a run needs to continue exactly: the learner's trackables, replay,
    observation statistics, the policy's RNG and exploration state, and the counters."""
    extra = {f"replay/{k}": v for k, v in replay.state_dict().items()}
    extra.update({f"obs_norm/{k}": v for k, v in normalizer.state_dict().items()})
    rng = json.dumps(policy.rng.bit_generator.state)
    extra["policy_rng"] = np.frombuffer(rng.encode(), np.uint8)
    extra.update({f"policy/{k}": v for k, v in policy.state_dict().items()})
    learner.updates.assign(counters.updates)
    ckpt.save(counters.env_steps, extra, {"counters": dataclasses.asdict(counters)})


def restore_run_state(ckpt: Checkpointer, counters: Counters, replay, policy, learner, normalizer) -> int:
    """Restore the newest usable checkpoint into the run's parts; returns its env step.

    Learning rates are taken from the config, not the checkpoint, so ``agent.lr`` can change on
    resume (Keras optimisers checkpoint their rate as a variable). A decaying rate
    (``agent.lr_end``) is a schedule rebuilt from the config that follows the restored iterations.
    """
    optimizers = {
        k: v
        for k, v in learner.trackables().items()
        if isinstance(v, keras.optimizers.Optimizer)
        and not isinstance(v._learning_rate, keras.optimizers.schedules.LearningRateSchedule)
    }
    rates = {k: float(keras.ops.convert_to_numpy(o.learning_rate)) for k, o in optimizers.items()}

    def apply(extra: dict[str, np.ndarray], info: dict) -> None:
        replay.load_state_dict(state_part(extra, "replay/"))
        policy.rng.bit_generator.state = json.loads(bytes(extra["policy_rng"]).decode())
        policy.load_state_dict(state_part(extra, "policy/"))
        normalizer.load_state_dict(state_part(extra, "obs_norm/"))
        restored = Counters(**info["counters"])
        for field in dataclasses.fields(Counters):
            setattr(counters, field.name, getattr(restored, field.name))

    step = ckpt.restore_latest(apply)
    for k, o in optimizers.items():
        o.learning_rate = rates[k]
    normalizer.push(learner.networks())
    learner.sync_policy(policy)
    return step
