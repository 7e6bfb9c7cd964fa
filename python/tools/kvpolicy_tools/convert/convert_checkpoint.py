#!/usr/bin/env python3
"""Converts the authors' gate checkpoints to the safetensors files kvpolicy loads (docs/formats.md).

    kvpolicy-convert-checkpoint trimkv trimkv_weights.pth trimkv_gate.safetensors
    kvpolicy-convert-checkpoint dbtrimkv dbtrimkv_weights.pth dbtrimkv_gate.safetensors
    kvpolicy-convert-checkpoint wgkv   Llama-3.1-8B-0.1.pt  wgkv_gate.safetensors

trimkv  TRIM-KV's `trimkv_weights.pth`: a flat state dict whose keys end in
        `layers.{l}.self_attn.retention_gate.{linear1.weight, linear1.bias, linear2.weight, bias}`
        (any prefix before `layers.`, as in the vision-language models). Written under SPEC §1's
        names `model.layers.{l}.self_attn.retention_gate.*`, shapes unchanged.
dbtrimkv  DBTrimKV's released checkpoints, the authors' `rg10` gate (SPEC §2): keys ending in
        `layers.{l}.self_attn.retention_gate.{linear1.weight [I, D], linear1.bias, linear2.weight
        [I, I], linear2.bias, linear3.weight [Hkv, I], bias [Hkv]}`; linear3 and bias are tied across
        the layers, so every layer's copy must be identical (an edited copy is an error naming its
        layer). Written under the same names with `model.` first, every layer's copy kept (the C++
        loader checks them again).
wgkv    WG-KV's `*.pt`: a flat dict of the write gate's parameters
        `...layers.{l}.self_attn.g_predictors.{pre_key_norm.weight [d], post_key_norm.weight [d],
        conv1.weight [H*E, 2d, 1], conv1.bias [H*E], conv2.weight [H, E, 1], conv2.bias [H]}`
        (per-head MLPs stored as grouped 1x1 convolutions). Written as
        `model.layers.{l}.self_attn.write_gate.{pre_norm.weight [d], post_norm.weight [d],
        w1.weight [H, E, 2d], w1.bias [H, E], w2.weight [H, E], w2.bias [H]}`.

The dtype is kept (F32, F16 or BF16; all three load) unless --dtype says otherwise. The checkpoint
is read with torch when it is installed (`torch.load(weights_only=True)`), otherwise with the
standard library (PyTorch's zip format: data.pkl + one file per storage); --reader picks one.
Any key of the gate's family that does not fit, a missing layer or a shape that disagrees is an
error naming it; other keys are ignored and counted.
"""
import argparse
import collections
import json
import math
import pickle
import re
import struct
import sys
import zipfile

DTYPES = {"F32": 4, "F16": 2, "BF16": 2, "U8": 1}  # U8: gguf_to_lm.py's ggml blocks


