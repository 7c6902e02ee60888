"""Which tasks a shard takes (agent_r/sharding.py, ShardSettings): shard i of
N takes a fixed, disjoint share of the run's tasks in order of position, the
defaults come from a SLURM array, bad pairs are one-line errors, and each
shard owns its manifest's name, so nothing needs coordinating (docs/cluster.md)."""
from __future__ import annotations

import pytest

from agent_r.knobs import ShardSettings
from agent_r.settings import UsageError, parse
from agent_r.sharding import manifest_name, shard_items


def shard(index=None, count=None, **slurm) -> ShardSettings:
    argv = ([] if index is None else ["--shard_index", str(index)]) + ([] if count is None else
                                                                        ["--num_shards", str(count)])
    return parse(ShardSettings, argv, environ={k.upper(): str(v) for k, v in slurm.items()})


def test_shards_partition_the_run_in_order_of_position():
    items = [3, 1, 4, 15, 9, 2, 6, 5, 35, 8]
    shares = [shard_items(items, shard(i, 3)) for i in range(3)]
    assert shares == [[3, 15, 6, 8], [1, 9, 5], [4, 2, 35]]
    assert sorted(x for s in shares for x in s) == sorted(items)
    assert shard_items(items, shard()) == items and shard_items(items, None) == items
    assert shard_items([1, 2], shard(4, 5)) == []          # more shards than tasks: some get none
    assert shard_items(items, ShardSettings(shard_index=1, num_shards=3)) == shares[1]  # built in code


def test_shard_defaults_come_from_a_slurm_array():
    assert (shard().shard_index, shard().num_shards) == (0, 1)
    s = shard(slurm_array_task_id=7, slurm_array_task_min=4, slurm_array_task_count=4)   # --array=4-7
    assert (s.shard_index, s.num_shards) == (3, 4)
    s = shard(1, 2, slurm_array_task_id=3, slurm_array_task_count=4)                     # flags win
    assert (s.shard_index, s.num_shards) == (1, 2)
    assert shard(slurm_array_task_id=3).num_shards == 1      # not an array: no count, no sharding
    env = parse(ShardSettings, [], environ={"SHARD_INDEX": "2", "NUM_SHARDS": "5"})
    assert (env.shard_index, env.num_shards) == (2, 5)


def test_bad_shard_settings_are_one_line_errors():
    with pytest.raises(UsageError, match="not below --num_shards=3"):
        shard(3, 3)
    with pytest.raises(UsageError, match=r"consecutive array ids \(--array=0-2"):   # ids 0, 2, 4 of count 3
        shard(slurm_array_task_id=4, slurm_array_task_count=3)
    with pytest.raises(UsageError, match="consecutive array ids"):    # the same array's id 2 is refused too
        shard(slurm_array_task_id=2, slurm_array_task_count=3, slurm_array_task_step=2)
    with pytest.raises(UsageError, match="too small"):
        shard(0, 0)


def test_each_shard_owns_its_manifest_name():
    assert manifest_name(shard()) == "manifest.json" == manifest_name(None)
    names = {manifest_name(shard(i, 3)) for i in range(3)}
    assert names == {"manifest.shard-0-of-3.json", "manifest.shard-1-of-3.json", "manifest.shard-2-of-3.json"}
