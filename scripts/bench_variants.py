"""The options whose cost the compared learner rows of ``scripts.benchmark`` time, and how the
report names them (no TensorFlow import: the report reads this table too)."""

from __future__ import annotations

from typing import NamedTuple


class Variant(NamedTuple):
    """An option whose cost the compared learner rows time on the fast case's batch, same rounds."""

    override: str  # the Hydra override that turns it on
    kinds: tuple[str, ...]  # agent kinds that take it
    ratio_key: str  # the row's key for its rate over the fast case's
    label: str  # what the report calls it
    against: str  # what the report calls the fast case it is compared with


# Clipped double Q adds a second [B, T, A] head and the min of the two target heads; Peng's
# Q(lambda) targets are a backward recursion over the window instead of the n-step sums; the
# average network is one more EMA of the online weights in every update; the target anchor is one
# more squared difference of the online and target Q-values the step already computes.
VARIANTS = {
    "twin_q": Variant(
        "agent.twin_q=true", ("rdqn",), "twin_q_vs_single", "clipped double Q", "the single head"
    ),
    "td_lambda": Variant(
        "agent.td_lambda=0.5",
        ("rdqn", "rddpg"),
        "td_lambda_vs_n_step",
        "Peng's Q(lambda) targets",
        "the n-step targets",
    ),
    "average": Variant(
        "agent.average_tau=0.001",
        ("rdqn", "rddpg"),
        "average_vs_none",
        "an average network",
        "without one",
    ),
    "anchor": Variant(
        "agent.target_anchor=0.3",
        ("rdqn",),
        "anchor_vs_none",
        "the target anchor",
        "without it",
    ),
}
