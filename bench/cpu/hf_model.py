"""What bench/cpu_generate.sh's helpers need to know about a Hugging Face model directory
(config.json, model.safetensors, tokenizer.json), read without torch: the config, the
safetensors header (tensor names, dtypes, shapes and byte ranges), the prompt's token ids
(`tokenizers` on the model's own tokenizer.json) and Duet's way of printing token ids as text.
The safetensors layout is an 8-byte little-endian header length, that many bytes of JSON, then
the tensor data at the JSON's data_offsets."""
import argparse
import codecs
import json
import os
import struct


def config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


def safetensors_files(model_dir):
    return sorted(os.path.join(model_dir, n) for n in os.listdir(model_dir)
                  if n.endswith(".safetensors"))


def read_header(path):
    """The tensors of one safetensors file: {name: {dtype, shape, begin, end}}, with begin and
    end absolute byte offsets in the file."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    base = 8 + length
    return {name: {"dtype": t["dtype"], "shape": t["shape"],
                   "begin": base + t["data_offsets"][0], "end": base + t["data_offsets"][1]}
            for name, t in header.items()}


def tensors(model_dir):
    """Every tensor of the model: {name: (file, header entry)}."""
    out = {}
    for path in safetensors_files(model_dir):
        for name, t in read_header(path).items():
            out[name] = (path, t)
    return out


def kv_dims(cfg):
    """(layers, kv heads, head_dim) of a Llama-style config."""
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return cfg["num_hidden_layers"], cfg.get("num_key_value_heads", heads), head_dim


def decode_bytes(model_dir):
    """Weight bytes one decode step must read: every tensor except the input embedding table
    (the lookup reads only the row it gathers), plus the output projection, which is that
    same table when the embeddings are tied (then it counts once)."""
    sizes = {name: t["end"] - t["begin"] for name, (_, t) in tensors(model_dir).items()}
    total = sum(sizes.values()) - sizes["model.embed_tokens.weight"]
    if config(model_dir).get("tie_word_embeddings", False):
        total += sizes["model.embed_tokens.weight"]
    return total


def prefill_flops(model_dir, prompt_tokens):
    """Multiply-add FLOPs of a prefill, as bench/cpu_generate.sh counts them: 2 x the
    parameters of the layers' matrices (attention and MLP projections) per prompt token, the
    output projection for the last token only (the one whose logits are sampled), and causal
    attention (QK^T and PV over the n(n+1)/2 query-key pairs, each 2 x head_dim multiply-adds
    per head). Norms, RoPE and softmax are not counted."""
    cfg = config(model_dir)
    layers, _, head_dim = kv_dims(cfg)
    block = 0
    for name, (_, t) in tensors(model_dir).items():
        if name.startswith("model.layers.") and len(t["shape"]) == 2:
            block += t["shape"][0] * t["shape"][1]
    lm_head = cfg["vocab_size"] * cfg["hidden_size"]
    n = prompt_tokens
    attention = 2 * 2 * layers * cfg["num_attention_heads"] * head_dim * n * (n + 1) // 2
    return 2 * block * n + 2 * lm_head + attention


def prompt_ids(model_dir, text):
    """The prompt's token ids as `duet generate --prompt TEXT` encodes them: the tokenizer's
    post-processor adds <|begin_of_text|>."""
    from tokenizers import Tokenizer
    return Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json")).encode(text).ids


class DuetText:
    """Token ids to text the way `duet generate` prints them: each id's bytes (byte-level BPE),
    U+FFFD for an id the tokenizer does not name (the bench models' embedding tables are padded
    past the 519 tokenizer ids), special tokens skipped, ill-formed UTF-8 replaced."""

    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "tokenizer.json")) as f:
            tok = json.load(f)
        # GPT-2's byte-to-unicode map, inverted: the vocabulary's characters back to bytes.
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
            list(range(ord("®"), ord("ÿ") + 1))
        cs = bs[:]
        n = 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        unbyte = {chr(c): b for b, c in zip(bs, cs)}
        self.bytes = {i: bytes(unbyte[ch] for ch in token)
                      for token, i in tok["model"]["vocab"].items()}
        for added in tok["added_tokens"]:
            self.bytes[added["id"]] = b"" if added["special"] else added["content"].encode()

    def known(self, token_id):
        return token_id in self.bytes

    def text(self, ids, final=True):
        raw = b"".join(self.bytes.get(i, "\ufffd".encode()) for i in ids)
        # An incremental decoder holds back an unfinished character when not final.
        return codecs.getincrementaldecoder("utf-8")("replace").decode(raw, final=final)

    def match(self, ids, printed):
        """How many leading ids of `ids` agree with the text Duet printed (their text, with
        an unfinished last character held back, is a prefix of it)."""
        k = 0
        while k < len(ids) and printed.startswith(self.text(ids[:k + 1], final=False)):
            k += 1
        return k


def runner_args(model_flag):
    """The command line both peer runners take (model_flag: --gguf or --model): the parsed
    arguments and the prompt's token ids."""
    ap = argparse.ArgumentParser()
    ap.add_argument(model_flag, required=True)
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--max-tokens", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--logits", help="also save the prefill's last logits here (.npy, float32)")
    args = ap.parse_args()
    with open(args.prompt_ids) as f:
        return args, json.load(f)
