"""Test of kvpolicy-convert-checkpoint (kvpolicy_tools.convert.convert_checkpoint) on small checkpoints it makes with torch (it runs
in the training venv, tests/with_torch.sh, which reports SKIPPED when that venv cannot be made; without torch
the module fails to import):
  - TRIM-KV: a bf16 state dict like `trimkv_weights.pth` (with a vision-language key prefix and an
    unrelated key), converted with both readers (torch.load and the standard-library zip reader),
    which must write identical files; the C++ loader (gate_forward) must then compute the log_beta
    torch computes from the same weights;
  - --dtype F32 widens bf16 exactly; --dtype BF16 from F32 rounds as torch does; F16 refuses what it
    cannot hold;
  - WG-KV: an fp32 `g_predictors` dict of grouped 1x1 convolutions, whose converted w1/w2 must be
    the per-head slices of the convolutions;
  - errors: a missing layer and a wrong shape are refused, naming the key; a hostile pickle is
    refused by torch.load(weights_only=True) and runs nothing.
usage: KVPOLICY_GATE_FORWARD=build/default/tests/gate_forward PYTHONPATH=$PWD/python/tools \
         tests/with_torch.sh -m pytest -q -p no:cacheprovider tests/converter/test_convert_checkpoint.py
       (ctest sets both; each test works in its own pytest tmp_path)
"""
import json
import os
import pickle
import struct
import subprocess
import sys
import types
import zipfile

import pytest
import torch

converter = "kvpolicy_tools.convert.convert_checkpoint"  # kvpolicy-convert-checkpoint
L, D, I, H = 3, 16, 8, 2  # TRIM-KV: layers, hidden size, gate width, KV heads
WL, d, Hw, E = 2, 8, 2, 12  # WG-KV: layers, head size, heads, gate width


def run(*args, ok=True):
    p = subprocess.run([sys.executable, "-m", converter, *args], capture_output=True, text=True)
    assert (p.returncode == 0) == ok, "converter %s: rc %d\n%s%s" % (args, p.returncode, p.stdout, p.stderr)
    return p.stdout + p.stderr


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    return header, blob[8 + n:]


@pytest.fixture(scope="module")
def tensors():
    """Every random tensor the tests save, drawn from seed 0 in one order (each test's inputs are the same
    whichever tests run)."""
    torch.manual_seed(0)
    # ---- TRIM-KV ----
    state = {}
    for l in range(L):
        p = "model.language_model.layers.%d.self_attn.retention_gate." % l
        state[p + "linear1.weight"] = (torch.randn(I, D) * 0.3).bfloat16()
        state[p + "linear1.bias"] = (torch.randn(I) * 0.1).bfloat16()
        state[p + "linear2.weight"] = (torch.randn(H, I) * 0.3).bfloat16()
        state[p + "bias"] = torch.full((H,), 2.0).bfloat16() + torch.randn(H).bfloat16()
    state["model.language_model.norm.weight"] = torch.ones(D).bfloat16()
    # views the zip reader must gather: a transposed (strided) weight and a slice at a storage offset
    state["model.language_model.layers.2.self_attn.retention_gate.linear2.weight"] = (torch.randn(I, H) * 0.3).bfloat16().T
    state["model.language_model.layers.2.self_attn.retention_gate.linear1.bias"] = (torch.randn(I + 5) * 0.1).bfloat16()[5:]
    assert not state["model.language_model.layers.2.self_attn.retention_gate.linear2.weight"].is_contiguous()
    # ---- F32 for --dtype BF16 / F16 ----
    f32 = {"model.layers.0.self_attn.retention_gate.linear1.weight": torch.randn(I, D) * 3,
           "model.layers.0.self_attn.retention_gate.linear1.bias": torch.randn(I),
           "model.layers.0.self_attn.retention_gate.linear2.weight": torch.randn(H, I),
           "model.layers.0.self_attn.retention_gate.bias": torch.tensor([1e5, -3.0])}
    # ---- WG-KV ----
    wg = {}
    for l in range(WL):
        p = "model.layers.%d.self_attn.g_predictors." % l
        wg[p + "pre_key_norm.weight"] = torch.randn(d)
        wg[p + "post_key_norm.weight"] = torch.randn(d)
        wg[p + "conv1.weight"] = torch.nn.Parameter(torch.randn(Hw * E, 2 * d, 1))  # named_parameters() values
        wg[p + "conv1.bias"] = torch.randn(Hw * E)
        wg[p + "conv2.weight"] = torch.randn(Hw, E, 1)
        wg[p + "conv2.bias"] = torch.randn(Hw)
    # ---- errors: a conv2.bias of the wrong shape ----
    wrong_conv2_bias = torch.randn(Hw + 1)
    return types.SimpleNamespace(state=state, f32=f32, wg=wg, wrong_conv2_bias=wrong_conv2_bias)


