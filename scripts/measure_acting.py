"""Acting throughput for ``scripts.benchmark``: the recurrent numpy policy against raw env stepping.

Both are timed in the same interleaved rounds on the same env preset. numpy's bundled OpenBLAS is
pinned (through ctypes) to ``blas_threads`` while the actor runs, and the actor is timed again with
OpenBLAS's own thread count, to show what pinning buys.
"""

from __future__ import annotations

import os

import numpy as np

from agents.loop import Counters, build_agent
from envs import describe_env
from scripts.measure import Compose, load_1min, median, timed


class Blas:
    """Thread count of numpy's bundled OpenBLAS, through ctypes (a no-op if it is not found)."""

    def __init__(self) -> None:
        import ctypes
        import glob

        self.get = self.set = None
        pattern = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "*openblas*.so*")
        for path in glob.glob(pattern):
            lib = ctypes.CDLL(path)
            for suffix in ("64_", "_64_"):
                if hasattr(lib, f"scipy_openblas_set_num_threads{suffix}"):
                    self.get = getattr(lib, f"scipy_openblas_get_num_threads{suffix}")
                    self.set = getattr(lib, f"scipy_openblas_set_num_threads{suffix}")
                    return

    def threads(self) -> int | None:
        return int(self.get()) if self.get else None

    def pin(self, n: int | None) -> None:
        if self.set and n:
            self.set(int(n))


def acting_rows(
    compose: Compose, overrides: list[str], num_envs: list[int], env_steps: int, rounds: int, blas: int
) -> list[dict]:
    """Env steps/s of Actor + EpsilonGreedy (numpy policy, writing replay) next to raw env stepping."""
    from agents.actor import Actor
    from agents.replay import SequenceReplay
    from envs import make_vec_env

    lib = Blas()
    found = lib.threads()
    config = compose(overrides)
    spec = describe_env(config.env)
    counters = Counters(env_steps=10**9)  # epsilon at its final value: the policy's greedy path runs
    learner, policy = build_agent(config, spec, counters)
    rows = []
    for n in num_envs:
        raw_env = make_vec_env(config.env, seed=1, num_envs=n)
        raw_env.reset(seed=1)
        replay = SequenceReplay(
            n * max(4 * learner.seq_len, 1000), n, learner.seq_len, learner.replay_fields(), learner.state_dim
        )
        actor = Actor(make_vec_env(config.env, seed=2, num_envs=n), policy, replay, seed=2)
        calls = max(env_steps // n, 10)
        actions = np.random.default_rng(0).integers(0, spec.num_actions, (calls, n))
        it = iter(range(10**12))

        def raw_step(env=raw_env, actions=actions, calls=calls, it=it) -> None:
            env.step(actions[next(it) % calls])

        cases = {
            "raw": (raw_step, found),
            "actor": (actor.step, blas or found),
            "actor_blas_default": (actor.step, found),
        }
        rates: dict[str, list[float]] = {k: [] for k in cases}
        keys = list(cases)
        for i in range(rounds):  # rotate the order: no case always runs right after another
            for key in keys[i % len(keys) :] + keys[: i % len(keys)]:
                fn, threads = cases[key]
                lib.pin(threads)
                rates[key].append(timed(fn, calls)[0] * n)
        lib.pin(found)
        raw_env.close()
        actor.env.close()
        rows.append(
            {
                "num_envs": n,
                "cell": config.network.cell,
                "units": config.network.units,
                "raw_env_steps_per_s": median(rates["raw"]),
                "actor_env_steps_per_s": median(rates["actor"]),
                "actor_blas_default_env_steps_per_s": median(rates["actor_blas_default"]),
                "blas_threads": blas or found,
                "blas_threads_default": found,
                "pct_of_raw": 100 * median(rates["actor"]) / median(rates["raw"]),
                "load_1min": load_1min(),
            }
        )
    return rows
