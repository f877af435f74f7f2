"""Export a trained policy: ``python -m scripts.export run=DIR [format=saved_model] [step=N]
[network=run|online|target|average] [out=PATH]``.

Writes ``DIR/export/<format>-<step>`` (``-<network>`` appended unless ``network=run``), or ``out``,
which must not exist yet (the export appears there whole or not at all). With
``format=saved_model`` a SavedModel with the signatures ``initial_state(batch_size)`` and
``step(observation, state) -> (action, q_values or action_mean, state)`` that plain TensorFlow loads
without recurrl; with ``format=keras`` a ``.keras`` file of stock Keras layers that
``keras.saving.load_model`` reads (agents/export.py documents the tensors of both).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from scripts.tf_logs import quiet_tensorflow  # noqa: E402

quiet_tensorflow()  # TF's start-up lines off the console (RECURRL_TF_LOGS=1 keeps them)

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from envs.config import ConfigError  # noqa: E402
from scripts.evaluate import check_run_arg, network_suffix  # noqa: E402

log = logging.getLogger("recurrl")
FORMATS = ("saved_model", "keras")


@dataclass
class ExportConfig:
    """What to export and where."""

    # The run directory (what scripts.train wrote).
    run: str = "???"
    # saved_model: a TensorFlow SavedModel with flat-tensor signatures; keras: a .keras file of
    # stock Keras layers (LSTM/GRU cores only).
    format: str = "saved_model"
    # Checkpoint env step; null = the newest that loads completely.
    step: int | None = None
    # Weights to export: run (those the run's evaluations used, its eval.network), online, or
    # target (the EMA of the online weights).
    network: str = "run"
    # Output path, which must not exist; null = DIR/export/<format>-<step>[-<network>].
    out: str | None = None


def run_export(cfg: ExportConfig) -> Path:
    """Export as configured; returns the written path."""
    from agents.export import export_keras, export_saved_model, refuse_existing
    from agents.saved_run import check_network, load_run

    if cfg.format not in FORMATS:
        raise ConfigError(f"format={cfg.format!r} is invalid: allowed {'|'.join(FORMATS)}")
    check_network(cfg.network)
    if cfg.out:  # before the run is loaded
        refuse_existing(cfg.out)
    saved = load_run(cfg.run, cfg.step, backend="graph")  # TF ops only: no native op in the export
    name = f"{cfg.format}-{saved.step}{network_suffix(cfg.network)}"
    out = Path(cfg.out) if cfg.out else Path(cfg.run) / "export" / name
    if cfg.format == "keras":
        return export_keras(saved, out, cfg.network)
    return export_saved_model(saved, out, cfg.network)


@hydra.main(version_base="1.3", config_path="../conf", config_name="export")
def main(cfg: DictConfig) -> None:
    """Hydra entry point."""
    config = ExportConfig(**OmegaConf.to_container(cfg, resolve=True))
    try:
        out = run_export(config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    log.info("exported %s (network=%s) to %s", config.run, config.network, out)


if __name__ == "__main__":
    check_run_arg(sys.argv[1:])
    main()
