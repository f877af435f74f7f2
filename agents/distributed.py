"""Acting on Ray (``runner=ray``): worker processes step their own envs and send the learner blocks
of replay rows; the learner sends them its weights.

    worker i (Ray actor, envs_per_actor = E envs, the agent's acting policy in numpy)
        -- block: rows_per_block = K rows [K, E, ...] per field, finished episodes, the obs -->
    RaySource (learner process): writes worker i's rows into replay columns [i*E, (i+1)*E)
        -- ray.put(weights of the online network, incl. observation statistics) every
           runner.weight_sync_every learner updates --> workers

Lock-step rounds: :class:`agents.replay.SequenceReplay` keeps one write cursor for all env columns,
so the learner writes round r (K rows in every column) only once every worker's block r has
arrived. Each worker has one block outstanding (being stepped, or done and waiting): its next
call goes out as soon as the learner takes its block, so workers step the next round while the
learner updates. What this costs: the slowest worker sets the pace. A round waits for its
block, and a faster worker idles once its next block is ready; one stalled worker stalls training.

Restarts: workers are Ray actors created with ``max_restarts`` (``runner.max_restarts``). A call
to a dead or restarting worker raises ``RayActorError``; the source sends the call again (every
``RETRY_WAIT_S`` while Ray restarts the worker) with the current weights, and gives up with an error
once a worker died more than ``max_restarts`` times. The first block a worker sends after (re)starting is
marked ``fresh``; when it comes from a worker that had delivered before, that worker's columns end
their open episodes (``SequenceReplay.end_episodes``) before the block is written, so no n-step
target reaches across the restart. Each restart logs one warning and counts in the summary.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections import deque
from typing import Any

import numpy as np
import ray

from agents.acting import Acted
from agents.actor import Actor
from agents.agent import lookup
from agents.rdqn import epsilon_ladder
from agents.run_state import Counters
from envs import make_vec_env

log = logging.getLogger("recurrl")

WORKER_SEED_STRIDE = 10_007  # worker i's policy (exploration RNG) draws from seed + this * (i + 1)
RETRY_WAIT_S = 0.2  # pause before calling a restarting worker again


class RowSink:
    """Stands in for replay in a worker's :class:`Actor`: keeps the rows of one block.

    ``data`` has the same keys as the learner's replay (the Actor checks ``"prev_action" in data``).
    """

    def __init__(self, keys: list[str]) -> None:
        self.data: dict[str, list] = {k: [] for k in keys}

    def add(self, **row: np.ndarray) -> None:
        """One row ``[E, ...]`` per field; copied, since the Actor updates some arrays in place."""
        if row.keys() != self.data.keys():
            raise KeyError(f"replay row needs {sorted(self.data)}, got {sorted(row)}")
        for key, value in row.items():
            self.data[key].append(np.array(value))

    def take(self) -> dict[str, np.ndarray]:
        """The rows added since the last call, ``[K, E, ...]`` per field."""
        out = {k: np.stack(v) for k, v in self.data.items()}
        for v in self.data.values():
            v.clear()
        return out


def _stack(items: list) -> Any:
    """``K`` observations ``[E, ...]`` (arrays, or dicts of arrays) -> ``[K, E, ...]``."""
    if isinstance(items[0], dict):
        return {k: np.stack([x[k] for x in items]) for k in items[0]}
    return np.stack(items)


def _flat(x: Any) -> Any:
    """``[K, N, ...]`` (arrays, or dicts of arrays) -> ``[K * N, ...]``."""
    if isinstance(x, dict):
        return {k: _flat(v) for k, v in x.items()}
    return x.reshape(-1, *x.shape[2:])


def _columns(blocks: list, key: str) -> Any:
    """Blocks' ``[K, E, ...]`` values side by side: ``[K, N * E, ...]`` (arrays or dicts of arrays)."""
    if isinstance(blocks[0][key], dict):
        return {k: np.concatenate([b[key][k] for b in blocks], axis=1) for k in blocks[0][key]}
    return np.concatenate([b[key] for b in blocks], axis=1)


def write_round(replay, rows: list[dict[str, np.ndarray]]) -> int:
    """Write one round: worker i's rows ``[K, E, ...]`` fill columns ``[i*E, (i+1)*E)`` of ``K``
    replay rows. Returns the rows written, summed over columns (``K * N * E``)."""
    joined = {k: np.concatenate([r[k] for r in rows], axis=1) for k in rows[0]}  # [K, N*E, ...]
    k_rows = len(next(iter(joined.values())))
    for k in range(k_rows):
        replay.add(**{key: value[k] for key, value in joined.items()})
    return k_rows * replay.num_envs


