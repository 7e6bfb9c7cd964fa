#!/usr/bin/env python3
"""Converts a LLaMA-family GGUF file to kvpolicy-lm's model directory, then checks what it wrote.

    kvpolicy-gguf-to-lm MODEL.gguf OUT_DIR

OUT_DIR gets:
  config.json        the architecture from the GGUF metadata (layers, widths, heads, RoPE base and
                     type, RMSNorm epsilon, context, tied output head)
  model.safetensors  every weight dequantized to F32 under its GGUF name (token_embd.weight,
                     blk.{l}.attn_q.weight, ..., output_norm.weight), [out, in] row-major
  model.quant.safetensors
                     the Q4_1 and Q8_0 tensors as the GGUF stores them: U8 [rows, row bytes] of
                     ggml blocks under the same names, each tensor's ggml type in __metadata__
                     (kvpolicy-lm's decode steps read these: 96 MB a token instead of 540 MB)
  tokenizer.json     the byte-level BPE vocabulary (tokens in GPT-2's byte-to-unicode form), its
                     token types and merges, the pre-tokenizer's name, and the code point classes
                     the pre-tokenizer splits on (letters, numbers, white space), from Python's
                     unicodedata and llama.cpp's white-space set

Why F32: the GGUF's Q4_1/Q8_0 blocks dequantize to d * q + m with fp16 d and m; the products need
more than fp16's 11 significant bits, so fp16 would round weights llama.cpp uses exactly. F32 holds
every dequantized weight exactly (about 540 MB for SmolLM2-135M). The blocks themselves are kept
too, and checked to dequantize to the F32 file bit for bit.

Needs the `gguf` and `numpy` packages (tools/fetch-model.sh makes a venv with them).
"""
import json
import os
import sys
import unicodedata

import numpy as np
from gguf import GGUFReader
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from kvpolicy_tools.convert.convert_checkpoint import Tensor, write_safetensors  # the project's one writer

# llama.cpp's white-space code points (unicode_set_whitespace), which \s matches in its pre-tokenizer
WHITESPACE = [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F,
              0x205F, 0x3000]


def field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            sys.exit(f"gguf_to_lm: the GGUF has no '{key}'")
        return default
    return f.contents()


def ranges(predicate):
    """Inclusive [lo, hi] ranges of the code points (below 0x110000) where predicate holds."""
    out, lo = [], None
    for cp in range(0x110000):
        if predicate(cp):
            if lo is None:
                lo = cp
        elif lo is not None:
            out.append([lo, cp - 1])
            lo = None
    if lo is not None:
        out.append([lo, 0x10FFFF])
    return out