class Tensor:
    """A tensor as bytes: dtype (F32/F16/BF16), shape, C-order little-endian data."""

    def __init__(self, dtype, shape, data):
        self.dtype, self.shape, self.data = dtype, list(shape), bytes(data)
        if len(self.data) != math.prod(self.shape) * DTYPES[dtype]:
            raise ValueError("tensor of shape %s and dtype %s holds %d bytes" % (self.shape, dtype, len(self.data)))

    def reshape(self, shape):
        if math.prod(shape) != math.prod(self.shape):
            raise ValueError("cannot reshape %s to %s" % (self.shape, shape))
        return Tensor(self.dtype, shape, self.data)

    def to(self, dtype):
        if dtype == self.dtype:
            return self
        values = self.floats()
        if dtype == "F32":
            return Tensor("F32", self.shape, struct.pack("<%df" % len(values), *values))
        if dtype == "F16":
            try:
                return Tensor("F16", self.shape, struct.pack("<%de" % len(values), *values))
            except (OverflowError, struct.error):
                raise ValueError("a value of magnitude %g does not fit in F16" % max(abs(v) for v in values))
        out = bytearray()
        for v in values:  # fp32 -> bf16, round to nearest even (NaN kept quiet)
            bits = struct.unpack("<I", struct.pack("<f", v))[0]
            if (bits & 0x7F800000) == 0x7F800000 and bits & 0x7FFFFF:
                out += struct.pack("<H", (bits >> 16) | 0x40)
            else:
                out += struct.pack("<H", (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16)
        return Tensor("BF16", self.shape, out)

    def floats(self):
        n = math.prod(self.shape)
        if self.dtype == "F32":
            return list(struct.unpack("<%df" % n, self.data))
        if self.dtype == "F16":
            return list(struct.unpack("<%de" % n, self.data))
        return [struct.unpack("<f", b"\0\0" + self.data[2 * i:2 * i + 2])[0] for i in range(n)]


# ---- reading ---------------------------------------------------------------------------------
def read_with_torch(path):
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True)
    names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
    out = {}
    for key, t in flatten(state).items():
        if not isinstance(t, torch.Tensor):
            continue
        if t.dtype not in names:
            out[key] = None  # not a float tensor: reported if it belongs to the gate
            continue
        t = t.contiguous().clone()  # a compact storage holding exactly this tensor, C order
        try:
            data = t.view(torch.int16 if t.element_size() == 2 else torch.int32).numpy().tobytes()
        except RuntimeError:  # torch without numpy
            data = bytes(t.untyped_storage().tolist())
        out[key] = Tensor(names[t.dtype], t.shape, data)
    return out


_STORAGE_DTYPES = {"FloatStorage": "F32", "HalfStorage": "F16", "BFloat16Storage": "BF16"}


class _Storage:
    def __init__(self, dtype, data):
        self.dtype, self.data = dtype, data


class _StorageType:
    def __init__(self, name):
        self.name = name


def _rebuild_tensor(storage, offset, size, stride, *unused):
    if storage.dtype is None:
        return None
    item = DTYPES[storage.dtype]
    size, stride = list(size), list(stride)
    count = math.prod(size)
    contiguous = [math.prod(size[i + 1:]) for i in range(len(size))]
    if stride == contiguous or count <= 1:
        data = storage.data[offset * item:(offset + count) * item]
    else:  # a strided view: gather element by element
        data = bytearray()
        for flat in range(count):
            at, rest = offset, flat
            for dim in range(len(size) - 1, -1, -1):
                at += (rest % size[dim]) * stride[dim]
                rest //= size[dim]
            data += storage.data[at * item:(at + 1) * item]
    return Tensor(storage.dtype, size, data)


class _Unpickler(pickle.Unpickler):
    def __init__(self, archive, prefix, fp):
        super().__init__(fp)
        self.archive, self.prefix, self.storages = archive, prefix, {}

    def find_class(self, module, name):
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor
        if module == "torch._utils" and name == "_rebuild_parameter":  # nn.Parameter(data, ...)
            return lambda data, *unused: data
        if module == "torch" and name.endswith("Storage"):
            return _StorageType(name)
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        raise pickle.UnpicklingError("unsupported object %s.%s in the checkpoint" % (module, name))

    def persistent_load(self, pid):
        kind, storage_type, key = pid[0], pid[1], pid[2]
        if kind != "storage":
            raise pickle.UnpicklingError("unsupported persistent id %r" % (pid,))
        if key not in self.storages:  # one read per storage, however many tensors view it
            data = self.archive.read("%sdata/%s" % (self.prefix, key))
            self.storages[key] = _Storage(_STORAGE_DTYPES.get(storage_type.name), data)
        return self.storages[key]


def read_without_torch(path):
    with zipfile.ZipFile(path) as archive:
        pkl = [n for n in archive.namelist() if n.endswith("data.pkl")]
        if len(pkl) != 1:
            raise ValueError("%s is not a PyTorch zip checkpoint (no single data.pkl)" % path)
        prefix = pkl[0][: -len("data.pkl")]
        with archive.open(pkl[0]) as fp:
            state = _Unpickler(archive, prefix, fp).load()
    return {k: v for k, v in flatten(state).items() if v is None or isinstance(v, Tensor)}


