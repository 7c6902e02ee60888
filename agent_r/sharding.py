"""Data-parallel runs with no coordinator: N processes (one per GPU, node or
SLURM array task) each take a fixed share of one run's task list and write
into the same output folder (docs/cluster.md).

Why this needs no coordination:
* Every process computes the same task list from the same settings, and shard
  i of N takes positions i, i+N, i+2N, ... of it. Interleaving (not blocks)
  spreads easy and hard tasks evenly, since task lists are often ordered by
  difficulty (TextCraft's by recipe depth).
* Outputs are one file per task, written atomically, and a task's result
  depends only on (seed, task, model outputs), never on which process ran it
  or next to what: the shards' files are byte for byte those of one run.
* Each shard keeps its own manifest (``manifest.shard-<i>-of-<N>.json``), so
  no two processes ever rewrite one file; the union of their ``items`` is the
  run's. An unsharded run keeps the plain ``manifest.json``.
* Resume is per task file, so a rerun of any shard (or of the whole run
  unsharded, or with a different N) does only what is missing.
"""
from __future__ import annotations

from typing import Sequence, TypeVar

from agent_r.knobs import ShardSettings
from agent_r.paths import MANIFEST

T = TypeVar("T")


def shard_position(shard: ShardSettings | None) -> tuple[int, int]:
    """(index, count) of ``shard``; (0, 1) for an unsharded run."""
    if shard is None:
        return 0, 1
    shard.finish()  # settings built in code have not resolved their defaults yet
    return int(shard.shard_index), int(shard.num_shards)


def shard_items(items: Sequence[T], shard: ShardSettings | None) -> list[T]:
    """This shard's share of ``items`` (the whole run's list, in its order):
    every count-th item from position index. The shares of 0..count-1 are
    disjoint and together are ``items``."""
    index, count = shard_position(shard)
    return list(items[index::count])


def manifest_name(shard: ShardSettings | None, base: str = MANIFEST) -> str:
    """The manifest file this process owns: ``manifest.json`` unsharded,
    ``manifest.shard-<i>-of-<N>.json`` for shard i of N."""
    index, count = shard_position(shard)
    if count == 1:
        return base
    stem, dot, ext = base.rpartition(".")
    return f"{stem}.shard-{index}-of-{count}{dot}{ext}"


def describe(shard: ShardSettings | None, selected: int, total: int) -> str | None:
    """The start-up line of a sharded run (None unsharded)."""
    index, count = shard_position(shard)
    if count == 1:
        return None
    return f"shard {index} of {count} (0-based): {selected} of the run's {total} tasks"
