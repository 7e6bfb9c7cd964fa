#!/usr/bin/env python3
"""Writes the fuzz seed corpus (fuzz/corpus/<target>/): valid files, and one file for each malformed
case the parsers name. Standard library only; deterministic. Run from anywhere:
    python3 fuzz/make_corpus.py
"""
import json
import math
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "I64": 8}


def image(header, data=b"", pad=True):
    """A safetensors image: 8-byte little-endian header length, JSON header, data."""
    h = json.dumps(header, separators=(",", ":")).encode() if not isinstance(header, bytes) else header
    if pad:
        while (8 + len(h)) % 8:
            h += b" "
    return struct.pack("<Q", len(h)) + h + data


def tensors(entries, metadata=None):
    """entries: [(name, dtype, shape, values)] -> a valid image."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, values in entries:
        fmt = {"F32": "f", "I32": "i", "I64": "q"}.get(dtype)
        raw = struct.pack("<%d%s" % (len(values), fmt), *values) if fmt else pack16(dtype, values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    return image(header, data)


def pack16(dtype, values):
    if dtype == "F16":
        return struct.pack("<%de" % len(values), *values)
    out = b""
    for v in values:  # bf16: the high half of the fp32 bits (these seeds are exact in bf16)
        out += struct.pack("<I", struct.unpack("<I", struct.pack("<f", v))[0])[2:]
    return out


def ramp(n, scale=0.1):
    return [scale * ((i % 7) - 3) for i in range(n)]


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def safetensors_seeds():
    ok = [("a", "F32", [2, 3], ramp(6)), ("b", "F16", [4], ramp(4)), ("c", "BF16", [2, 2], [1.0, -2.0, 0.5, 0.0]),
          ("d", "I32", [3], [1, -2, 3]), ("e", "I64", [2], [7, -9]), ("empty", "F32", [0, 4], [])]
    write("safetensors", "valid_all_dtypes", tensors(ok, {"format": "pt"}))
    write("safetensors", "valid_empty_header", image({}))
    write("safetensors", "valid_scalar", tensors([("s", "F32", [], [1.5])]))
    write("safetensors", "truncated_length", b"\x08\x00\x00")
    write("safetensors", "header_too_long", struct.pack("<Q", 1 << 40) + b"{}")
    write("safetensors", "header_not_json", image(b"{not json"))
    write("safetensors", "header_not_object", image([1, 2]))
    write("safetensors", "metadata_not_object", image({"__metadata__": 3}))
    write("safetensors", "entry_not_object", image({"t": 1}))
    write("safetensors", "missing_dtype", image({"t": {"shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4))
    write("safetensors", "missing_shape", image({"t": {"dtype": "F32", "data_offsets": [0, 4]}}, b"\0" * 4))
    write("safetensors", "bad_offsets", image({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}, b"\0" * 4))
    write("safetensors", "unknown_dtype", image({"t": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8))
    write("safetensors", "negative_extent", image({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4))
    write("safetensors", "shape_overflow",
          image({"t": {"dtype": "F32", "shape": [1 << 31, 1 << 31, 1 << 31], "data_offsets": [0, 4]}}, b"\0" * 4))
    write("safetensors", "negative_offset", image({"t": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}}, b"\0" * 4))
    write("safetensors", "begin_after_end", image({"t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, b"\0" * 4))
    write("safetensors", "offsets_past_data", image({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4))
    write("safetensors", "size_mismatch", image({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 8))
    write("safetensors", "overlap", image({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12))
    write("safetensors", "non_finite", tensors([("t", "F32", [3], [1.0, math.inf, math.nan])]))


L, D, H, I = 2, 8, 2, 4  # the geometry fuzz_gate.cpp loads


def retention_gate(dtype="F32", skip=None, shape_of=None, value=None):
    out = []
    for l in range(L):
        p = "model.layers.%d.self_attn.retention_gate." % l
        for name, shape in [("linear1.weight", [I, D]), ("linear1.bias", [I]), ("linear2.weight", [H, I]), ("bias", [H])]:
            if p + name == skip:
                continue
            shape = shape_of.get(p + name, shape) if shape_of else shape
            vals = ramp(math.prod(shape))
            if value and p + name in value:
                vals[0] = value[p + name]
            out.append((p + name, dtype, shape, vals))
    return tensors(out)


def tied_gate(dtype="F32"):
    out = []
    for l in range(L):
        p = "model.layers.%d.self_attn.retention_gate." % l
        out += [(p + "proj.weight", dtype, [H * I, D], ramp(H * I * D)), (p + "proj.bias", dtype, [H * I], ramp(H * I))]
    out += [("retention_gate.readout.weight", dtype, [I], ramp(I)), ("retention_gate.readout.bias", dtype, [1], [0.5])]
    return tensors(out)


def gate_seeds():
    write("gate", "trimkv_f32", retention_gate())
    write("gate", "trimkv_f16", retention_gate("F16"))
    write("gate", "trimkv_bf16", retention_gate("BF16"))
    write("gate", "dbtrimkv_f32", tied_gate())
    write("gate", "dbtrimkv_bf16", tied_gate("BF16"))
    write("gate", "trimkv_missing_layer1_bias", retention_gate(skip="model.layers.1.self_attn.retention_gate.bias"))
    write("gate", "trimkv_wrong_shape",
          retention_gate(shape_of={"model.layers.0.self_attn.retention_gate.linear1.weight": [D, I]}))
    write("gate", "trimkv_nan_weight", retention_gate(value={"model.layers.1.self_attn.retention_gate.linear2.weight": math.nan}))
    write("gate", "trimkv_huge_weights",
          retention_gate(value={"model.layers.0.self_attn.retention_gate.linear1.weight": 3e38}))
    write("gate", "trimkv_int_dtype", tensors([("model.layers.0.self_attn.retention_gate.linear1.weight", "I32", [I, D],
                                                [1] * (I * D))]))


def trace_seeds():
    Lt, Ht, G, d, T = 2, 2, 2, 4, 12
    lb = [-0.05 * ((i * 7) % 5) for i in range(Lt * Ht * T)]
    lb[3] = 0.0
    kv = ramp(Lt * Ht * T * d, 0.5)
    q = ramp(Lt * Ht * G * T * d, 0.3)
    write("trace", "log_beta_only", tensors([("log_beta", "F32", [Lt, Ht, T], lb)]))
    write("trace", "with_attention", tensors([("log_beta", "F32", [Lt, Ht, T], lb), ("keys", "F32", [Lt, Ht, T, d], kv),
                                              ("values", "F32", [Lt, Ht, T, d], kv),
                                              ("queries", "F32", [Lt, Ht * G, T, d], q)]))
    write("trace", "log_beta_f16", tensors([("log_beta", "F16", [Lt, Ht, T], lb)]))
    gate = [0.9 if i % 3 == 0 else 0.05 for i in range(Lt * Ht * T)]
    hidden = ramp(3 * T * 5, 0.2)
    write("trace", "with_everything", tensors([("log_beta", "F32", [Lt, Ht, T], lb), ("keys", "F32", [Lt, Ht, T, d], kv),
                                               ("values", "F32", [Lt, Ht, T, d], kv),
                                               ("queries", "F32", [Lt, Ht * G, T, d], q),
                                               ("keys_pre_rope", "F32", [Lt, Ht, T, d], kv),
                                               ("write_gate", "F32", [Lt, Ht, T], gate),
                                               ("hidden_states", "F32", [3, T, 5], hidden)]))
    write("trace", "write_gate_above_one", tensors([("log_beta", "F32", [1, 1, 2], [0.0, -1.0]),
                                                    ("write_gate", "F32", [1, 1, 2], [0.5, 1.5])]))
    write("trace", "hidden_wrong_tokens", tensors([("log_beta", "F32", [1, 1, 2], [0.0, -1.0]),
                                                   ("hidden_states", "F32", [2, 3, 1], [0.0] * 6)]))
    write("trace", "log_beta_positive", tensors([("log_beta", "F32", [1, 1, 4], [0.0, 0.5, -1.0, -2.0])]))
    write("trace", "log_beta_nan", tensors([("log_beta", "F32", [1, 1, 4], [0.0, math.nan, -1.0, -2.0])]))
    write("trace", "log_beta_wrong_rank", tensors([("log_beta", "F32", [4], [0.0, -0.5, -1.0, -2.0])]))
    write("trace", "log_beta_missing", tensors([("beta", "F32", [1, 1, 1], [0.5])]))
    write("trace", "keys_without_queries", tensors([("log_beta", "F32", [1, 1, 2], [0.0, -1.0]),
                                                    ("keys", "F32", [1, 1, 2, 1], [1.0, 2.0])]))
    write("trace", "keys_wrong_rank", tensors([("log_beta", "F32", [1, 1, 2], [0.0, -1.0]), ("keys", "F32", [2], [1.0, 2.0]),
                                               ("values", "F32", [2], [1.0, 2.0]), ("queries", "F32", [2], [1.0, 2.0])]))
    write("trace", "queries_not_multiple", tensors([("log_beta", "F32", [1, 2, 1], [0.0, -1.0]),
                                                    ("keys", "F32", [1, 2, 1, 1], [1.0, 2.0]),
                                                    ("values", "F32", [1, 2, 1, 1], [1.0, 2.0]),
                                                    ("queries", "F32", [1, 3, 1, 1], [1.0, 2.0, 3.0])]))
    write("trace", "keys_infinite", tensors([("log_beta", "F32", [1, 1, 2], [0.0, -1.0]),
                                             ("keys", "F32", [1, 1, 2, 1], [math.inf, 2.0]),
                                             ("values", "F32", [1, 1, 2, 1], [1.0, 2.0]),
                                             ("queries", "F32", [1, 1, 2, 1], [1.0, 2.0])]))


if __name__ == "__main__":
    safetensors_seeds()
    gate_seeds()
    trace_seeds()
