#!/usr/bin/env python3
"""Times llama.cpp (the llama-cpp-python package) on the tokens bench/bench_lm.sh gives kvpolicy-lm:
prefill of the first N tokens of a text, then decode of the next D tokens one at a time, for each N.

    python bench/llama_bench.py MODEL.gguf TEXT_FILE [--contexts 1024,4096,8192] [--decode 64]
                                [--threads T] [--batch 512] [--kv f16|f32]

Prints one line per context:
    llama.cpp context N: prefill N tokens in S s, X tokens/s; decode D tokens in S s, Y tokens/s
Decode feeds the text's own next tokens (the cost of a step does not depend on which token it is),
so no sampling is timed. The K/V cache is llama.cpp's default F16 unless --kv f32.
"""
import argparse
import time

import llama_cpp


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("--contexts", default="1024,4096,8192")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--kv", choices=["f16", "f32"], default="f16")
    a = ap.parse_args()
    contexts = [int(c) for c in a.contexts.split(",")]
    kv_type = {"f32": 0, "f16": 1}[a.kv]  # GGML_TYPE_F32, GGML_TYPE_F16
    with open(a.text, "rb") as f:
        text = f.read()
    for n in contexts:
        llm = llama_cpp.Llama(model_path=a.model, n_ctx=n + a.decode, n_batch=a.batch, n_ubatch=a.batch,
                              n_threads=a.threads, n_threads_batch=a.threads, type_k=kv_type, type_v=kv_type,
                              verbose=False)
        ids = llm.tokenize(text, add_bos=False, special=False)
        if len(ids) < n + a.decode:
            raise SystemExit(f"llama_bench: {a.text} has {len(ids)} tokens, fewer than {n} + {a.decode}")
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids[:n])
        prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        for t in ids[n:n + a.decode]:
            llm.eval([t])
        decode = time.perf_counter() - t0
        print(f"llama.cpp context {n}: prefill {n} tokens in {prefill:.3f} s, {n / prefill:.1f} tokens/s; "
              f"decode {a.decode} tokens in {decode:.3f} s, {a.decode / decode:.2f} tokens/s", flush=True)
        del llm


if __name__ == "__main__":
    main()
