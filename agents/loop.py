"""The training loop: ``train(config)`` runs a whole experiment, with no Hydra in sight.

env (vectorised) -> Actor (numpy policy, carries state) -> SequenceReplay -> Learner.step ->
MetricsWriter, with greedy evaluations and checkpoints at fixed env-step intervals.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import time
from collections import deque
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf
from tqdm import tqdm

from agents import native
from agents.actor import Actor, Policy, evaluate
from agents.agent import Learner, lookup
from agents.checkpoint import Checkpointer, is_run_dir
from agents.config import Config, TrainConfig, validate, validate_for_env
from agents.metrics import MetricsWriter
from agents.networks import NumpyNetwork
from agents.normalizer import ObsNormalizer
from agents.replay import SequenceReplay
from envs import describe_env, make_vec_env
from envs.config import ConfigError
from envs.make import EnvSpec

log = logging.getLogger("recurrl")

EVAL_SEED_OFFSET = 1_000_003  # eval envs never share seeds with training envs


@dataclasses.dataclass
class Counters:
    """Progress counters, checkpointed with the run."""

    env_steps: int = 0
    updates: int = 0
    episodes: int = 0
    evaluations: int = 0
    update_budget: float = 0.0
    wall_time_s: float = 0.0


def build_agent(config: Config, spec: EnvSpec, counters: Counters) -> tuple[Learner, Policy]:
    """The learner and its acting policy for ``config.agent.kind``, from the agent registry."""
    return lookup(config.agent.kind).build(config, spec, counters)


def _prepare_run_dir(config: Config) -> Path:
    if config.resume:
        if not is_run_dir(config.resume):
            raise ConfigError(
                f"resume={config.resume!r} holds no run: no complete checkpoint under "
                f"{Path(config.resume) / 'ckpt'}"
            )
        return Path(config.resume)
    run_dir = Path(config.run_dir)
    if is_run_dir(run_dir):
        raise ConfigError(
            f"run_dir={str(run_dir)!r} already holds a run; pass resume={run_dir} to continue it "
            "or choose another hydra.run.dir"
        )
    return run_dir


class _LearnerLog:
    """Averages learner scalars and pools TD errors between writes."""

    def __init__(self) -> None:
        self.scalars: dict[str, list[float]] = {}
        self.td: dict[str, list[np.ndarray]] = {}
        self.hist: dict[str, list[np.ndarray]] = {}

    def add(self, metrics: dict[str, np.ndarray]) -> None:
        for k, v in metrics.items():
            if np.ndim(v) == 0:
                self.scalars.setdefault(k, []).append(float(v))
            elif k.startswith("histogram/"):  # e.g. histogram/policy_action -> charts/policy_action
                self.hist.setdefault(k[len("histogram/") :], []).append(np.ravel(v))
        for prefix in [k[: -len("td_error")] for k in metrics if k.endswith("td_error")]:
            self.td.setdefault(prefix, []).append(
                np.stack([metrics[prefix + "td_error"], metrics[prefix + "mask"]])
            )

    def write(self, writer: MetricsWriter, step: int) -> None:
        writer.scalars(step, {f"losses/{k}": np.mean(v) for k, v in self.scalars.items()})
        for prefix, arrays in self.td.items():
            pooled = np.concatenate(arrays, axis=1)  # [2, n*B, T]
            tag = "td" if not prefix else f"td_{prefix.rstrip('_')}"
            writer.learner(step, {"td_error": pooled[0], "mask": pooled[1]}, prefix=tag)
        for name, arrays in self.hist.items():
            writer.histogram(step, f"charts/{name}", np.concatenate(arrays))
        self.scalars, self.td, self.hist = {}, {}, {}


def configure_tf_threads(t: TrainConfig) -> bool:
    """Set TF's intra- and inter-op thread pools from ``t``; False (and a warning) if TF already runs
    with other settings (they are fixed once the TF runtime has started in this process)."""
    try:
        tf.config.threading.set_intra_op_parallelism_threads(t.tf_intra_op_threads)
        tf.config.threading.set_inter_op_parallelism_threads(t.tf_inter_op_threads)
    except RuntimeError:
        current = (
            tf.config.threading.get_intra_op_parallelism_threads(),
            tf.config.threading.get_inter_op_parallelism_threads(),
        )
        log.warning(
            "TF already started in this process with (intra, inter) op threads %s; "
            "train.tf_intra_op_threads=%d, train.tf_inter_op_threads=%d not applied",
            current,
            t.tf_intra_op_threads,
            t.tf_inter_op_threads,
        )
        return False
    return True


def train(config: Config) -> dict:
    """Run (or resume) one experiment; returns the summary also written to ``summary.json``."""
    validate(config)
    spec = describe_env(config.env)
    validate_for_env(config, spec)
    configure_tf_threads(config.train)
    if config.network.kernel == "native":  # asked for explicitly: fail before anything is written
        ok, reason = native.available()
        if not ok:
            raise ConfigError(
                f"network.kernel=native is unavailable here ({reason}): allowed auto|graph|scan"
            )
    run_dir = _prepare_run_dir(config)
    keras.utils.set_random_seed(config.seed)
    if config.train.deterministic:
        tf.config.experimental.enable_op_determinism()
    counters = Counters()
    learner, policy = build_agent(config, spec, counters)
    r = config.replay
    replay = SequenceReplay(
        r.capacity,
        config.env.num_envs,
        learner.seq_len,
        learner.replay_fields(),
        learner.state_dim,
        zero_initial_state=r.initial_state == "zero",
        seed=config.seed + 29,
    )
    normalizer = ObsNormalizer(spec.obs_dim)
    ckpt = Checkpointer(run_dir, **learner.trackables())
    if config.resume:
        _restore(ckpt, counters, replay, policy, learner, normalizer)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(config), indent=2))
    env = make_vec_env(config.env, seed=config.seed + 1000 * counters.evaluations)
    eval_env = make_vec_env(config.env, seed=EVAL_SEED_OFFSET, num_envs=config.eval.episodes)
    actor = Actor(env, policy, replay, seed=config.seed + 7919 * counters.env_steps)
    writer = MetricsWriter(run_dir)
    try:
        return _loop(config, counters, actor, replay, learner, policy, eval_env, writer, ckpt, normalizer)
    finally:
        writer.close()
        env.close()
        eval_env.close()


def _loop(config, counters, actor, replay, learner, policy, eval_env, writer, ckpt, normalizer) -> dict:
    t, started = config.train, time.perf_counter() - counters.wall_time_s
    recent = deque(maxlen=20)
    log = _LearnerLog()
    evals: list[dict] = []
    next_eval = (counters.env_steps // config.eval.every_env_steps + 1) * config.eval.every_env_steps
    next_ckpt = (counters.env_steps // t.checkpoint_every_env_steps + 1) * t.checkpoint_every_env_steps
    bar = tqdm(
        total=t.total_env_steps,
        initial=counters.env_steps,
        disable=not t.progress_bar,
        unit="step",
        dynamic_ncols=True,
    )
    perf_mark = (time.perf_counter(), counters.env_steps, counters.updates)
    n = actor.num_envs
    while counters.env_steps < t.total_env_steps:
        stats = actor.step(explore=True)
        normalizer.update(actor.obs)
        counters.env_steps += n
        bar.update(n)
        for ret, length in zip(stats.returns, stats.lengths, strict=True):
            counters.episodes += 1
            recent.append(ret)
            writer.scalars(
                counters.env_steps, {"charts/episode_return": ret, "charts/episode_length": length}
            )
        if counters.env_steps >= t.learning_starts and replay.can_sample():
            counters.update_budget += n * t.updates_per_step
            if counters.update_budget >= 1.0:
                normalizer.push(_networks(learner))
            while counters.update_budget >= 1.0:
                metrics = learner.step(replay.sample(config.agent.batch_size))
                learner.sync_policy(policy)
                counters.update_budget -= 1.0
                counters.updates += 1
                log.add(metrics)
                if counters.updates % t.log_every_updates == 0:
                    log.write(writer, counters.env_steps)
        if counters.env_steps >= next_eval or counters.env_steps >= t.total_env_steps:
            next_eval += config.eval.every_env_steps
            now = time.perf_counter()
            dt = max(now - perf_mark[0], 1e-9)
            writer.scalars(
                counters.env_steps,
                {
                    "perf/env_steps_per_s": (counters.env_steps - perf_mark[1]) / dt,
                    "perf/updates_per_s": (counters.updates - perf_mark[2]) / dt,
                    **learner.schedule_scalars(counters.env_steps),
                },
            )
            evals.append(_evaluate(config, counters, policy, eval_env, writer, recent, started, learner))
            bar.set_postfix(
                ret=f"{np.mean(recent) if recent else float('nan'):.1f}",
                eval=f"{evals[-1]['eval_return_mean']:.1f}",
                refresh=False,
            )
            writer.flush()
            perf_mark = (time.perf_counter(), counters.env_steps, counters.updates)
        if counters.env_steps >= next_ckpt or counters.env_steps >= t.total_env_steps:
            next_ckpt += t.checkpoint_every_env_steps
            counters.wall_time_s = time.perf_counter() - started
            _save(ckpt, counters, replay, policy, learner, normalizer)
    bar.close()
    counters.wall_time_s = time.perf_counter() - started
    summary = _summary(config, counters, evals)
    writer.summary(summary)
    return summary


def _evaluate(config, counters, policy, eval_env, writer, recent, started, learner) -> dict:
    seed = EVAL_SEED_OFFSET + config.seed * 100_003 + counters.evaluations * config.eval.episodes
    if config.eval.network == "target":  # greedy episodes with the EMA (target) weights
        policy = copy.copy(policy)
        policy.net = NumpyNetwork(learner.eval_network("target"))
    returns = evaluate(eval_env, policy, seed=seed)
    counters.evaluations += 1
    row = {
        "env_steps": counters.env_steps,
        "updates": counters.updates,
        "wall_time_s": round(time.perf_counter() - started, 3),
        "eval_return_mean": float(np.mean(returns)),
        "eval_return_std": float(np.std(returns)),
        "train_return_mean": float(np.mean(recent)) if recent else float("nan"),
    }
    writer.progress(row)
    writer.scalars(
        counters.env_steps,
        {"eval/return_mean": row["eval_return_mean"], "eval/return_std": row["eval_return_std"]},
    )
    return row


def _summary(config: Config, counters: Counters, evals: list[dict]) -> dict:
    means = [e["eval_return_mean"] for e in evals]
    wall = max(counters.wall_time_s, 1e-9)
    return {
        "agent": config.agent.kind,
        "preset": config.agent.name,
        "env": config.env.id,
        "cell": config.network.cell,
        "seed": config.seed,
        "env_steps": counters.env_steps,
        "updates": counters.updates,
        "episodes": counters.episodes,
        "wall_time_s": round(counters.wall_time_s, 3),
        "env_steps_per_s": counters.env_steps / wall,
        "final_eval_return_mean": means[-1] if means else None,
        "final_eval_return_std": evals[-1]["eval_return_std"] if evals else None,
        "best_eval_return_mean": max(means) if means else None,
        "evaluations": evals,
    }


def _networks(learner) -> list:
    return learner.networks() if hasattr(learner, "networks") else []


def _save(ckpt: Checkpointer, counters, replay, policy, learner, normalizer) -> None:
    extra = {f"replay/{k}": v for k, v in replay.state_dict().items()}
    extra.update({f"obs_norm/{k}": v for k, v in normalizer.state_dict().items()})
    rng = json.dumps(policy.rng.bit_generator.state)
    extra["policy_rng"] = np.frombuffer(rng.encode(), np.uint8)
    extra.update({f"policy/{k}": v for k, v in policy.state_dict().items()})
    learner.updates.assign(counters.updates)
    ckpt.save(counters.env_steps, extra, {"counters": dataclasses.asdict(counters)})


def _restore(ckpt: Checkpointer, counters, replay, policy, learner, normalizer) -> None:
    step = ckpt.latest()
    extra, info = ckpt.restore(step)
    replay.load_state_dict({k[len("replay/") :]: v for k, v in extra.items() if k.startswith("replay/")})
    policy.rng.bit_generator.state = json.loads(bytes(extra["policy_rng"]).decode())
    policy.load_state_dict({k.split("/", 1)[1]: v for k, v in extra.items() if k.startswith("policy/")})
    normalizer.load_state_dict({k.split("/", 1)[1]: v for k, v in extra.items() if k.startswith("obs_norm/")})
    normalizer.push(_networks(learner))
    for k, v in info["counters"].items():
        setattr(counters, k, v)
    learner.sync_policy(policy)