def flatten(state, prefix=""):
    """A state dict, or a dict nesting one (e.g. {'state_dict': ...}), as one flat dict."""
    out = {}
    for key, value in state.items():
        if isinstance(value, dict):
            out.update(flatten(value, prefix + key + "."))
        else:
            out[prefix + key] = value
    return out


# ---- mapping ---------------------------------------------------------------------------------
def by_layer(state, family, fields):
    """{layer: {field: Tensor}} for the keys `...layers.{l}.self_attn.{family}.{field}`."""
    pattern = re.compile(r"(?:^|\.)layers\.(\d+)\.self_attn\.%s\.(.+)$" % re.escape(family))
    layers, ignored = {}, 0
    for key, tensor in state.items():
        m = pattern.search(key)
        if not m:
            ignored += 1
            continue
        layer, field = int(m.group(1)), m.group(2)
        if field not in fields:
            raise ValueError("unexpected gate parameter '%s' (expected one of %s)" % (key, ", ".join(fields)))
        if tensor is None:
            raise ValueError("gate parameter '%s' is not a float tensor" % key)
        if field in layers.setdefault(layer, {}):
            raise ValueError("layer %d's '%s' appears twice (second: '%s')" % (layer, field, key))
        layers[layer][field] = tensor
    if not layers:
        raise ValueError("no '%s' parameters in the checkpoint (%d other keys)" % (family, ignored))
    count = max(layers) + 1
    for layer in range(count):
        missing = [f for f in fields if f not in layers.get(layer, {})]
        if missing:
            raise ValueError("layer %d lacks %s" % (layer, ", ".join(missing)))
    return [layers[l] for l in range(count)], ignored


def expect(name, tensor, shape):
    if tensor.shape != list(shape):
        raise ValueError("%s has shape %s, expected %s" % (name, tensor.shape, list(shape)))


def convert_trimkv(state):
    fields = ["linear1.weight", "linear1.bias", "linear2.weight", "bias"]
    layers, ignored = by_layer(state, "retention_gate", fields)
    inner, hidden = layers[0]["linear1.weight"].shape
    heads = layers[0]["bias"].shape[0]
    out = {}
    for l, p in enumerate(layers):
        name = "model.layers.%d.self_attn.retention_gate." % l
        for field, shape in zip(fields, ([inner, hidden], [inner], [heads, inner], [heads])):
            expect(name + field, p[field], shape)
            out[name + field] = p[field]
    info = {"layers": len(layers), "hidden": hidden, "kv_heads": heads, "intermediate": inner}
    return out, info, ignored


def convert_dbtrimkv(state):
    fields = ["linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias", "linear3.weight", "bias"]
    layers, ignored = by_layer(state, "retention_gate", fields)
    inner, hidden = layers[0]["linear1.weight"].shape
    heads = layers[0]["bias"].shape[0]
    out = {}
    for l, p in enumerate(layers):
        name = "model.layers.%d.self_attn.retention_gate." % l
        shapes = ([inner, hidden], [inner], [inner, inner], [inner], [heads, inner], [heads])
        for field, shape in zip(fields, shapes):
            expect(name + field, p[field], shape)
            out[name + field] = p[field]
        for field in ("linear3.weight", "bias"):  # tied (rg10): one pair for the whole model
            if (p[field].dtype, p[field].data) != (layers[0][field].dtype, layers[0][field].data):
                raise ValueError("layer %d's %s differs from layer 0's: rg10 ties it across every layer "
                                 "(SPEC §2), so this is not an rg10 checkpoint or it was edited" % (l, field))
    info = {"layers": len(layers), "hidden": hidden, "kv_heads": heads, "intermediate": inner, "gate": "rg10"}
    return out, info, ignored


