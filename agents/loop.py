"""The training loop: ``train(config)`` runs a whole experiment, with no Hydra in sight.

env (vectorised) -> Actor (numpy policy, carries state) -> SequenceReplay -> Learner.step ->
MetricsWriter, with greedy evaluations and checkpoints at fixed env-step intervals. The acting part
is an :class:`agents.acting.ActingSource`: the Actor in this process (``runner=local``) or Ray
workers (``runner=ray``, :mod:`agents.distributed`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections import deque
from pathlib import Path

import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf
from tqdm import tqdm

from agents import kernels
from agents.acting import ActingSource, make_source, with_training_envs
from agents.actor import Policy, evaluate
from agents.agent import Learner, lookup
from agents.checkpoint import Checkpointer, is_run_dir
from agents.config import Config, TrainConfig, validate, validate_for_env
from agents.guards import NonFiniteError, StopSignals
from agents.metrics import LearnerLog, MetricsWriter, nonfinite_metrics, read_progress, rewind
from agents.normalizer import ObsNormalizer
from agents.policies import with_weights_of
from agents.replay import SequenceReplay
from agents.run_state import Counters, restore_run_state, save_run_state
from agents.rundir import RunLock, atomic_write, claim_new, claim_resume, redirect_file_logs
from envs import describe_env, describe_non_finite, make_vec_env
from envs.config import ConfigError
from envs.make import EnvSpec

log = logging.getLogger("recurrl")

# Each random stream of a run draws from ``seed`` plus its own offset, so no two share a seed.
EVAL_SEED_OFFSET = 1_000_003  # eval envs never share seeds with training envs
REPLAY_SEED_OFFSET = 29  # replay sampling
ENV_RESEED_OFFSET = 1000  # training envs: seed + this * evaluations so far (a resumed run re-seeds)
ACTOR_RESET_SEED_STRIDE = 7919  # first reset of the actor's envs: seed + this * env steps so far

__all__ = ["Counters", "NonFiniteError", "build_agent", "configure_tf_threads", "train"]


def build_agent(config: Config, spec: EnvSpec, counters: Counters) -> tuple[Learner, Policy]:
    """The learner and its acting policy for ``config.agent.kind``, from the agent registry."""
    return lookup(config.agent.kind).build(config, spec, counters)


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


def _claim_run_dir(config: Config) -> RunLock:
    """Claim the run directory: the resumed one, or a fresh one (suffixed if another launch holds it)."""
    if config.resume:
        run_dir = Path(config.resume)
        if not is_run_dir(run_dir):
            raise ConfigError(
                f"resume={config.resume!r} holds no run: no complete checkpoint under {run_dir / 'ckpt'}"
            )
        return claim_resume(run_dir)
    lock = claim_new(Path(config.run_dir))
    if lock.run_dir != Path(config.run_dir):
        redirect_file_logs(config.run_dir, lock.run_dir)
        config.run_dir = str(lock.run_dir)
    return lock


def train(config: Config) -> dict:
    """Run (or resume) one experiment; returns the summary also written to ``summary.json``.

    SIGTERM or SIGINT end the run cleanly: the current step finishes, a checkpoint is written and
    the summary says where to resume from. Raises :class:`ConfigError` for bad input and
    :class:`NonFiniteError` when the env or the learner produce NaN/Inf (the last checkpoint kept).
    """
    validate(config)
    spec = describe_env(config.env)
    validate_for_env(config, spec)
    configure_tf_threads(config.train)
    # Build the native ops (if they can be used) before the loop, never inside the first update.
    ok, reason = kernels.build_native_ahead(config.network)
    if config.network.backend == "native" and not ok:
        raise ConfigError(f"network.backend=native is unavailable here ({reason}): allowed auto|graph|scan")
    lock = _claim_run_dir(config)
    try:
        return _run(config, spec, lock.run_dir)
    finally:
        lock.release()


def _run(config: Config, spec: EnvSpec, run_dir: Path) -> dict:
    keras.utils.set_random_seed(config.seed)
    if config.train.deterministic:
        tf.config.experimental.enable_op_determinism()
    counters = Counters()
    learner, policy = build_agent(with_training_envs(config), spec, counters)
    r = config.replay
    replay = SequenceReplay(
        r.capacity,
        with_training_envs(config).env.num_envs,
        learner.seq_len,
        learner.replay_fields(),
        learner.state_dim,
        zero_initial_state=r.initial_state == "zero",
        seed=config.seed + REPLAY_SEED_OFFSET,
        priority=r,
    )
    log.info(
        "replay: %d rows x %d envs, %.1f MiB (observation leaves: %s)",
        replay.rows,
        replay.num_envs,
        replay.nbytes / 2**20,
        ", ".join(f"{leaf.name} {leaf.kind} {list(leaf.shape)} {leaf.dtype}" for leaf in spec.observation),
    )
    normalizer = ObsNormalizer(spec.observation)
    ckpt = Checkpointer(run_dir, **learner.trackables())
    evals: list[dict] = []
    if config.resume:
        step = restore_run_state(ckpt, counters, replay, policy, learner, normalizer)
        if counters.env_steps >= config.train.total_env_steps:
            return _finished_summary(config, counters, run_dir)
        evals = rewind(run_dir, step)
        replay.end_episodes()
        log.info("resumed %s at env step %d", run_dir, counters.env_steps)
    atomic_write(run_dir / "config.json", json.dumps(dataclasses.asdict(config), indent=2))
    env_seed = config.seed + ENV_RESEED_OFFSET * counters.evaluations
    reset_seed = config.seed + ACTOR_RESET_SEED_STRIDE * counters.env_steps
    eval_env = make_vec_env(config.env, seed=EVAL_SEED_OFFSET, num_envs=config.eval.episodes)
    source = make_source(config, spec, policy, replay, counters, env_seed, reset_seed)
    writer = MetricsWriter(run_dir)
    choice = kernels.for_network(config.network)
    log.info("kernels: recurrence %s, dense layers %s (%s)", choice.recurrence, choice.dense, choice.reason)
    writer.text(counters.env_steps, "run/kernels", json.dumps(choice.as_dict()))
    if not config.resume:
        hparams = {k: v for k, v in dataclasses.asdict(config).items() if k not in ("run_dir", "resume")}
        writer.hparams(hparams, trial=run_dir.name)
    parts = _Run(
        config, counters, source, replay, learner, policy, eval_env, writer, ckpt, normalizer, choice
    )
    try:
        with StopSignals() as stop:
            return _loop(parts, evals, stop)
    finally:
        writer.close()
        source.close()
        eval_env.close()


def _finished_summary(config: Config, counters: Counters, run_dir: Path) -> dict:
    """A resumed run that already reached its budget: nothing is written, the summary is returned."""
    log.info(
        "%s already reached train.total_env_steps=%d (at env step %d): nothing to do; raise "
        "train.total_env_steps to train on",
        run_dir,
        config.train.total_env_steps,
        counters.env_steps,
    )
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return _summary(config, counters, read_progress(run_dir / "progress.csv"), "finished")


@dataclasses.dataclass
class _Run:
    """What the loop drives."""

    config: Config
    counters: Counters
    source: ActingSource
    replay: SequenceReplay
    learner: Learner
    policy: Policy
    eval_env: gym.vector.VectorEnv
    writer: MetricsWriter
    ckpt: Checkpointer
    normalizer: ObsNormalizer
    kernels: kernels.KernelChoice


def _loop(run: _Run, evals: list[dict], stop: StopSignals) -> dict:
    config, counters, source, replay, learner = run.config, run.counters, run.source, run.replay, run.learner
    writer, t = run.writer, config.train
    started = time.perf_counter() - counters.wall_time_s
    recent = deque(maxlen=20)
    log_ = LearnerLog()
    next_eval = (counters.env_steps // config.eval.every_env_steps + 1) * config.eval.every_env_steps
    next_ckpt = (counters.env_steps // t.checkpoint_every_env_steps + 1) * t.checkpoint_every_env_steps
    bar = tqdm(
        total=t.total_env_steps,
        initial=counters.env_steps,
        disable=not t.progress_bar,
        unit="step",
        dynamic_ncols=True,
    )
    # perf/* rates are steady-state: the window leaves out the first update's tracing and
    # compiling (logged once as perf/first_update_s) and checkpoint writes (perf/checkpoint_s).
    perf_mark = [time.perf_counter(), counters.env_steps, counters.updates]
    compiled, first_update_s = False, None  # the process's first update traces and compiles
    saved_at = counters.env_steps
    while counters.env_steps < t.total_env_steps:
        acted = source.collect()  # rows written to replay
        n = acted.env_steps
        counters.env_steps += n
        bad = describe_non_finite(acted.obs, acted.reward)
        if bad:
            _stop_nonfinite(run, evals, started, bad)
        run.normalizer.update(acted.obs)
        bar.update(n)
        ends = acted.ends or [n] * len(acted.returns)
        for ret, length, end in zip(acted.returns, acted.lengths, ends, strict=True):
            counters.episodes += 1
            recent.append(ret)
            step = counters.env_steps - n + end
            writer.scalars(step, {"charts/episode_return": ret, "charts/episode_length": length})
        if counters.env_steps >= t.learning_starts and replay.can_sample():
            counters.update_budget += n * t.updates_per_step
            if counters.update_budget >= 1.0:
                run.normalizer.push(learner.networks())
            while counters.update_budget >= 1.0:
                began = time.perf_counter()
                metrics = learner.step(replay.sample(config.agent.batch_size, counters.updates))
                if not compiled:
                    compiled, first_update_s = True, time.perf_counter() - began
                    perf_mark[0] += first_update_s
                learner.sync_policy(run.policy)  # the mirror copies the weights before it next acts
                bad = nonfinite_metrics(metrics)
                if bad:
                    _stop_nonfinite(run, evals, started, bad)
                if replay.priorities is not None:  # rdqn's TD errors [B, T] set the new priorities
                    replay.update_priorities(metrics["td_error"], metrics["mask"])
                counters.update_budget -= 1.0
                counters.updates += 1
                log_.add(metrics)
                if counters.updates % t.log_every_updates == 0:
                    log_.write(writer, counters.env_steps)
            source.after_updates(counters)
            if first_update_s is not None:  # logged after the updates, not inside one
                writer.scalars(counters.env_steps, {"perf/first_update_s": first_update_s})
                first_update_s = None
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
                    **source.scalars(),
                },
            )
            evals.append(_evaluate(run, recent, started))
            bar.set_postfix(
                ret=f"{np.mean(recent) if recent else float('nan'):.1f}",
                eval=f"{evals[-1]['eval_return_mean']:.1f}",
                refresh=False,
            )
            writer.flush()
            perf_mark = [time.perf_counter(), counters.env_steps, counters.updates]
        if counters.env_steps >= next_ckpt or counters.env_steps >= t.total_env_steps or stop.requested:
            next_ckpt += t.checkpoint_every_env_steps
            if log_ and (counters.env_steps >= t.total_env_steps or stop.requested):
                log_.write(writer, counters.env_steps)  # the last updates' partial window
            counters.wall_time_s = time.perf_counter() - started
            writer.flush()  # events up to this step are on disk before the checkpoint claims them
            began = time.perf_counter()
            save_run_state(run.ckpt, run.counters, run.replay, run.policy, run.learner, run.normalizer)
            took = time.perf_counter() - began
            perf_mark[0] += took
            writer.scalars(counters.env_steps, {"perf/checkpoint_s": took})
            saved_at = counters.env_steps
        if stop.requested:
            break
    bar.close()
    counters.wall_time_s = time.perf_counter() - started
    status = "finished" if counters.env_steps >= t.total_env_steps else f"stopped by {stop.requested}"
    summary = {**_summary(config, counters, evals, status, run.kernels), **source.summary()}
    writer.final_metrics(counters.env_steps, summary)
    writer.summary(summary)
    if stop.requested:
        log.info(
            "stopped by %s at env step %d; checkpoint written at env step %d; resume with: "
            "python -m scripts.train resume=%s",
            stop.requested,
            counters.env_steps,
            saved_at,
            config.run_dir,
        )
    return summary


def _stop_nonfinite(run: _Run, evals: list[dict], started: float, what: str) -> None:
    """Stop the run on NaN/Inf without checkpointing (the update may already have changed weights)."""
    counters = run.counters
    counters.wall_time_s = time.perf_counter() - started
    last = run.ckpt.latest()
    kept = "no checkpoint was written" if last is None else f"its last checkpoint (env step {last}) is kept"
    message = f"{what} at env step {counters.env_steps}; the run stopped without saving, {kept}"
    run.writer.summary(_summary(run.config, counters, evals, f"stopped: {message}", run.kernels))
    raise NonFiniteError(message)


def _evaluate(run: _Run, recent: deque, started: float) -> dict:
    config, counters, policy = run.config, run.counters, run.policy
    seed = EVAL_SEED_OFFSET + config.seed * 100_003 + counters.evaluations * config.eval.episodes
    if config.eval.network != "online":  # greedy episodes with the target's or the average's weights
        policy = with_weights_of(policy, run.learner, config.eval.network)
    returns = evaluate(run.eval_env, policy, seed=seed)
    counters.evaluations += 1
    success_return = config.env.success_return
    row = {
        "env_steps": counters.env_steps,
        "updates": counters.updates,
        "wall_time_s": round(time.perf_counter() - started, 3),
        "eval_return_mean": float(np.mean(returns)),
        "eval_return_std": float(np.std(returns)),
        "train_return_mean": float(np.mean(recent)) if recent else float("nan"),
    }
    scalars = {"eval/return_mean": row["eval_return_mean"], "eval/return_std": row["eval_return_std"]}
    if success_return is not None:  # progress.csv reads nan where it is not set
        row["eval_success_rate"] = scalars["eval/success_rate"] = float(np.mean(returns >= success_return))
    run.writer.progress(row)
    run.writer.scalars(counters.env_steps, scalars)
    return row


def _summary(
    config: Config,
    counters: Counters,
    evals: list[dict],
    status: str,
    choice: kernels.KernelChoice | None = None,
) -> dict:
    means = [e["eval_return_mean"] for e in evals]
    wall = max(counters.wall_time_s, 1e-9)
    return {
        "agent": config.agent.kind,
        "preset": config.agent.name,
        "env": config.env.id,
        "cell": config.network.cell,
        "seed": config.seed,
        "status": status,
        "kernels": choice.as_dict() if choice else None,
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