def test_trimkv_both_readers_write_the_same_file_and_cpp_gate_agrees(tensors, tmp_path, gate_forward):
    state, work = tensors.state, str(tmp_path)
    ckpt = os.path.join(work, "trimkv_weights.pth")
    torch.save(state, ckpt)
    out_torch, out_zip = os.path.join(work, "trimkv_torch.safetensors"), os.path.join(work, "trimkv_zip.safetensors")
    print(run("trimkv", ckpt, out_torch, "--reader", "torch").strip())
    print(run("trimkv", ckpt, out_zip, "--reader", "zip").strip())
    h1, d1 = read_safetensors(out_torch)
    h2, d2 = read_safetensors(out_zip)
    h1.pop("__metadata__"), h2.pop("__metadata__")
    assert h1 == h2 and d1 == d2, "the torch and zip readers wrote different files"
    assert all(v["dtype"] == "BF16" for v in h1.values()), h1
    assert sorted(h1) == sorted("model.layers.%d.self_attn.retention_gate.%s" % (l, f) for l in range(L)
                                for f in ("linear1.weight", "linear1.bias", "linear2.weight", "bias")), sorted(h1)

    x = torch.sin(0.37 * torch.arange(3 * D, dtype=torch.float32)).reshape(3, D)
    want = []
    for l in range(L):
        p = "model.language_model.layers.%d.self_attn.retention_gate." % l
        u = torch.nn.functional.silu(x @ state[p + "linear1.weight"].float().T + state[p + "linear1.bias"].float())
        z = u @ state[p + "linear2.weight"].float().T + state[p + "bias"].float()
        want += torch.nn.functional.logsigmoid(z).T.reshape(-1).tolist()  # [Hkv, T]
    got = subprocess.run([gate_forward, out_zip, str(L), str(D), str(H), str(I)], capture_output=True, text=True,
                         check=True)
    got = [float(v) for v in got.stdout.split()]
    assert len(got) == len(want), (len(got), len(want))
    worst = max(abs(a - b) / (1e-6 + abs(b)) for a, b in zip(got, want))
    assert worst < 1e-5, "C++ gate vs torch: relative error %g" % worst
    print("trimkv: %d log_beta values agree with torch (worst relative error %.2g)" % (len(got), worst))


def test_dtype_f32_widens_bf16_exactly(tensors, tmp_path):
    state, work = tensors.state, str(tmp_path)
    ckpt = os.path.join(work, "trimkv_weights.pth")
    torch.save(state, ckpt)
    out_f32 = os.path.join(work, "trimkv_f32.safetensors")
    run("trimkv", ckpt, out_f32, "--dtype", "F32")
    h3, d3 = read_safetensors(out_f32)
    name = "model.layers.1.self_attn.retention_gate.linear1.weight"
    b, e = h3[name]["data_offsets"]
    vals = struct.unpack("<%df" % (I * D), d3[b:e])
    ref = state["model.language_model.layers.1.self_attn.retention_gate.linear1.weight"].float().reshape(-1).tolist()
    assert list(vals) == ref


