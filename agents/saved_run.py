"""A finished (or running) run loaded back for evaluation or export: its config, its learner at a
checkpoint, and the greedy acting policy."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
from pathlib import Path

import gymnasium as gym
import numpy as np
from omegaconf.errors import OmegaConfBaseException

from agents.actor import evaluate
from agents.checkpoint import LAYOUT, Checkpointer, first_line
from agents.config import Config, config_from_dict
from agents.normalizer import ObsNormalizer
from agents.policies import with_weights_of
from agents.run_state import Counters, state_part
from envs import describe_env, make_env, make_vec_env
from envs.config import ConfigError
from envs.make import EnvSpec

log = logging.getLogger("recurrl")
# Weights a saved run can act with: run (whichever its evaluations used), online, target (EMA) or
# average (the slower EMA, in runs trained with agent.average_tau).
NETWORKS = ("run", "online", "target", "average")


def check_network(network: str) -> None:
    """One-line :class:`ConfigError` unless ``network`` is one of :data:`NETWORKS` (the commands
    call it before loading a run, which builds the agent)."""
    if network not in NETWORKS:
        raise ConfigError(f"network={network!r} is invalid: allowed {'|'.join(NETWORKS)}")


@dataclasses.dataclass
class SavedRun:
    """A run's config, env description, learner restored at ``step`` and its acting policy."""

    run_dir: Path
    config: Config
    spec: EnvSpec
    learner: object
    policy: object
    step: int

    def network_name(self, network: str = "run") -> str:
        """``online``, ``target`` or ``average``: ``run`` names the network the run's own
        evaluations acted with (its ``eval.network``); one-line :class:`ConfigError` for anything
        else, and for ``average`` in a run that kept none."""
        check_network(network)
        if network == "average" and getattr(self.config.agent, "average_tau", None) is None:
            raise ConfigError(
                "network='average' is invalid for this run: it was trained without agent.average_tau; "
                "allowed run|online|target"
            )
        return self.config.eval.network if network == "run" else network

    def greedy_policy(self, network: str = "run") -> object:
        """The acting policy with the weights of :meth:`network_name`."""
        return with_weights_of(self.policy, self.learner, self.network_name(network))


def load_run(run_dir: str | Path, step: int | None = None, backend: str | None = None) -> SavedRun:
    """Load ``run_dir`` at checkpoint ``step`` (default: the newest that loads completely).

    ``backend`` overrides ``network.backend`` (an export needs the TF-only ``graph`` kernel). Raises
    :class:`ConfigError` with one line when the directory holds no usable run or no such step.
    """
    from agents.loop import build_agent  # the agent builders live with the loop

    run_dir = Path(run_dir)
    path = run_dir / "config.json"
    if not path.is_file():
        raise ConfigError(f"run={str(run_dir)!r} holds no run: {path} is missing")
    try:
        config = config_from_dict(json.loads(path.read_text()))
    except (ValueError, KeyError, OmegaConfBaseException) as exc:
        raise ConfigError(
            f"run={str(run_dir)!r}: {path} is unreadable ({str(exc).splitlines()[0]})"
        ) from None
    if backend is not None:
        config.network.backend = backend
    spec = describe_env(config.env)
    counters = Counters(env_steps=config.train.total_env_steps)  # greedy: exploration schedules ended
    learner, policy = build_agent(config, spec, counters)
    ckpt = Checkpointer(run_dir, **learner.trackables())

    def apply(extra: dict[str, np.ndarray], info: dict) -> None:
        if info.get("layout") != LAYOUT:  # older checkpoints did not save the networks' statistics
            normalizer = ObsNormalizer(spec.observation)
            normalizer.load_state_dict(state_part(extra, "obs_norm/"))
            normalizer.push(learner.networks())
        bandit = state_part(extra, "policy/")
        if bandit:  # which head greedy acting uses (agent.acting_head=bandit)
            policy.load_state_dict(bandit)

    # Acting needs the weights only (and, from checkpoints of the older layout, the observation
    # statistics; with a head bandit, its window): the replay, which can be gigabytes, is not read.
    def keys(name: str) -> bool:
        return name.startswith(("obs_norm/", "policy/bandit"))

    steps = ckpt.complete_steps()
    if step is None:
        step = ckpt.restore_latest(apply, keys)
    elif step not in steps:
        raise ConfigError(
            f"step={step} is invalid: allowed {'|'.join(map(str, steps)) or 'none (no checkpoint)'}"
        )
    else:
        try:
            apply(*ckpt.load(step, keys))
        except Exception as exc:  # noqa: BLE001 - a damaged file: one line naming the step
            good = [s for s in steps if s != step]
            raise ConfigError(
                f"step={step} is invalid: its checkpoint is damaged ({first_line(exc)}); allowed "
                f"{'|'.join(map(str, good)) or 'none'} (or no step: the newest that loads)"
            ) from None
    learner.sync_policy(policy)
    return SavedRun(run_dir, config, spec, learner, policy, step)