class ActingWorker:
    """A Ray actor: ``runner.envs_per_actor`` envs stepped by the agent's acting policy.

    Worker ``index`` seeds its envs ``env_seed + index * E + j`` and first resets them with
    ``reset_seed + index * E + j``, as the local runner seeds column ``index * E + j``.
    """

    def __init__(self, config, spec, index: int, keys: list[str], env_seed: int, reset_seed: int) -> None:
        import tensorflow as tf

        try:  # acting runs on numpy; the learner built here only lends its network
            tf.config.threading.set_intra_op_parallelism_threads(1)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:  # TF already started in this process (a worker built in-process)
            pass
        r, e = config.runner, config.runner.envs_per_actor
        self.total_envs, self.rows = r.num_actors * e, r.rows_per_block
        own = dataclasses.replace(config, seed=config.seed + WORKER_SEED_STRIDE * (index + 1))
        # The schedules read this: the global env steps of the last broadcast, advanced locally.
        self.counters = Counters()
        _, self.policy = lookup(config.agent.kind).build(own, spec, self.counters)
        if getattr(config.agent, "epsilon_ladder", False):  # this worker's slice of the whole ladder
            ladder = epsilon_ladder(self.total_envs)[index * e : (index + 1) * e]
            self.policy.epsilon = lambda: ladder
        env = make_vec_env(config.env, seed=env_seed + index * e, num_envs=e)
        self.sink = RowSink(keys)
        self.actor = Actor(env, self.policy, self.sink, seed=reset_seed + index * e)
        self.version, self.fresh = -1, True

    def collect(self, update: dict | None) -> dict:
        """Apply ``update`` (weights, their version, global env steps) if given, then step ``K``
        times; returns the block: ``rows`` ``[K, E, ...]`` per field, ``obs`` ``[K, E, ...]`` (the
        observations after each step), finished episodes (with ``ends``: the round's env steps,
        over all workers, at which each ended) and the weights version acted with."""
        if update is not None:
            self.policy.net.network.set_weights(update["weights"])
            self.policy.net.sync()
            # The learner's count when it sent the weights: this worker has stepped one more block
            # since, so its own count can be ahead (epsilon must not step back).
            self.version = update["version"]
            self.counters.env_steps = max(self.counters.env_steps, int(update["env_steps"]))
        start = time.perf_counter()
        obs, returns, lengths, ends, heads = [], [], [], [], []
        bandit = getattr(self.policy, "bandit", None) is not None
        for k in range(self.rows):
            stats = self.actor.step(explore=True)
            self.counters.env_steps += self.total_envs  # the other workers step alongside
            obs.append(self.actor.obs)
            returns += stats.returns
            lengths += stats.lengths
            ends += [(k + 1) * self.total_envs] * len(stats.returns)
            if bandit:  # the head each finished episode acted with (chosen again at the next step)
                heads += [int(self.policy.arms[i]) for i in stats.envs]
        block = {"rows": self.sink.take(), "obs": _stack(obs), "returns": returns, "lengths": lengths}
        block["heads"] = heads
        block.update(ends=ends, version=self.version, fresh=self.fresh, seconds=time.perf_counter() - start)
        self.fresh = False
        return block


def start_ray(runner) -> bool:
    """Join ``runner.address`` or start a local Ray; False if Ray was already running here."""
    if ray.is_initialized():
        return False
    # Workers of this job: one BLAS thread each (their matmuls are small), and TF's start-up lines
    # kept off the console as scripts.train keeps them (the hook runs before a worker imports TF).
    job_env = {
        "env_vars": {"OPENBLAS_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"},
        "worker_process_setup_hook": "scripts.tf_logs.quiet_tensorflow",
    }
    if runner.address:
        ray.init(address=runner.address, runtime_env=job_env, logging_level=logging.WARNING)
    else:  # 0: the machine's cores, or enough for every worker's reservation if that is more
        cpus = runner.num_cpus or max(os.cpu_count() or 1, math.ceil(runner.num_actors * runner.actor_cpus))
        ray.init(num_cpus=cpus, runtime_env=job_env, include_dashboard=False, logging_level=logging.WARNING)
    return True