def test_dtype_bf16_rounds_as_torch_and_f16_refuses_overflow(tensors, tmp_path):
    # --dtype BF16 from F32 rounds to nearest even, as torch does; F16 refuses what it cannot hold
    f32, work = tensors.f32, str(tmp_path)
    f32_ckpt = os.path.join(work, "f32.pth")
    torch.save(f32, f32_ckpt)
    out_bf16 = os.path.join(work, "bf16.safetensors")
    run("trimkv", f32_ckpt, out_bf16, "--dtype", "BF16", "--reader", "zip")
    hb, db = read_safetensors(out_bf16)
    for name, t in f32.items():
        b, e = hb[name]["data_offsets"]
        assert db[b:e] == bytes(t.bfloat16().view(torch.int16).reshape(-1).tolist() and
                                b"".join(struct.pack("<h", v) for v in t.bfloat16().view(torch.int16).reshape(-1).tolist())), name
    msg = run("trimkv", f32_ckpt, os.path.join(work, "f16.safetensors"), "--dtype", "F16", ok=False)
    assert "does not fit in F16" in msg, msg
    print("dtypes: F32 -> BF16 bit-exact with torch, F16 overflow refused")


def test_wgkv_per_head_slices_of_the_grouped_convolutions(tensors, tmp_path):
    wg, work = tensors.wg, str(tmp_path)
    wckpt = os.path.join(work, "wgkv.pt")
    torch.save(wg, wckpt)
    for reader in ("torch", "zip"):
        out = os.path.join(work, "wgkv_%s.safetensors" % reader)
        print(run("wgkv", wckpt, out, "--reader", reader).strip())
        h, data = read_safetensors(out)
        for l in range(WL):
            src, dst = "model.layers.%d.self_attn.g_predictors." % l, "model.layers.%d.self_attn.write_gate." % l

            def tensor(name):
                b, e = h[dst + name]["data_offsets"]
                return torch.tensor(struct.unpack("<%df" % ((e - b) // 4), data[b:e])).reshape(h[dst + name]["shape"])

            assert h[dst + "w1.weight"]["shape"] == [Hw, E, 2 * d]
            for head in range(Hw):  # grouped conv: head h's rows E*h .. E*h+E-1
                assert torch.equal(tensor("w1.weight")[head], wg[src + "conv1.weight"].data[head * E:(head + 1) * E, :, 0])
                assert torch.equal(tensor("w2.weight")[head], wg[src + "conv2.weight"][head, :, 0])
            assert torch.equal(tensor("w1.bias").reshape(-1), wg[src + "conv1.bias"])
            assert torch.equal(tensor("pre_norm.weight"), wg[src + "pre_key_norm.weight"])
    print("wgkv: per-head slices of the grouped convolutions, both readers")


def test_missing_layer_and_wrong_shape_refused(tensors, tmp_path):
    work = str(tmp_path)
    state = dict(tensors.state)
    del state["model.language_model.layers.1.self_attn.retention_gate.bias"]
    ckpt = os.path.join(work, "trimkv_weights.pth")
    torch.save(state, ckpt)
    msg = run("trimkv", ckpt, os.path.join(work, "bad.safetensors"), ok=False)
    assert "layer 1 lacks bias" in msg, msg
    wg = dict(tensors.wg)
    wg["model.layers.1.self_attn.g_predictors.conv2.bias"] = tensors.wrong_conv2_bias
    wckpt = os.path.join(work, "wgkv.pt")
    torch.save(wg, wckpt)
    msg = run("wgkv", wckpt, os.path.join(work, "bad.safetensors"), "--reader", "zip", ok=False)
    assert "conv2.bias has shape [3]" in msg, msg
    print("errors: a missing layer and a wrong shape are refused")


def test_hostile_pickle_refused_by_torch_load(tmp_path):
    # a hostile pickle is refused by torch.load(weights_only=True) too, and runs nothing
    work = str(tmp_path)
    marker = os.path.join(work, "pwned_torch")

    class Exploit:
        def __reduce__(self):
            return (os.system, ("touch %s" % marker,))

    hostile = os.path.join(work, "hostile.pth")
    with zipfile.ZipFile(hostile, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"w": Exploit()}, protocol=2))
        z.writestr("archive/version", "3\n")
    run("trimkv", hostile, os.path.join(work, "x.safetensors"), "--reader", "torch", ok=False)
    assert not os.path.exists(marker), "torch.load ran the hostile pickle's command"
    print("hostile pickle: torch.load(weights_only=True) refused it, nothing executed")
