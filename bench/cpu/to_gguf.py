#!/usr/bin/env python3
"""Writes a Llama-architecture Hugging Face model directory (Duet's make-test-model output) as
GGUF for llama.cpp, keeping the weights' dtype (BF16 or F32; norms in F32 as llama.cpp's own
converter stores 1-D tensors).

llama.cpp's convert_hf_to_gguf.py refuses the test models' tokenizer: it identifies the BPE
pre-tokenizer by hashing the encoding of a test string, and the project's small byte-level
tokenizer (512 tokens, 256 merges) matches no known hash. So this does what that converter's
LlamaModel does, for exactly the tensors a Llama checkpoint has:
  - llama.* metadata from config.json, and the Llama 3 RoPE scaling as a rope_freqs tensor
    (the per-frequency factors generate_extra_tensors computes);
  - q_proj/k_proj rows permuted as LlamaModel.permute does (HF's rotate-half layout to
    llama.cpp's interleaved pairs);
  - the tokenizer as a "gpt2" (byte-level BPE) vocabulary with its merges, padded with
    [PAD<i>] unused tokens up to the model's vocab_size, pre-tokenizer "llama-bpe" (the test
    tokenizer's split regex is Llama 3's). The benchmark feeds token ids, so llama.cpp's own
    tokenizer is not on the measured path.
Tied embeddings: no output.weight is written and llama.cpp reuses token_embd.

Usage: to_gguf.py MODEL_DIR OUT.gguf"""
import json
import math
import os
import sys

import numpy as np
import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_model  # noqa: E402

LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GLOBAL_TENSORS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_name(name):
    if name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[name]
    parts = name.split(".", 3)  # model, layers, N, rest
    if parts[:2] == ["model", "layers"] and parts[3] in LAYER_TENSORS:
        return f"blk.{parts[2]}.{LAYER_TENSORS[parts[3]]}"
    raise ValueError(f"unexpected tensor {name}")


def permute(w, n_head, n_head_kv):
    """llama.cpp's LlamaModel.permute: within each head, rows (first half, second half) become
    interleaved pairs. A pure row permutation, so it works on BF16 kept as uint16."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def load(path, t):
    """One tensor as a numpy array over the file (memory-mapped): float32 for F32, uint16 bit
    patterns for BF16, float16 for F16."""
    dtype = {"F32": np.float32, "BF16": np.uint16, "F16": np.float16}[t["dtype"]]
    count = (t["end"] - t["begin"]) // np.dtype(dtype).itemsize
    data = np.memmap(path, dtype=dtype, mode="r", offset=t["begin"], shape=(count,))
    return data.reshape(t["shape"])


def rope_freqs(cfg, head_dim):
    """Llama 3 RoPE scaling as llama.cpp wants it: one factor per rotary frequency."""
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if (rs.get("rope_type") or rs.get("type") or "").lower() != "llama3":
        return None
    base = cfg.get("rope_theta", rs.get("rope_theta", 10000.0))
    factor = rs.get("factor", 8.0)
    low, high = rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old = rs.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for i in range(0, head_dim, 2):
        # float32 frequencies, as the reference converter computes them with torch.
        freq = float(np.float32(1.0) / np.float32(base) ** (np.float32(i) / np.float32(head_dim)))
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def add_vocab(writer, model_dir, cfg):
    with open(os.path.join(model_dir, "tokenizer.json")) as f:
        tok = json.load(f)
    vocab_size = cfg["vocab_size"]
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [gguf.TokenType.UNUSED] * vocab_size
    for token, i in tok["model"]["vocab"].items():
        tokens[i], types[i] = token, gguf.TokenType.NORMAL
    for added in tok["added_tokens"]:
        i = added["id"]
        tokens[i] = added["content"]
        types[i] = gguf.TokenType.CONTROL if added["special"] else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for key, add in (("bos_token_id", writer.add_bos_token_id),
                     ("eos_token_id", writer.add_eos_token_id)):
        value = cfg.get(key)
        if isinstance(value, list):
            value = value[0]
        if value is not None:
            add(value)
    writer.add_add_bos_token(True)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    model_dir, out = sys.argv[1], sys.argv[2]
    cfg = hf_model.config(model_dir)
    if cfg.get("model_type") != "llama":
        sys.exit(f"to_gguf.py: {model_dir} is not a llama model")
    layers, kv_heads, head_dim = hf_model.kv_dims(cfg)
    heads = cfg["num_attention_heads"]
    tensors = hf_model.tensors(model_dir)
    dtypes = {t["dtype"] for _, t in tensors.values() if len(t["shape"]) == 2}
    if len(dtypes) != 1 or not dtypes <= {"F32", "BF16", "F16"}:
        sys.exit(f"to_gguf.py: unsupported weight dtypes {dtypes}")
    dtype = dtypes.pop()

    writer = gguf.GGUFWriter(out, "llama")
    writer.add_name(os.path.basename(os.path.normpath(model_dir)))
    writer.add_block_count(layers)
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_vocab_size(cfg["vocab_size"])
    writer.add_file_type({"F32": gguf.LlamaFileType.ALL_F32, "BF16": gguf.LlamaFileType.MOSTLY_BF16,
                          "F16": gguf.LlamaFileType.MOSTLY_F16}[dtype])
    add_vocab(writer, model_dir, cfg)

    raw_type = {"BF16": gguf.GGMLQuantizationType.BF16}
    for name, (path, t) in tensors.items():
        w = load(path, t)
        if name.endswith("q_proj.weight"):
            w = permute(w, heads, heads)
        elif name.endswith("k_proj.weight"):
            w = permute(w, heads, kv_heads)
        if w.ndim == 1:
            # Norm weights in F32, as llama.cpp's converter writes 1-D tensors (BF16 is the
            # top half of an F32).
            if t["dtype"] == "BF16":
                w = (w.astype(np.uint32) << 16).view(np.float32)
            writer.add_tensor(gguf_name(name), w.astype(np.float32))
        else:
            writer.add_tensor(gguf_name(name), w, raw_shape=w.shape,
                              raw_dtype=raw_type.get(t["dtype"]))
    freqs = rope_freqs(cfg, head_dim)
    if freqs is not None:
        writer.add_tensor("rope_freqs.weight", freqs)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
