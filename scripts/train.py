"""Command-line training: ``python -m scripts.train [group=option] [key=value ...]``.

The only module that knows Hydra: it composes ``conf/``, converts the result to the typed
:class:`agents.config.Config` and calls the plain :func:`agents.loop.train`.
"""

from __future__ import annotations

import errno
import logging
import os
import sys

# The actor's numpy steps are small matmuls that one thread runs as fast as two; a second OpenBLAS
# thread only competes with TF's threads for the cores, which slows acting badly on a loaded
# machine (docs/performance.md, "Acting speed"). TF's own kernels do not use OpenBLAS.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from scripts.tf_logs import quiet_tensorflow  # noqa: E402

# A run's console shows recurrl's lines, not TF's loading chatter (RECURRL_TF_LOGS=1 shows it).
quiet_tensorflow()

import hydra  # noqa: E402
from hydra.core.config_store import ConfigStore  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from agents.acting import RunnerConfig  # noqa: E402
from agents.config import AGENT_CONFIGS, Config, load_run_config  # noqa: E402
from envs.config import ConfigError, EnvConfig  # noqa: E402
from scripts.overrides import check as check_overrides  # noqa: E402

log = logging.getLogger("recurrl")
# Errors writing the run directory that a user fixes outside the run (space, quota, permissions).
WRITE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG)


def register_configs() -> None:
    """Register the structured schemas that ``conf/*.yaml`` extend (typos and types checked)."""
    cs = ConfigStore.instance()
    base = OmegaConf.structured(Config)
    base.agent = "???"  # filled by the agent group; any agent schema may go there
    env = OmegaConf.structured(EnvConfig)
    # env.kwargs is free-form (any gymnasium.make keyword). Hydra closes every dict of the composed
    # config (struct mode), so `env.kwargs='{size: 8}'` would be refused; an explicit flag on the
    # node itself outlives the merges and keeps it open while typos elsewhere still fail.
    for node in (base.env, env):
        OmegaConf.set_struct(node.kwargs, False)
    cs.store(name="base_config", node=base)
    for kind, schema in AGENT_CONFIGS.items():
        cs.store(group="agent", name=f"{kind}_schema", node=schema)
    cs.store(group="env", name="env_schema", node=env)
    cs.store(group="runner", name="runner_schema", node=RunnerConfig)


def to_config(cfg: DictConfig) -> Config:
    """Typed :class:`Config` from a composed Hydra config (run dir from Hydra's output dir)."""
    config = OmegaConf.to_object(cfg)
    assert isinstance(config, Config)
    config.run_dir = HydraConfig.get().runtime.output_dir
    if config.resume:
        overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith("resume=")]
        config = load_run_config(config.resume, overrides)
    return config


register_configs()
if not OmegaConf.has_resolver("resume_or"):
    OmegaConf.register_new_resolver("resume_or", lambda resume, default: resume or default)
if not OmegaConf.has_resolver("clip"):  # a sweep's directory names stay within a file name's 255 bytes
    OmegaConf.register_new_resolver("clip", lambda text, n: str(text)[: int(n)])


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Train once; returns the final evaluation return (Hydra sweepers can optimise it)."""
    from agents.loop import NonFiniteError, train  # TF import (~4 s) once the config is sound

    try:
        config = to_config(cfg)
        summary = train(config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except NonFiniteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(3)
    except OSError as exc:
        if exc.errno not in WRITE_ERRORS:
            raise
        # Checkpoints are written to a temporary name and marked complete last, so the newest
        # complete one is intact; the run continues from it once the disk has room again.
        run_dir = cfg.get("resume") or HydraConfig.get().runtime.output_dir
        where = f" ({exc.filename})" if exc.filename else ""
        print(
            f"error: cannot write the run{where}: {exc.strerror or exc}; its last complete checkpoint "
            f"is kept, continue with: python -m scripts.train resume={run_dir}",
            file=sys.stderr,
        )
        sys.exit(4)
    log.info(
        "%s: %d env steps, %d updates in %.1f s; final eval return %s (best %s); run dir %s",
        summary.get("status", "done"),
        summary["env_steps"],
        summary["updates"],
        summary["wall_time_s"],
        _fmt(summary["final_eval_return_mean"]),
        _fmt(summary["best_eval_return_mean"]),
        config.run_dir,
    )
    return summary["final_eval_return_mean"]


def _fmt(value: float | None) -> str:
    return "none" if value is None else f"{value:.1f}"


def cli(argv: list[str] | None = None) -> None:
    """``python -m scripts.train``: the command line checked in one go, then Hydra's ``main``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    problem = check_overrides(argv)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    sys.argv = [sys.argv[0], *argv]
    main()


if __name__ == "__main__":
    cli()
