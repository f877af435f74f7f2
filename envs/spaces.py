"""Observation spaces as flat lists of leaves, each stored raw in replay and encoded on its own.

A gymnasium observation space is a tree (``Dict`` keys in sorted order, ``Tuple`` items in order)
whose leaves are one of::

    vector          Box of rank 1 (or rank 2 float, flattened)   float32 [D]
    image           Box of rank 3 (HWC or CHW), or rank 2 uint8  stored dtype [H, W, C] or [C, H, W]
    discrete        Discrete(n, start)                           int64 []
    multi_discrete  MultiDiscrete(nvec, start)                   int64 [K]
    multi_binary    MultiBinary(n)                               int8 [n]

Each leaf has a name that is its replay field: ``obs`` when the space is a single leaf, else
``obs.<key>`` / ``obs.<index>`` down the tree (``obs.image``, ``obs.0``). Replay keeps every leaf in
its own dtype (uint8 images stay uint8, discrete values stay integers); the network's encoder turns
each leaf into features (agents/encoder.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from envs.config import ConfigError

KINDS = ("vector", "image", "discrete", "multi_discrete", "multi_binary")


@dataclass(frozen=True)
class Leaf:
    """One observation leaf: its replay field name, where it sits in the tree, how it is encoded."""

    name: str
    path: tuple[Any, ...]  # keys (Dict) and indices (Tuple) from the root
    kind: str  # one of KINDS
    shape: tuple[int, ...]  # per-env shape as stored in replay
    dtype: str  # numpy dtype name as stored in replay
    sizes: tuple[int, ...] = ()  # discrete: (n,); multi_discrete: nvec
    starts: tuple[int, ...] = ()  # discrete / multi_discrete: the lowest value of each entry
    channels_first: bool = False  # image: stored [C, H, W]

    @property
    def width(self) -> int:
        """Features this leaf gives before any torso: one-hot widths, vector size, or pixels."""
        if self.kind in ("discrete", "multi_discrete"):
            return int(sum(self.sizes))
        return int(np.prod(self.shape))

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """``(H, W, C)`` of an image leaf."""
        if len(self.shape) == 2:
            return (*self.shape, 1)
        if self.channels_first:
            c, h, w = self.shape
            return h, w, c
        return self.shape  # type: ignore[return-value]

    @property
    def normalized(self) -> bool:
        """Whether running statistics scale this leaf (vectors per feature, images per channel)."""
        return self.kind in ("vector", "image")


Observation = tuple[Leaf, ...]


def vector_observation(dim: int) -> Observation:
    """The observation of a flat ``Box(dim)`` env: one ``vector`` leaf named ``obs``."""
    return (Leaf("obs", (), "vector", (int(dim),), "float32"),)


def one_line(space: gym.spaces.Space) -> str:
    """``str(space)`` on one line (a Box with per-index bounds prints its arrays over lines)."""
    return " ".join(str(space).split())


def channels_first(shape: tuple[int, int, int]) -> bool:
    """Whether a rank-3 image ``shape`` is ``[C, H, W]`` rather than ``[H, W, C]``.

    A square pair of axes is the picture: ``[7, 7, 20]`` (a one-hot MiniGrid view) is HWC and
    ``[4, 84, 84]`` CHW. Otherwise the channels are the smaller end axis (``[210, 160, 3]`` HWC,
    ``[3, 210, 160]`` CHW).
    """
    if shape[0] == shape[1] != shape[2]:
        return False
    if shape[1] == shape[2] != shape[0]:
        return True
    return shape[0] < shape[2]


def _leaf(name: str, path: tuple, space: gym.spaces.Space) -> Leaf:
    if isinstance(space, gym.spaces.Discrete):
        return Leaf(name, path, "discrete", (), "int64", (int(space.n),), (int(space.start),))
    if isinstance(space, gym.spaces.MultiDiscrete) and space.nvec.ndim == 1:
        nvec, start = space.nvec.astype(int), np.broadcast_to(space.start, space.nvec.shape).astype(int)
        return Leaf(name, path, "multi_discrete", nvec.shape, "int64", tuple(nvec), tuple(start))
    if isinstance(space, gym.spaces.MultiBinary) and np.ndim(space.n) <= 1:
        return Leaf(name, path, "multi_binary", (int(np.prod(space.n)),), "int8")
    if isinstance(space, gym.spaces.Box) and 1 <= len(space.shape) <= 3:
        shape, dtype = tuple(int(s) for s in space.shape), np.dtype(space.dtype)
        image = len(shape) == 3 or (len(shape) == 2 and dtype == np.uint8)
        if image:
            first = len(shape) == 3 and channels_first(shape)
            return Leaf(name, path, "image", shape, dtype.name, channels_first=first)
        return Leaf(name, path, "vector", (int(np.prod(shape)),), "float32")
    where = f"observation leaf {name!r}" if path else "observation space"
    shown = one_line(space)
    shown = shown if "<" not in shown else type(space).__name__  # no function reprs in one line
    hint = f"env.drop_keys=[{path[0]}]" if path and isinstance(path[0], str) else "env.drop_keys=[<key>]"
    raise ConfigError(
        f"{where} is {shown}, which recurrl cannot encode: allowed Box (rank 1-3), Discrete, "
        f"MultiDiscrete, MultiBinary, and Tuple/Dict of them; leave a Dict key out with {hint}"
    )


def observation_leaves(space: gym.spaces.Space) -> Observation:
    """The leaves of ``space`` in encoding order (an image leaf stays an image in replay; the
    network's encoder decides whether a torso or a flat vector reads it).

    Raises :class:`ConfigError` naming the first leaf that cannot be encoded.
    """
    out: list[Leaf] = []

    def walk(s: gym.spaces.Space, path: tuple) -> None:
        if isinstance(s, gym.spaces.Dict):
            for key in sorted(s.spaces):
                walk(s.spaces[key], (*path, key))
        elif isinstance(s, gym.spaces.Tuple):
            for i, sub in enumerate(s.spaces):
                walk(sub, (*path, i))
        else:
            name = ".".join(["obs", *map(str, path)])
            out.append(_leaf(name, path, s))

    walk(space, ())
    if not out:
        raise ConfigError(f"observation space {one_line(space)} has no leaves left to encode")
    return tuple(out)


def split_obs(obs: Any, leaves: Observation) -> dict[str, np.ndarray]:
    """A (batched) observation tree -> ``{leaf name: [E, *shape] array in the stored dtype}``."""
    out = {}
    for leaf in leaves:
        value = obs
        for key in leaf.path:
            value = value[key]
        value = np.asarray(value)
        if leaf.kind in ("vector", "multi_binary"):  # a Box of rank 2 or MultiBinary([m, n]): flat
            value = value.reshape(value.shape[0], -1)
        out[leaf.name] = value.astype(leaf.dtype, copy=False)
    return out


def row_bytes(leaves: Observation) -> int:
    """Bytes one env step's observation takes in replay."""
    return int(sum(np.prod(leaf.shape, dtype=np.int64) * np.dtype(leaf.dtype).itemsize for leaf in leaves))
