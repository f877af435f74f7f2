"""Evaluate a trained run: ``python -m scripts.evaluate run=DIR [step=N] [episodes=10]
[network=run|online|target|average] [seed=0] [record=FILE] [video=false]``.

Greedy episodes from the run's newest complete checkpoint (or ``step``); prints mean +- std and
writes ``eval-<step>.json`` into the run (``eval-<step>-<network>.json`` for a ``network`` other
than ``run``), or ``record``. ``video=true`` also records
``video_episodes`` episodes of an env that renders ``rgb_array`` into ``DIR/videos/eval-<step>/``
(needs ``pip install -e '.[video]'``).
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from scripts.tf_logs import quiet_tensorflow  # noqa: E402

quiet_tensorflow()  # TF's start-up lines off the console (RECURRL_TF_LOGS=1 keeps them)

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from envs.config import ConfigError  # noqa: E402

log = logging.getLogger("recurrl")


@dataclass
class EvaluateConfig:
    """What to evaluate and how."""

    # The run directory (what scripts.train wrote).
    run: str = "???"
    # Checkpoint env step; null = the newest that loads completely.
    step: int | None = None
    # Greedy episodes, run in parallel (one env each).
    episodes: int = 10
    # Weights to act with: run (those the run's evaluations used, its eval.network), online, or
    # target (the EMA of the online weights).
    network: str = "run"
    # Seed of the evaluation envs (episode i starts from seed + i).
    seed: int = 0
    # The JSON file the record goes to; null = DIR/eval-<step>.json (eval-<step>-<network>.json for a
    # network other than run).
    record: str | None = None
    # Record episodes to DIR/videos/eval-<step>/ (the env must render rgb_array).
    video: bool = False
    # Episodes to record when video=true.
    video_episodes: int = 1


def run_evaluation(cfg: EvaluateConfig) -> dict:
    """Evaluate, write the record (``eval-<step>.json`` unless ``cfg.record`` names the file) and
    the videos; returns the record."""
    from agents.rundir import atomic_write
    from agents.saved_run import check_network, evaluate_run, load_run, record_video

    check_network(cfg.network)
    if cfg.record and not Path(cfg.record).parent.is_dir():
        raise ConfigError(
            f"record={cfg.record!r} is invalid: allowed a file in an existing directory"
            f" ({Path(cfg.record).parent} does not exist)"
        )
    saved = load_run(cfg.run, cfg.step)
    videos = None
    if cfg.video:  # first: an env that cannot render is refused before any record is written
        folder = Path(cfg.run) / "videos" / f"eval-{saved.step}"
        videos = record_video(saved, cfg.network, cfg.seed, cfg.video_episodes, folder)
    record = evaluate_run(saved, cfg.episodes, cfg.network, cfg.seed)
    if videos is not None:
        record["videos"] = videos
    atomic_write(record_path(cfg, saved.step), json.dumps(record, indent=2))
    return record


def record_path(cfg: EvaluateConfig, step: int) -> Path:
    """Where the record of an evaluation at ``step`` goes."""
    name = f"eval-{step}{network_suffix(cfg.network)}.json"
    return Path(cfg.record) if cfg.record else Path(cfg.run) / name


def network_suffix(network: str) -> str:
    """What default output names of ``scripts.evaluate`` and ``scripts.export`` add for a
    ``network=`` choice, so each network's output is kept: ``""`` for ``run``, else ``-<network>``."""
    return "" if network == "run" else f"-{network}"


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
def main(cfg: DictConfig) -> float:
    """Hydra entry point; returns the mean return."""
    config = EvaluateConfig(**OmegaConf.to_container(cfg, resolve=True))
    try:
        record = run_evaluation(config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    success = f", success rate {record['success_rate']:.2f}" if "success_rate" in record else ""
    log.info(
        "%s at env step %d, %s network: return %.2f +- %.2f%s over %d episodes -> %s",
        config.run,
        record["step"],
        record["network"],
        record["return_mean"],
        record["return_std"],
        success,
        record["episodes"],
        record_path(config, record["step"]),
    )
    return record["return_mean"]


def check_run_arg(argv: list[str]) -> None:
    """Exit with one line unless ``argv`` names a run directory (``run=DIR``) that holds a run; run
    before Hydra, which would otherwise create the directory and its log file."""
    runs = [a.split("=", 1)[1] for a in argv if a.startswith("run=")]
    problem = None
    if not runs:
        problem = "run=DIR is required (a directory written by scripts.train)"
    elif not (Path(runs[-1]) / "config.json").is_file():
        problem = f"run={runs[-1]!r} holds no run: {Path(runs[-1]) / 'config.json'} is missing"
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    check_run_arg(sys.argv[1:])
    main()