class RaySource:
    """The learner's side of ``runner=ray``: workers, weight broadcasts, lock-step replay writes."""

    def __init__(self, config, spec, policy, replay, counters: Counters, env_seed: int, reset_seed: int):
        r = config.runner
        self.started_ray = start_ray(r)
        self.n, self.e, self.every = r.num_actors, r.envs_per_actor, r.weight_sync_every
        self.limit = r.max_restarts
        self.num_envs, self.policy, self.replay = self.n * self.e, policy, replay
        remote = ray.remote(ActingWorker).options(
            num_cpus=r.actor_cpus, max_restarts=r.max_restarts, max_task_retries=0
        )
        free, need = ray.available_resources().get("CPU", 0.0), r.num_actors * r.actor_cpus
        if need > free:
            log.warning(
                "Ray has %g CPUs free, the workers reserve %g: some wait until CPUs free up", free, need
            )
        keys = list(replay.data)
        self.workers = [remote.remote(config, spec, i, keys, env_seed, reset_seed) for i in range(self.n)]
        self.pending: list[Any] = [None] * self.n  # the call in flight per worker
        self.ready: list[deque] = [deque() for _ in range(self.n)]  # blocks arrived, not yet written
        self.sent = [-1] * self.n  # weights version each worker holds
        self.delivered, self.failures, self.restarts = [False] * self.n, [0] * self.n, 0
        self.rates, self.lags, self.depths = [], [], []
        self.counters = counters
        self._broadcast(counters)
        for i in range(self.n):
            self._submit(i)
        log.info(
            "runner=ray: %d workers x %d envs = %d replay env columns (env.num_envs=%d is not used "
            "for training envs), blocks of %d rows",
            self.n, self.e, self.num_envs, config.env.num_envs, r.rows_per_block,
        )  # fmt: skip

    def _broadcast(self, counters: Counters) -> None:
        self.version = counters.updates
        weights = self.policy.net.network.get_weights()  # incl. the observation statistics
        self.weights = ray.put({"version": self.version, "env_steps": counters.env_steps, "weights": weights})

    def _submit(self, i: int) -> None:
        update = self.weights if self.sent[i] != self.version else None
        self.sent[i] = self.version
        self.pending[i] = self.workers[i].collect.remote(update)

    def _wait(self) -> None:
        """Wait for at least one call; keep each worker with one call in flight while none waits."""
        done, _ = ray.wait([p for p in self.pending if p is not None], num_returns=1)
        for ref in done:
            i = self.pending.index(ref)
            self.pending[i] = None
            try:
                self.ready[i].append(ray.get(ref))
            except ray.exceptions.ActorUnavailableError:  # restarting: ask again a little later
                self.sent[i] = -1
                time.sleep(RETRY_WAIT_S)
            except ray.exceptions.RayActorError as exc:
                self._died(i, exc)
            if not self.ready[i]:
                self._submit(i)

    def _died(self, i: int, exc: Exception) -> None:
        self.failures[i] += 1
        if 0 <= self.limit < self.failures[i]:
            raise RuntimeError(
                f"acting worker {i} died {self.failures[i]} times, more than runner.max_restarts="
                f"{self.limit}: {str(exc).strip().splitlines()[0]}"
            )
        self.sent[i] = -1  # the restarted worker gets the current weights with its next call

    def collect(self) -> Acted:
        """Write the next round (``rows_per_block`` rows in every column) once all its blocks are in."""
        # Workers whose block was done before the learner asked for it (0: the learner waits for
        # the workers; num_actors: they wait for the learner).
        refs = [p for p in self.pending if p is not None]
        done = ray.wait(refs, num_returns=len(refs), timeout=0)[0] if refs else []
        self.depths.append(len(done) + sum(1 for q in self.ready if q))
        while not all(self.ready):
            self._wait()
        blocks = [q.popleft() for q in self.ready]
        for i, block in enumerate(blocks):
            if self.pending[i] is None:
                self._submit(i)
            if block["fresh"] and self.delivered[i]:
                self._restarted(i)
            self.delivered[i] = True
            self.rates.append(len(block["rows"]["reward"]) * self.e / max(block["seconds"], 1e-9))
            self.lags.append(self.counters.updates - block["version"])
        written = write_round(self.replay, [b["rows"] for b in blocks])
        bandit = getattr(self.policy, "bandit", None)
        if bandit is not None:  # each worker picks its own heads; greedy acting here uses all of them
            for b in blocks:
                bandit.record(np.asarray(b["heads"], np.int64), np.asarray(b["returns"]))
        reward = _flat(np.concatenate([b["rows"]["reward"] for b in blocks], axis=1))
        # The round's episodes in the order they ended, each at the round's step it ended at.
        ended = sorted(
            (x for b in blocks for x in zip(b["ends"], b["returns"], b["lengths"], strict=True)),
            key=lambda x: x[0],
        )
        returns, lengths, ends = [x[1] for x in ended], [x[2] for x in ended], [x[0] for x in ended]
        return Acted(written, _flat(_columns(blocks, "obs")), reward, returns, lengths, ends)

    def _restarted(self, i: int) -> None:
        self.restarts += 1
        cols = slice(i * self.e, (i + 1) * self.e)
        log.warning(
            "acting worker %d was restarted (its process died); replay columns [%d, %d) end their "
            "open episodes, restart %d of this run",
            i, cols.start, cols.stop, self.restarts,
        )  # fmt: skip
        self.replay.end_episodes(cols)

    def after_updates(self, counters: Counters) -> None:
        """Broadcast the weights once ``runner.weight_sync_every`` updates passed since the last."""
        if counters.updates - self.version >= self.every:
            self._broadcast(counters)

    def scalars(self) -> dict[str, float]:
        """Acting rate (sum over workers of their own stepping rate), blocks waiting, policy lag."""
        if not self.rates:
            return {}
        out = {
            "perf/actor_env_steps_per_s": float(np.mean(self.rates)) * self.n,
            "perf/queue_depth": float(np.mean(self.depths)),
            "perf/policy_lag": float(np.mean(self.lags)),
        }
        log.info("acting: %s", ", ".join(f"{k[5:]} {v:.1f}" for k, v in out.items()))
        self.rates, self.lags, self.depths = [], [], []
        return out

    def summary(self) -> dict[str, Any]:
        return {"actor_restarts": self.restarts}

    def close(self) -> None:
        """Stop the workers; shut Ray down if this source started it."""
        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        if self.started_ray:
            ray.shutdown()