def convert_wgkv(state):
    fields = ["pre_key_norm.weight", "post_key_norm.weight", "conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"]
    layers, ignored = by_layer(state, "g_predictors", fields)
    d = layers[0]["pre_key_norm.weight"].shape[0]
    heads = layers[0]["conv2.bias"].shape[0]
    if len(layers[0]["conv2.weight"].shape) != 3:
        raise ValueError("conv2.weight has shape %s, expected [H, E, 1]" % layers[0]["conv2.weight"].shape)
    expand = layers[0]["conv2.weight"].shape[1]
    out = {}
    for l, p in enumerate(layers):
        src = "layers.%d.self_attn.g_predictors." % l
        dst = "model.layers.%d.self_attn.write_gate." % l
        expect(src + "pre_key_norm.weight", p["pre_key_norm.weight"], [d])
        expect(src + "post_key_norm.weight", p["post_key_norm.weight"], [d])
        expect(src + "conv1.weight", p["conv1.weight"], [heads * expand, 2 * d, 1])
        expect(src + "conv1.bias", p["conv1.bias"], [heads * expand])
        expect(src + "conv2.weight", p["conv2.weight"], [heads, expand, 1])
        expect(src + "conv2.bias", p["conv2.bias"], [heads])
        out[dst + "pre_norm.weight"] = p["pre_key_norm.weight"]
        out[dst + "post_norm.weight"] = p["post_key_norm.weight"]
        out[dst + "w1.weight"] = p["conv1.weight"].reshape([heads, expand, 2 * d])  # groups = H: head h's rows
        out[dst + "w1.bias"] = p["conv1.bias"].reshape([heads, expand])
        out[dst + "w2.weight"] = p["conv2.weight"].reshape([heads, expand])
        out[dst + "w2.bias"] = p["conv2.bias"]
    info = {"layers": len(layers), "head_dim": d, "kv_heads": heads, "expand": expand}
    return out, info, ignored


# ---- writing ---------------------------------------------------------------------------------
def write_safetensors(path, tensors, metadata):
    header, data = {"__metadata__": {k: str(v) for k, v in metadata.items()}}, bytearray()
    for name, t in tensors.items():
        header[name] = {"dtype": t.dtype, "shape": t.shape, "data_offsets": [len(data), len(data) + len(t.data)]}
        data += t.data
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)  # keep the data 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kind", choices=["trimkv", "dbtrimkv", "wgkv"])
    ap.add_argument("checkpoint")
    ap.add_argument("output")
    ap.add_argument("--dtype", choices=["keep", "F32", "F16", "BF16"], default="keep")
    ap.add_argument("--reader", choices=["auto", "torch", "zip"], default="auto",
                    help="torch.load, or the standard-library reader of PyTorch's zip format")
    args = ap.parse_args(argv)
    reader = args.reader
    if reader == "auto":
        try:
            import torch  # noqa: F401
            reader = "torch"
        except ImportError:
            reader = "zip"
    try:
        state = read_with_torch(args.checkpoint) if reader == "torch" else read_without_torch(args.checkpoint)
        convert = {"trimkv": convert_trimkv, "dbtrimkv": convert_dbtrimkv, "wgkv": convert_wgkv}[args.kind]
        tensors, info, ignored = convert(state)
    except (ValueError, KeyError, OSError, zipfile.BadZipFile, pickle.UnpicklingError) as e:
        print("convert_checkpoint: %s: %s" % (args.checkpoint, e), file=sys.stderr)
        return 1
    if args.dtype != "keep":
        tensors = {k: t.to(args.dtype) for k, t in tensors.items()}
    write_safetensors(args.output, tensors, dict(info, kind=args.kind, source=args.checkpoint))
    print("convert_checkpoint: %s -> %s: %d tensors (%s), %d other keys ignored, %s"
          % (args.checkpoint, args.output, len(tensors), reader, ignored,
             ", ".join("%s %s" % (k, v) for k, v in info.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
