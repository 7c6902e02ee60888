"""The hf backend (transformers generate) on a real tiny model, on CPU."""
from __future__ import annotations

import gc

import pytest
from transformers import AutoTokenizer

from agent_r.knobs import BackendSettings
from agent_r.llm import CPU_HF_BATCH, GenerationRequest, HFBackend, PromptTooLong, SamplingConfig
from tests.backends.common import GREEDY, crafting_chat, numbered_chat


def test_hf_returns_n_samples_per_conversation(hf):
    """Each request gets its n samples, sampled (not copies), and one
    generate() counts as one call of all its requests and samples."""
    before = hf.stats.as_dict()
    out = hf.generate([GenerationRequest(numbered_chat(i), n=4) for i in range(3)],
                      SamplingConfig(temperature=1.0, max_new_tokens=16))
    assert [len(o) for o in out] == [4, 4, 4]
    assert all(isinstance(t, str) for o in out for t in o)
    assert len({t for o in out for t in o}) > 3  # sampling gives different texts
    after = hf.stats.as_dict()
    assert (after["calls"] - before["calls"], after["requests"] - before["requests"],
            after["samples"] - before["samples"]) == (1, 3, 12)


def test_hf_greedy_is_deterministic_and_batch_independent(tiny_model_dir, hf):
    """Greedy replies are the same twice, alone or in a batch, and in any
    chunking of the batch (left padding does not change them)."""
    batch = [GenerationRequest(numbered_chat(i), n=1) for i in range(7)]
    batched = hf.generate(batch, GREEDY)
    again = hf.generate(batch, GREEDY)
    single = [hf.generate([GenerationRequest(numbered_chat(i), n=1)], GREEDY)[0][0] for i in range(7)]
    assert batched == again
    for i in range(7):
        assert batched[i] == [single[i]]
    assert single[0] != single[1]
    chunked = HFBackend(tiny_model_dir, device="cpu", batch_size=3)  # 7 requests in chunks of 3
    assert chunked.generate(batch, GREEDY) == batched


def test_hf_seeded_sampling_reproducible_per_batch(hf):
    """The same batch of seeded requests samples the same texts again."""
    batch = [GenerationRequest(numbered_chat(i), n=2, seed=100 + i) for i in range(2)]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=16)
    assert hf.generate(batch, sampling) == hf.generate(batch, sampling)


def test_hf_generate_runs_without_cyclic_gc_and_restores_it(hf, monkeypatch):
    """A collection inside generate's decode loop scans the whole run's heap
    (bench/RESULTS.md: a fifth of the GPU's throughput); the collector is
    off for the call and back on after it, also when generate raises."""
    seen, real = [], hf.model.generate

    def recording(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(hf.model, "generate", recording)
    assert gc.isenabled()
    hf.generate([GenerationRequest(numbered_chat(0))], GREEDY)
    assert seen == [False] and gc.isenabled()

    def failing(*args, **kwargs):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(hf.model, "generate", failing)
    with pytest.raises(RuntimeError):
        hf.generate([GenerationRequest(numbered_chat(0))], GREEDY)
    assert gc.isenabled()


def test_hf_batch_size_auto_is_whole_call_on_gpu_16_on_cpu(tiny_model_dir):
    """--hf_batch_size 0 (the default) means 16 sequences per call on CPU."""
    assert HFBackend(tiny_model_dir, device="cpu").batch_size == CPU_HF_BATCH == 16
    assert BackendSettings().hf_batch_size == 0          # the scripts' default is auto


def test_hf_count_tokens_is_real_chat_prompt(tiny_model_dir, hf):
    """count_tokens counts the chat template's tokens with the generation
    prompt, exactly what the tokenizer's own template gives."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    for i in range(3):
        msgs = numbered_chat(i)
        plain = [{"role": m["role"], "content": m["content"]} for m in msgs]
        ids = tok.apply_chat_template(plain, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        assert hf.count_tokens(msgs) == len(ids)
    assert hf.count_tokens(numbered_chat(2)) > hf.count_tokens(numbered_chat(0))


def test_hf_stop_string_cuts_output(hf):
    """A reply ends before the first stop string, which is not returned."""
    full = hf.generate([GenerationRequest(numbered_chat(0))], GREEDY)[0][0]
    assert len(full) > 8
    stop = full[4:7]
    cut = hf.generate([GenerationRequest(numbered_chat(0))], SamplingConfig(0.0, 24, stop=(stop,)))[0][0]
    assert cut == full[:full.index(stop)]
    assert stop not in cut


def test_one_overlong_prompt_fails_alone_on_hf(short_model_dir):
    """A prompt that leaves no room in the model's positions fails alone
    (PromptTooLong in its place); the other requests get their samples."""
    backend = HFBackend(short_model_dir, device="cpu")
    assert backend.context_limit == 256
    out = backend.generate([GenerationRequest(crafting_chat("a"), n=2), GenerationRequest(crafting_chat(filler=300)),
                            GenerationRequest(crafting_chat("c"))], SamplingConfig(temperature=1.0, max_new_tokens=300))
    assert isinstance(out[1], PromptTooLong) and [len(out[0]), len(out[2])] == [2, 1]
    assert backend.stats.samples == 3
