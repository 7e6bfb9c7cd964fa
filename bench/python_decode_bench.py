#!/usr/bin/env python3
"""docs/python.md's speed table: SmolLM2-135M in transformers (float32, CPU) decoding greedily after a
prompt of N tokens of GPL-3, with transformers' own SDPA attention and DynamicCache against the
"kvpolicy" attention with kvpolicy.transformers.Cache (the full cache, and StreamingLLM at M = 64).
One run each, in one process, the same threads; tokens/s of the decode steps (the prefill timed apart).
  bench/python_decode_bench.py GGUF [--prompt 512] [--new 64] [--threads 2]
(in the venv tests/python/run.sh installs kvpolicy into: build/train/venv)
"""
import argparse
import os
import time

import torch
import transformers

import kvpolicy.transformers as kt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    d, f = os.path.split(os.path.abspath(a.gguf))
    tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    with open("/usr/share/common-licenses/GPL-3") as fh:
        ids = tok(fh.read(), add_special_tokens=False, return_tensors="pt").input_ids[:, :a.prompt]

    def set_attention(name):
        for m in [model] + [layer.self_attn for layer in model.model.layers]:
            m.config._attn_implementation = name

    def run(label, attention, cache):
        set_attention(attention)
        with torch.no_grad():
            t0 = time.perf_counter()
            out = model(ids, cache=cache, use_cache=True)
            prefill = time.perf_counter() - t0
            cache = out.cache if cache is None else cache
            token = out.logits[:, -1:].argmax(-1)
            t0 = time.perf_counter()
            for _ in range(a.new):
                out = model(token, cache=cache, use_cache=True)
                token = out.logits[:, -1:].argmax(-1)
            decode = time.perf_counter() - t0
        held = cache.entries_held() if hasattr(cache, "entries_held") else None
        print(f"| {label} | {a.prompt / prefill:.1f} | {a.new / decode:.2f} | "
              f"{held if held is not None else 'every token'} |", flush=True)

    print(f"SmolLM2-135M, float32, {a.threads} threads, prompt {a.prompt} tokens, {a.new} decode steps "
          f"(torch {torch.__version__}, transformers {transformers.__version__})")
    print("| attention, cache | prefill (tokens/s) | decode (tokens/s) | entries held at the end |")
    print("| --- | ---: | ---: | ---: |")
    run("transformers SDPA, DynamicCache", "sdpa", None)
    run("kvpolicy, full", "kvpolicy", kt.Cache("full", max_tokens=a.prompt + a.new + 16))
    run("kvpolicy, StreamingLLM M = 64, 4 sinks", "kvpolicy",
        kt.Cache("streamingllm", budget=64, buffer=16, sinks=4, max_tokens=a.prompt + a.new + 16))
    run("transformers SDPA, DynamicCache (again)", "sdpa", None)


if __name__ == "__main__":
    main()
