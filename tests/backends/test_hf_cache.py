"""The hf backend's key/value reuse between calls (prefix_cache.py), on real
tiny models on CPU: the same greedy replies as without it, and the prompt
tokens it did not compute again."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from agent_r.llm import GenerationRequest, HFBackend, SamplingConfig
from agent_r.llm.prefix_cache import PrefixCache

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=12)


def play(backend: HFBackend, turns: int = 4) -> list[str]:
    """Episodes as the driver plays them: each turn is the previous prompt +
    the reply + an observation; episodes of different lengths share a batch,
    and one episode joins late (nothing cached for it)."""
    convs = [[{"role": "system", "content": "You are a helpful assistant."},
              {"role": "user", "content": f"Goal: craft {i} sticks." * (1 + i % 3)}] for i in range(5)]
    replies = []
    for turn in range(turns):
        live = convs[:4] if turn < 2 else convs
        for c, out in zip(live, backend.generate([GenerationRequest(c) for c in live], GREEDY)):
            c += [{"role": "assistant", "content": out[0]},
                  {"role": "user", "content": f"Observation {turn}: got 1 oak log." * (1 + turn % 2)}]
            replies.append(out[0])
    return replies


def test_reuse_gives_the_same_greedy_replies_and_skips_most_prompt_tokens(tiny_model_dir):
    without = HFBackend(tiny_model_dir, device="cpu", cache_gib=0)
    assert without.prefix_cache is None
    reusing = HFBackend(tiny_model_dir, device="cpu")
    assert play(reusing) == play(without)
    cache = reusing.prefix_cache
    assert cache.reused_tokens > cache.prompt_tokens / 2
    assert reusing.describe()["cache_gib"] == 4


def test_reuse_holds_across_batch_chunks(tiny_model_dir):
    """Chunks of 2 regroup the rows every call, so each chunk mixes
    different cached lengths and paddings."""
    chunked = HFBackend(tiny_model_dir, device="cpu", batch_size=2)
    assert play(chunked) == play(HFBackend(tiny_model_dir, device="cpu", batch_size=2, cache_gib=0))
    assert chunked.prefix_cache.reused_tokens > 0


def test_a_sliding_window_model_turns_reuse_off_and_keeps_its_replies(tiny_model_dir, tmp_path, caplog):
    """A cache whose columns are not one per token (here Mistral's sliding
    window) is never reused: the first call finds out and stops keeping."""
    path = tmp_path / "mistral"
    shutil.copytree(tiny_model_dir, path)
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=8)
    (path / "config.json").write_text(json.dumps(cfg))
    sliding = HFBackend(str(path), device="cpu")
    with caplog.at_level("INFO", logger="agent_r.llm.hf_backend"):
        replies = play(sliding)
    assert sliding.prefix_cache is None
    assert "not a plain full-attention one" in caplog.text
    assert replies == play(HFBackend(str(path), device="cpu", cache_gib=0))


def kv(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One layer of keys/values for n tokens: 1 head of dim 2, fp32 (16 bytes a token)."""
    return [(torch.zeros(1, n, 2), torch.zeros(1, n, 2))]


def ids(*tokens: int) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int64)


def test_lookup_finds_the_longest_shared_prefix_and_always_leaves_a_token_to_compute():
    cache = PrefixCache(budget_bytes=1 << 20)
    cache.add(ids(1, 2, 3), kv(3))
    cache.add(ids(1, 2, 7, 8), kv(4))
    assert cache.longest(ids(1, 2, 7, 9))[1] == 3
    assert cache.longest(ids(1, 2, 3, 4, 5))[1] == 3
    assert cache.longest(ids(1, 2, 3))[1] == 2      # the whole prompt cached: its last token is still computed
    assert cache.longest(ids(5, 1, 2)) == (None, 0)


def test_an_entry_that_a_newer_one_extends_is_dropped_and_the_budget_evicts_the_oldest():
    cache = PrefixCache(budget_bytes=16 * 10)       # 10 tokens
    cache.add(ids(1, 2), kv(2))
    cache.add(ids(1, 2, 3, 4), kv(4))               # extends the first: it goes
    assert [list(e.tokens) for e in cache.entries.values()] == [[1, 2, 3, 4]]
    cache.add(ids(5, 6, 7, 8), kv(4))
    cache.longest(ids(1, 2, 3, 4, 9))               # a hit makes [1..4] the most recent
    cache.add(ids(9, 9, 9), kv(3))                  # 11 tokens > 10: the least recent ([5..8]) goes
    assert [list(e.tokens) for e in cache.entries.values()] == [[1, 2, 3, 4], [9, 9, 9]]
    assert cache.nbytes == 16 * 7
    cache.add(ids(*range(20, 31)), kv(11))          # larger than the whole budget: not kept
    assert cache.nbytes == 16 * 7


@pytest.mark.parametrize("gib", [0, 0.5])
def test_the_setting_reaches_the_backend(tiny_model_dir, gib):
    from agent_r.knobs import BackendSettings
    from agent_r.llm.factory import make_backend

    backend = make_backend(BackendSettings(backend="hf", model_dir=tiny_model_dir, hf_cache_gib=gib))
    assert backend.describe()["cache_gib"] == gib
