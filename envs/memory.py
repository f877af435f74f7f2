"""Tiny memory tasks: a cue shown once at t=0, the answer asked after a few blank steps.

A memoryless policy cannot beat chance on them; a recurrent one solves them in seconds. They are
registered with gymnasium as ``recurrl/CueMemory-v0`` (discrete) and
``recurrl/CueMemoryContinuous-v0`` (continuous), so they work through ``env.id`` like any other env.
``obs_type`` shows the same cue and query through every observation space recurrl encodes, and
``action_type="multi_discrete"`` asks for the answer in the first entry of a ``MultiDiscrete([2, 3])``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

OBS_TYPES = ("box", "discrete", "multi_discrete", "multi_binary", "image", "dict", "tuple")


def _observation_space(obs_type: str) -> gym.spaces.Space:
    spaces = {
        "box": gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
        "discrete": gym.spaces.Discrete(6),  # 2 * cue index (0 none, 1 minus, 2 plus) + query
        "multi_discrete": gym.spaces.MultiDiscrete([3, 2]),
        "multi_binary": gym.spaces.MultiBinary(3),  # cue plus, cue minus, query
        "image": gym.spaces.Box(0, 255, (7, 7, 3), np.uint8),  # one channel lit per signal
        "dict": gym.spaces.Dict(
            {"cue": gym.spaces.Discrete(3), "query": gym.spaces.Box(0.0, 1.0, (1,), np.float32)}
        ),
        "tuple": gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.MultiBinary(1))),
    }
    if obs_type not in spaces:
        raise ValueError(f"obs_type={obs_type!r}: allowed {'|'.join(OBS_TYPES)}")
    return spaces[obs_type]


class CueMemoryEnv(gym.Env):
    """Observation ``[cue, query]``: ``cue`` is +-1 at t=0 and 0 after; ``query`` is 1 at the last step.

    Discrete: the action at the query step must equal the cue's class (0 for -1, 1 for +1) for
    reward +1, else -1. Continuous: reward ``1 - |a - cue|`` at the query step. Earlier actions earn
    nothing. The episode terminates after the query step, ``delay + 1`` steps in all.
    """

    # Episodes end by themselves (delay + 1 steps), so no time limit is needed: see make.has_time_limit.
    metadata: dict[str, Any] = {"render_modes": [], "episodes_always_end": True}

    def __init__(
        self, delay: int = 4, continuous: bool = False, obs_type: str = "box", action_type: str = "discrete"
    ) -> None:
        self.delay = int(delay)
        self.continuous = bool(continuous)
        self.obs_type = obs_type
        self.observation_space = _observation_space(obs_type)
        if self.continuous:
            self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        elif action_type == "multi_discrete":
            self.action_space = gym.spaces.MultiDiscrete([2, 3])
        else:
            self.action_space = gym.spaces.Discrete(2)
        self._t = 0
        self._cue = 1.0

    def _obs(self) -> Any:
        cue = self._cue if self._t == 0 else 0.0
        query = 1.0 if self._t == self.delay else 0.0
        index = 0 if cue == 0 else 1 if cue < 0 else 2
        bits = np.array([cue > 0, cue < 0, query > 0], np.int8)
        return {
            "box": lambda: np.array([cue, query], dtype=np.float32),
            "discrete": lambda: 2 * index + int(query),
            "multi_discrete": lambda: np.array([index, int(query)], np.int64),
            "multi_binary": lambda: bits,
            "image": lambda: np.broadcast_to(bits.astype(np.uint8) * 255, (7, 7, 3)).copy(),
            "dict": lambda: {"cue": index, "query": np.array([query], np.float32)},
            "tuple": lambda: (index, bits[2:]),
        }[self.obs_type]()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        self._cue = 1.0 if self.np_random.random() < 0.5 else -1.0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        reward = 0.0
        terminated = self._t == self.delay
        if terminated:
            if self.continuous:
                a = float(np.clip(np.asarray(action).reshape(-1)[0], -1.0, 1.0))
                reward = 1.0 - abs(a - self._cue)
            else:
                answer = np.asarray(action).reshape(-1)[0]  # MultiDiscrete: the first entry answers
                reward = 1.0 if (int(answer) == 1) == (self._cue > 0) else -1.0
        self._t += 1
        return self._obs(), reward, terminated, False, {}


def register() -> None:
    """Register the memory tasks with gymnasium (idempotent)."""
    for env_id, continuous in (
        ("recurrl/CueMemory-v0", False),
        ("recurrl/CueMemoryContinuous-v0", True),
    ):
        if env_id not in gym.registry:
            gym.register(
                id=env_id,
                entry_point="envs.memory:CueMemoryEnv",
                kwargs={"continuous": continuous},
            )