def config_of(reader):
    arch = field(reader, "general.architecture")
    if arch != "llama":
        sys.exit(f"gguf_to_lm: architecture '{arch}' is not LLaMA-family (llama)")
    a = lambda k, d=None: field(reader, f"{arch}.{k}", d)  # noqa: E731
    hidden, heads = int(a("embedding_length")), int(a("attention.head_count"))
    names = {t.name for t in reader.tensors}
    return {
        "architecture": arch,
        "name": str(field(reader, "general.name", "")),
        "layers": int(a("block_count")),
        "hidden": hidden,
        "ffn": int(a("feed_forward_length")),
        "q_heads": heads,
        "kv_heads": int(a("attention.head_count_kv", heads)),
        "head_dim": hidden // heads,
        "rope_dim": int(a("rope.dimension_count", hidden // heads)),
        "rope_base": float(a("rope.freq_base", 10000.0)),
        # llama.cpp's LLaMA rope is NORM: it rotates adjacent pairs (2i, 2i+1); its converter permutes
        # attn_q/attn_k so that this equals the Hugging Face model's rotate-half
        "rope_type": "adjacent_pairs",
        "rms_eps": float(a("attention.layer_norm_rms_epsilon")),
        "context": int(a("context_length")),
        "vocab": int(a("vocab_size", len(reader.fields["tokenizer.ggml.tokens"].data))),
        "tied_output": "output.weight" not in names,
    }


def tokenizer_of(reader):
    model = field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        sys.exit(f"gguf_to_lm: tokenizer model '{model}' is not byte-level BPE (gpt2)")
    pre = field(reader, "tokenizer.ggml.pre", "default")
    if pre != "smollm":
        sys.exit(f"gguf_to_lm: pre-tokenizer '{pre}' is not supported (kvpolicy-lm implements llama.cpp's 'smollm')")
    tokens = [str(t) for t in field(reader, "tokenizer.ggml.tokens")]
    return {
        "model": "gpt2",
        "pre": pre,
        "tokens": tokens,
        "token_type": [int(t) for t in field(reader, "tokenizer.ggml.token_type")],
        "merges": [str(m) for m in field(reader, "tokenizer.ggml.merges")],
        "bos": int(field(reader, "tokenizer.ggml.bos_token_id", -1)),
        "eos": int(field(reader, "tokenizer.ggml.eos_token_id", -1)),
        "add_bos": bool(field(reader, "tokenizer.ggml.add_bos_token", False)),
        "unicode_version": unicodedata.unidata_version,
        "letters": ranges(lambda cp: unicodedata.category(chr(cp)).startswith("L")),
        "numbers": ranges(lambda cp: unicodedata.category(chr(cp)).startswith("N")),
        "whitespace": [[c, c] for c in WHITESPACE],
    }


def weights_of(reader, cfg):
    out = {}
    for t in reader.tensors:
        w = dequantize(t.data, t.tensor_type) if t.tensor_type != GGMLQuantizationType.F32 else np.asarray(t.data)
        w = np.ascontiguousarray(w, dtype="<f4")
        shape = [int(s) for s in reversed([int(x) for x in t.shape])]  # GGUF lists ne0 (the inner width) first
        if int(np.prod(shape)) != w.size:
            sys.exit(f"gguf_to_lm: {t.name}: {w.size} values for shape {shape}")
        out[t.name] = w.reshape(shape)
    return out


# ggml block formats kvpolicy-lm decodes (apps/lm/quant.hpp): bytes per block of 32 weights
BLOCK_BYTES = {GGMLQuantizationType.Q4_1: 20, GGMLQuantizationType.Q8_0: 34}


def blocks_of(reader):
    """The quantized tensors' ggml blocks as stored, {name: (type name, uint8 [rows, row bytes])}."""
    out = {}
    for t in reader.tensors:
        if t.tensor_type not in BLOCK_BYTES:
            continue
        shape = [int(s) for s in reversed([int(x) for x in t.shape])]
        rows, cols = int(np.prod(shape[:-1])), shape[-1]
        raw = np.ascontiguousarray(np.asarray(t.data, dtype=np.uint8)).reshape(rows, -1)
        if cols % 32 != 0 or raw.shape[1] != cols // 32 * BLOCK_BYTES[t.tensor_type]:
            sys.exit(f"gguf_to_lm: {t.name}: {raw.shape[1]} bytes a row for {cols} {t.tensor_type.name} weights")
        out[t.name] = (t.tensor_type.name, raw)
    return out


def expected_shapes(cfg):
    D, F, d = cfg["hidden"], cfg["ffn"], cfg["head_dim"]
    shapes = {"token_embd.weight": [cfg["vocab"], D], "output_norm.weight": [D]}
    if not cfg["tied_output"]:
        shapes["output.weight"] = [cfg["vocab"], D]
    for l in range(cfg["layers"]):
        p = f"blk.{l}."
        shapes.update({p + "attn_norm.weight": [D], p + "ffn_norm.weight": [D],
                       p + "attn_q.weight": [cfg["q_heads"] * d, D], p + "attn_k.weight": [cfg["kv_heads"] * d, D],
                       p + "attn_v.weight": [cfg["kv_heads"] * d, D], p + "attn_output.weight": [D, cfg["q_heads"] * d],
                       p + "ffn_gate.weight": [F, D], p + "ffn_up.weight": [F, D], p + "ffn_down.weight": [D, F]})
    return shapes


def read_safetensors(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: np.frombuffer(data, "<f4", count=int(np.prod(v["shape"])), offset=v["data_offsets"][0]).reshape(v["shape"])
            for k, v in header.items()}


def check_blocks(out_dir, weights, blocks, problems):
    """The written blocks: the same bytes, and they dequantize to the F32 weights bit for bit."""
    path = os.path.join(out_dir, "model.quant.safetensors")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    if set(header) != set(blocks):
        problems.append(f"{path}: tensor names differ from the GGUF's quantized ones")
    for name, (kind, raw) in blocks.items():
        h = header.get(name)
        if h is None:
            continue
        got = np.frombuffer(data, np.uint8, count=raw.size, offset=h["data_offsets"][0]).reshape(raw.shape)
        if h["dtype"] != "U8" or h["shape"] != list(raw.shape) or meta.get(name) != kind:
            problems.append(f"{name}: written as {h['dtype']} {h['shape']} {meta.get(name)}, want U8 {list(raw.shape)} {kind}")
        elif not np.array_equal(got, raw):
            problems.append(f"{name}: the written blocks differ from the GGUF's")
        elif not np.array_equal(dequantize(got, GGMLQuantizationType[kind]).reshape(weights[name].shape), weights[name]):
            problems.append(f"{name}: the blocks do not dequantize to the F32 weights")


def check(out_dir, cfg, weights, tok, blocks):
    """Reads back what was written and fails on any difference."""
    problems = []
    check_blocks(out_dir, weights, blocks, problems)
    got = read_safetensors(os.path.join(out_dir, "model.safetensors"))
    want_shapes = expected_shapes(cfg)
    if set(got) != set(want_shapes):
        problems.append(f"tensor names differ: missing {sorted(set(want_shapes) - set(got))[:5]}, "
                        f"unexpected {sorted(set(got) - set(want_shapes))[:5]}")
    for name, shape in want_shapes.items():
        if name not in got:
            continue
        if list(got[name].shape) != shape:
            problems.append(f"{name}: shape {list(got[name].shape)}, want {shape}")
        elif not np.array_equal(got[name], weights[name]):
            problems.append(f"{name}: the file's values differ from the GGUF's dequantized ones")
        elif not np.isfinite(got[name]).all():
            problems.append(f"{name}: non-finite values")
    with open(os.path.join(out_dir, "tokenizer.json"), encoding="utf-8") as f:
        t = json.load(f)
    if t["tokens"] != tok["tokens"] or len(t["tokens"]) != cfg["vocab"]:
        problems.append(f"tokenizer: {len(t['tokens'])} tokens, want {cfg['vocab']} as in the GGUF")
    if len(set(t["tokens"])) != len(t["tokens"]):
        problems.append("tokenizer: duplicate token strings")
    vocab = set(t["tokens"])
    for m in t["merges"]:
        parts = m.split(" ")
        if len(parts) != 2 or parts[0] + parts[1] not in vocab:
            problems.append(f"tokenizer: merge '{m}' does not make a token of the vocabulary")
            break
    if problems:
        sys.exit("gguf_to_lm: check failed:\n  " + "\n  ".join(problems))


def main(argv=None):
    argv = sys.argv if argv is None else argv
    if len(argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    path, out_dir = argv[1], argv[2]
    reader = GGUFReader(path)
    cfg = config_of(reader)
    tok = tokenizer_of(reader)
    weights = weights_of(reader, cfg)
    shapes = expected_shapes(cfg)
    for name, shape in shapes.items():
        if name not in weights or list(weights[name].shape) != shape:
            sys.exit(f"gguf_to_lm: {name}: {list(weights[name].shape) if name in weights else 'missing'}, want {shape}")
    os.makedirs(out_dir, exist_ok=True)
    tensors = {name: Tensor("F32", list(w.shape), w.tobytes()) for name, w in sorted(weights.items())}
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, {"source": os.path.basename(path)})
    blocks = blocks_of(reader)
    quant = {name: Tensor("U8", list(raw.shape), raw.tobytes()) for name, (_, raw) in sorted(blocks.items())}
    write_safetensors(os.path.join(out_dir, "model.quant.safetensors"), quant,
                      {"source": os.path.basename(path), **{name: kind for name, (kind, _) in blocks.items()}})
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=1)
    check(out_dir, cfg, weights, tok, blocks)
    n = sum(w.size for w in weights.values())
    nq = sum(raw.nbytes for _, raw in blocks.values())
    print(f"gguf_to_lm: {cfg['name']}: {len(weights)} tensors, {n:,} weights (F32), {len(blocks)} quantized "
          f"({nq:,} bytes of blocks), {len(tok['tokens'])} tokens, {len(tok['merges'])} merges -> {out_dir} (checked)")


if __name__ == "__main__":
    main(sys.argv)