def evaluate_run(saved: SavedRun, episodes: int, network: str, seed: int, env=None) -> dict:
    """Greedy episodes (one per env of a fresh vector env, or of ``env``); returns the record that
    ``eval-<step>.json`` holds: returns per episode, mean, std, the success rate where the env sets
    ``env.success_return``, and the settings."""
    if episodes < 1:
        raise ConfigError(f"episodes={episodes} is invalid: allowed integers >= 1")
    network = saved.network_name(network)
    policy = saved.greedy_policy(network)
    own = env is None
    env = make_vec_env(saved.config.env, seed=seed, num_envs=episodes) if own else env
    try:
        returns = evaluate(env, policy, seed=seed)
    finally:
        if own:
            env.close()
    record = {
        "run": str(saved.run_dir),
        "step": saved.step,
        "network": network,
        "episodes": int(len(returns)),
        "seed": seed,
        "returns": [float(r) for r in returns],
        "return_mean": float(np.mean(returns)),
        "return_std": float(np.std(returns)),
    }
    success_return = saved.config.env.success_return
    if success_return is not None:  # as the run's own evaluations count a success
        record["success_rate"] = float(np.mean(returns >= success_return))
    return record


def record_video(saved: SavedRun, network: str, seed: int, episodes: int, folder: Path) -> list[str]:
    """Record ``episodes`` greedy episodes of the run's env (rendered ``rgb_array``) as mp4 files in
    ``folder``; returns their paths. One-line :class:`ConfigError` if the env cannot render or
    the video extra is missing."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # render off-screen: no display needed
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    env_config = copy.deepcopy(saved.config.env)
    probe = make_env(env_config, seed)
    modes = probe.metadata.get("render_modes", [])
    probe.close()
    if "rgb_array" not in modes:
        raise ConfigError(f"env.id={env_config.id!r} cannot render rgb_array frames (render modes: {modes})")
    env_config.kwargs = {**env_config.kwargs, "render_mode": "rgb_array"}
    env = make_env(env_config, seed)
    try:
        env = gym.wrappers.RecordVideo(env, str(folder), episode_trigger=lambda _: True, name_prefix="eval")
    except gym.error.DependencyNotInstalled as exc:
        env.close()
        raise ConfigError(f"video=true needs moviepy: pip install -e '.[video]' ({exc})") from None
    vec = gym.vector.SyncVectorEnv([lambda: env], autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    policy = saved.greedy_policy(network)
    try:
        for i in range(episodes):
            evaluate(vec, policy, seed=seed + i)
    except gym.error.DependencyNotInstalled as exc:
        raise ConfigError(f"video=true: rendering {env_config.id} needs {str(exc).splitlines()[0]}") from None
    finally:
        vec.close()
    return sorted(str(p) for p in Path(folder).glob("*.mp4"))
