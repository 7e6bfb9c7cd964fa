#!/usr/bin/env python3
"""Runs llama.cpp (the llama-cpp-python package) on a text and writes the golden data kvpolicy-lm is
checked against: the token ids, each position's NLL and each position's top-k logits.

    python -m kvpolicy_tools.eval.llama_golden MODEL.gguf TEXT_FILE OUT.safetensors [--tokens N] [--top-k K]
                                 [--threads T] [--kv f32|f16] [--batch B]

- tokens [N] I64      llama.cpp's tokenization of the text's start (no BOS, no special tokens)
- nll [N] F32         nll[t] = -log softmax(logits[t-1])[tokens[t]] in float64; nll[0] = NaN
- top_ids [N, K] I64  the K largest logits of each position, largest first
- top_logits [N, K] F32
Metadata: the llama.cpp / llama-cpp-python version, the KV cache type, the text's name and size.

The whole text runs as one batch with every position's logits kept (logits_all); --batch 1 runs it
one token a step instead, as decode steps run (llama.cpp picks its kernels by the batch's size). The K/V cache is
F32 by default, as kvpolicy-lm's. llama-cpp-python builds llama.cpp from source (about 30 minutes
on 2 cores), so this runs once and its output is committed (tests/lm/).
"""
import argparse
import math
import os
import sys

import numpy as np
import llama_cpp

from kvpolicy_tools.convert.convert_checkpoint import write_safetensors  # the project's one writer


class Raw:
    """A tensor for write_safetensors from a numpy array (I64 or F32)."""

    def __init__(self, a):
        self.dtype = {np.dtype("<i8"): "I64", np.dtype("<f4"): "F32"}[a.dtype]
        self.shape = list(a.shape)
        self.data = np.ascontiguousarray(a).tobytes()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv", choices=["f32", "f16"], default="f32")
    ap.add_argument("--batch", type=int, default=0, help="tokens per step (default: the whole text at once)")
    a = ap.parse_args()
    batch = a.batch if a.batch > 0 else a.tokens
    kv_type = {"f32": 0, "f16": 1}[a.kv]  # GGML_TYPE_F32, GGML_TYPE_F16
    llm = llama_cpp.Llama(model_path=a.model, n_ctx=a.tokens, n_batch=batch, n_ubatch=batch, n_threads=a.threads,
                          logits_all=True, type_k=kv_type, type_v=kv_type, verbose=False)
    with open(a.text, "rb") as f:
        text = f.read()
    ids = llm.tokenize(text, add_bos=False, special=False)
    if len(ids) < a.tokens:
        sys.exit(f"llama_golden: {a.text} has only {len(ids)} tokens, fewer than --tokens {a.tokens}")
    ids = ids[:a.tokens]
    llm.reset()
    llm.eval(ids)
    logits = np.array(llm.scores[:a.tokens], dtype=np.float64)  # [N, V]
    mx = logits.max(axis=1, keepdims=True)
    logz = (mx[:, 0] + np.log(np.exp(logits - mx).sum(axis=1)))
    nll = np.full(a.tokens, np.nan)
    for t in range(1, a.tokens):
        nll[t] = logz[t - 1] - logits[t - 1, ids[t]]
    top = np.argsort(-logits, axis=1, kind="stable")[:, :a.top_k]
    top_logits = np.take_along_axis(logits, top, axis=1)
    tensors = {"tokens": Raw(np.array(ids, dtype="<i8")), "nll": Raw(nll.astype("<f4")),
               "top_ids": Raw(top.astype("<i8")), "top_logits": Raw(top_logits.astype("<f4"))}
    meta = {"engine": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}", "kv_cache": a.kv, "batch": batch,
            "text": os.path.basename(a.text), "text_bytes": len(text), "model": os.path.basename(a.model),
            "threads": a.threads}
    write_safetensors(a.out, tensors, meta)
    ppl = math.exp(float(np.mean(nll[1:])))
    print(f"llama_golden: {a.tokens} tokens of {a.text}: ppl {ppl:.4f} (positions >= 1), "
          f"top-{a.top_k} logits -> {a.out}")


if __name__ == "__main__":
    main()
