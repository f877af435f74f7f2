"""Acting throughput of ``runner=ray`` against the number of workers.

    python -m scripts.measure_scaling --actors 1 2 4 8 --window-s 20 --output bench/scaling.json

(or ``python -m scripts.benchmark bench.scaling.enabled=true``, which runs it with the other rows).

For each env preset and worker count ``N`` the run config (``conf/config.yaml`` plus the preset's
overrides, ``runner=ray``) builds the learner's side of a run without the learner updating: a
:class:`agents.distributed.RaySource` fills a replay round after round. After ``warmup_s`` seconds
of rounds (workers started and stepping), the rate is the rows written to replay per second over
a wall window of ``window_s`` seconds. Each rate stands next to ``N`` times the 1-worker rate
(``ratio_to_linear``; below 1 means adding workers bought less than their share).

Presets: ``slow_cartpole`` steps ``recurrl/SlowCartPole-v0`` (each step sleeps 5 ms, as a remote
simulator would: workers overlap their waits) and ``cartpole`` plain CartPole-v1 (CPU-bound: the
machine's cores cap it). Local Ray gets one logical CPU per worker of the largest count, so every
worker is placed however few cores there are.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

PRESETS: dict[str, list[str]] = {
    "slow_cartpole": ["env=cartpole", "env.id=recurrl/SlowCartPole-v0", "+env.kwargs.step_ms=5"],
    "cartpole": ["env=cartpole"],
}
Compose = Callable[[list[str]], object]


@dataclass
class ScalingBench:
    """``bench.scaling``: runner=ray acting env steps/s against worker counts (off by default)."""

    enabled: bool = False
    # Worker counts; the ratio to linear scales the first count's per-worker rate.
    actors: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    # name -> overrides of conf/config.yaml giving the env.
    presets: dict[str, list[str]] = field(default_factory=lambda: {k: list(v) for k, v in PRESETS.items()})
    # Timed wall window per row, after warmup_s seconds of rounds.
    window_s: float = 20.0
    warmup_s: float = 5.0


def rows_per_s(config, window_s: float, warmup_s: float) -> dict:
    """Rows written per second by ``RaySource`` for ``config`` (learner not updating)."""
    from agents.acting import with_training_envs
    from agents.distributed import RaySource
    from agents.loop import Counters, build_agent
    from agents.replay import SequenceReplay
    from envs import describe_env

    spec = describe_env(config.env)
    counters = Counters()
    learner, policy = build_agent(with_training_envs(config), spec, counters)
    n = with_training_envs(config).env.num_envs
    capacity = n * max(4 * learner.seq_len, 2000)
    replay = SequenceReplay(capacity, n, learner.seq_len, learner.replay_fields(), learner.state_dim)
    source = RaySource(config, spec, policy, replay, counters, env_seed=1, reset_seed=1)
    try:
        source.collect()  # every worker is up and has sent a block
        start = time.perf_counter()
        while time.perf_counter() - start < warmup_s:
            source.collect()
        start, rows = time.perf_counter(), 0
        while time.perf_counter() - start < window_s:
            rows += source.collect().env_steps
        elapsed = time.perf_counter() - start
        return {"rows": rows, "seconds": elapsed, "env_steps_per_s": rows / elapsed, **source.scalars()}
    finally:
        source.close()


def scaling_rows(
    compose: Compose,
    presets: dict[str, list[str]],
    actors: list[int],
    window_s: float,
    warmup_s: float,
    extra: list[str] | None = None,
) -> list[dict]:
    """One row per preset and worker count: env steps/s and its ratio to linear scaling (``N`` times
    the per-worker rate of the first count, normally 1)."""
    import ray

    from agents.acting import RunnerConfig
    from agents.distributed import start_ray

    cpus = max(actors)
    started = start_ray(RunnerConfig(kind="ray", num_cpus=cpus))
    rows = []
    try:
        for name, overrides in presets.items():
            per_worker = None
            for n in actors:
                runner = ["runner=ray", f"runner.num_actors={n}", f"runner.num_cpus={cpus}"]
                config = compose([*overrides, *runner, *(extra or [])])
                row = {"preset": name, "env": config.env.id, "actors": n}
                row.update(rows_per_s(config, window_s, warmup_s))
                if per_worker is None:
                    per_worker = row["env_steps_per_s"] / n
                row["linear_env_steps_per_s"] = per_worker * n
                row["ratio_to_linear"] = row["env_steps_per_s"] / row["linear_env_steps_per_s"]
                row["load_1min"] = os.getloadavg()[0]
                rows.append(row)
                print(format_row(row), flush=True)
    finally:
        if started:
            ray.shutdown()
    return rows


def format_row(row: dict) -> str:
    return (
        f"{row['preset']:>14} actors {row['actors']:>2}: {row['env_steps_per_s']:9.1f} env steps/s, "
        f"linear {row['linear_env_steps_per_s']:9.1f}, ratio {row['ratio_to_linear']:.2f} "
        f"(load {row['load_1min']:.1f})"
    )


def compose_run_config(overrides: list[str]):
    """A typed run Config from ``conf/config.yaml`` plus overrides (outside a Hydra app)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    import scripts.train  # noqa: F401  (registers the run-config schemas)

    with initialize_config_module("conf", version_base="1.3"):
        return OmegaConf.to_object(compose("config", overrides=list(overrides)))


def main(argv: list[str] | None = None) -> None:
    import scripts.train  # noqa: F401  (before TF loads: TF's start-up lines quiet, one BLAS thread)

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    parser.add_argument("--window-s", type=float, default=20.0, help="timed wall window per row")
    parser.add_argument("--warmup-s", type=float, default=5.0, help="rounds before the window")
    parser.add_argument("--output", default="bench/scaling.json")
    args = parser.parse_args(argv)
    if min(args.actors) < 1:
        parser.error(f"--actors {args.actors} is invalid: allowed worker counts >= 1")
    presets = {k: PRESETS[k] for k in args.presets}
    rows = scaling_rows(compose_run_config, presets, args.actors, args.window_s, args.warmup_s)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
