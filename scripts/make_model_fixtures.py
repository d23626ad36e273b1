#!/usr/bin/env python3
"""Golden outputs of the project's test model from Hugging Face transformers.

Writes tests/fixtures/test_model/hf_golden.json: for a few prompts, the token ids the HF
tokenizer gives (with add_special_tokens, i.e. the BOS token), the logits at every position
of one forward pass, and a 16-token greedy continuation (argmax at each step, no stop token).
The C++ parity tests compare Duet's CPU backend against this file; CI never runs this script.

Needs torch and transformers (PyPI's torch brings gigabytes of CUDA wheels: fine once on a
development machine):
    python3 -m venv /tmp/fx && /tmp/fx/bin/pip install torch transformers
    /tmp/fx/bin/python scripts/make_model_fixtures.py [--duet build/bin/duet]
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers

PROMPTS = [
    "Hello, my name is",
    "The quick brown fox jumps over the lazy dog.",
    "café naïve 日本語 🙂 12345",
    "In a hole in the ground there lived a hobbit. Not a nasty, dirty, wet hole, filled with "
    "the ends of worms and an oozy smell, nor yet a dry, bare, sandy hole.",
]
SEED = 1
GREEDY_TOKENS = 16


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duet", default="build/bin/duet")
    parser.add_argument("--out", default="tests/fixtures/test_model/hf_golden.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as model_dir:
        subprocess.run([args.duet, "make-test-model", "--out", model_dir, "--seed", str(SEED),
                        "--dtype", "F32"], check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(model_dir, "model.safetensors"), "rb") as f:
            weights_sha256 = hashlib.sha256(f.read()).hexdigest()
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model.eval()
        cases = []
        with torch.no_grad():
            for text in PROMPTS:
                ids = tokenizer(text, add_special_tokens=True).input_ids
                logits = model(torch.tensor([ids])).logits[0]
                greedy, seq = [], list(ids)
                for _ in range(GREEDY_TOKENS):
                    nxt = int(model(torch.tensor([seq])).logits[0, -1].argmax())
                    greedy.append(nxt)
                    seq.append(nxt)
                cases.append({
                    "text": text,
                    "ids": ids,
                    "logits": [[float(f"{x:.7g}") for x in row] for row in logits.tolist()],
                    "greedy": greedy,
                })
    out = {
        "generator": "scripts/make_model_fixtures.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model": {"seed": SEED, "dtype": "F32", "weights_sha256": weights_sha256},
        "cases": cases,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out}: {len(cases)} prompts, weights sha256 {weights_sha256[:16]}…")


if __name__ == "__main__":
    sys.exit(main())
