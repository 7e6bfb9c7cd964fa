"""Test of kvpolicy-convert-checkpoint (kvpolicy_tools.convert.convert_checkpoint) without torch (it runs in CI), on the committed fixtures
(tests/converter/fixtures/, written once with real torch.save by make_fixtures.py, which says how):
  - every fixture converts with the standard-library reader, and each written tensor has the name,
    dtype, shape and bytes (SHA-256) expected.json gives;
  - the C++ loaders (gate_forward: TRIM-KV's gate and DBTrimKV's rg10) compute from the converted
    files the log_beta torch computed from the checkpoints, within 1e-5;
  - a DBTrimKV checkpoint whose tied readout differs in one layer is refused, naming the layer, and
    the wrong kind for a checkpoint is refused;
  - a crafted pickle that calls a function (os.system) is refused with a clear error, by the
    standard-library reader and by the C++-free path alike, and executes nothing.
usage: KVPOLICY_GATE_FORWARD=build/default/tests/gate_forward PYTHONPATH=$PWD/python/tools \
         python3 -m pytest -q -p no:cacheprovider tests/converter/test_convert_fixtures.py
       (ctest sets both; each test works in its own pytest tmp_path)
"""
import hashlib
import io
import json
import os
import pickle
import struct
import subprocess
import sys
import zipfile

import pytest

converter = "kvpolicy_tools.convert.convert_checkpoint"  # kvpolicy-convert-checkpoint
fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
with open(os.path.join(fixtures, "expected.json")) as f:
    expected = json.load(f)


def run(work, *args, ok=True):
    p = subprocess.run([sys.executable, "-m", converter, *args], capture_output=True, text=True, cwd=work)
    assert (p.returncode == 0) == ok, "converter %s: rc %d\n%s%s" % (args, p.returncode, p.stdout, p.stderr)
    return p.stdout + p.stderr


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    return header, blob[8 + n:]


# ---- the fixtures convert to exactly what torch said ----
@pytest.mark.parametrize("name", sorted(n for n in expected if not n.startswith("_")))
def test_fixture_converts_to_what_torch_wrote(name, tmp_path, gate_forward):
    want = expected[name]
    work = str(tmp_path)
    out = os.path.join(work, name + ".safetensors")
    msg = run(work, want["kind"], os.path.join(fixtures, name), out, "--reader", "zip")
    assert "%d other keys ignored" % want["ignored"] in msg, msg
    header, data = read_safetensors(out)
    assert sorted(header) == sorted(want["tensors"]), (name, sorted(header))
    for tensor, w in want["tensors"].items():
        b, e = header[tensor]["data_offsets"]
        got = {"dtype": header[tensor]["dtype"], "shape": header[tensor]["shape"],
               "sha256": hashlib.sha256(data[b:e]).hexdigest()}
        assert got == w, "%s: %s is %s, expected %s" % (name, tensor, got, w)
    if "log_beta" in want:
        L, D, H, I = want["dims"]
        p = subprocess.run([gate_forward, want["kind"], out, str(L), str(D), str(H), str(I)], capture_output=True,
                           text=True)
        assert p.returncode == 0, p.stderr
        got = [float(v) for v in p.stdout.split()]
        assert len(got) == len(want["log_beta"]), (len(got), len(want["log_beta"]))
        worst = max(abs(a - b) / (1e-6 + abs(b)) for a, b in zip(got, want["log_beta"]))
        assert worst < 1e-5, "%s: C++ gate vs torch: relative error %g" % (name, worst)
        print("%s: %d tensors as torch wrote them; %d log_beta agree with torch (worst relative error %.2g)"
              % (name, len(header), len(got), worst))
    else:
        print("%s: %d tensors as torch wrote them" % (name, len(header)))


# ---- a tied readout edited in one layer; the wrong kind ----
def rewrite(src, dst, edit):
    """A copy of a torch zip checkpoint with one storage file changed by edit(name, bytes)."""
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as b:
        for info in a.infolist():
            b.writestr(info, edit(info.filename, a.read(info.filename)))


def storage_of(path, key):
    """The storage file a key's tensor lives in (by unpickling with a recorder, no torch)."""
    class Recorder(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
                return lambda storage, *rest: storage
            if module == "torch" and name.endswith("Storage"):
                return name
            if (module, name) == ("collections", "OrderedDict"):
                return dict
            raise pickle.UnpicklingError("%s.%s" % (module, name))

        def persistent_load(self, pid):
            return pid[2]

    with zipfile.ZipFile(path) as a:
        pkl = [n for n in a.namelist() if n.endswith("data.pkl")][0]
        return pkl[: -len("data.pkl")] + "data/" + Recorder(io.BytesIO(a.read(pkl))).load()[key]


def test_edited_tied_copy_and_wrong_kind_refused(tmp_path):
    work = str(tmp_path)
    rg10 = os.path.join(fixtures, "dbtrimkv_rg10.pth")
    target = storage_of(rg10, "model.layers.2.self_attn.retention_gate.linear3.weight")
    edited = os.path.join(work, "edited_rg10.pth")
    rewrite(rg10, edited, lambda n, b: b[:-1] + bytes([b[-1] ^ 1]) if n == target else b)
    msg = run(work, "dbtrimkv", edited, os.path.join(work, "x.safetensors"), "--reader", "zip", ok=False)
    assert "layer 2's linear3.weight differs from layer 0's" in msg, msg
    msg = run(work, "trimkv", rg10, os.path.join(work, "x.safetensors"), "--reader", "zip", ok=False)
    assert "unexpected gate parameter" in msg and "linear2.bias" in msg, msg
    msg = run(work, "dbtrimkv", os.path.join(fixtures, "trimkv_weights.pth"), os.path.join(work, "x.safetensors"),
              "--reader", "zip", ok=False)
    assert "layer 0 lacks linear2.bias, linear3.weight" in msg, msg
    assert not os.path.exists(os.path.join(work, "x.safetensors")), "a refused conversion wrote its output"
    print("errors: an edited tied copy names its layer; the wrong kind is refused")


# ---- a hostile pickle: data.pkl calls os.system when unpickled by a trusting reader ----
def test_hostile_pickle_refused_and_nothing_executed(tmp_path):
    work = str(tmp_path)
    marker = os.path.join(work, "pwned")
    if os.path.exists(marker):
        os.remove(marker)

    class Exploit:
        def __reduce__(self):
            return (os.system, ("touch %s" % marker,))

    hostile = os.path.join(work, "hostile.pth")
    with zipfile.ZipFile(hostile, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"model.layers.0.self_attn.retention_gate.bias": Exploit()},
                                                    protocol=2))
        z.writestr("archive/version", "3\n")
    for kind in ("trimkv", "dbtrimkv", "wgkv"):
        msg = run(work, kind, hostile, os.path.join(work, "x.safetensors"), "--reader", "zip", ok=False)
        assert "unsupported object" in msg and "system" in msg, msg
    assert not os.path.exists(marker), "the hostile pickle ran its command"
    assert not os.path.exists(os.path.join(work, "x.safetensors")), "a refused conversion wrote its output"
    print("hostile pickle: refused (%s), nothing executed" % msg.strip().split(": ", 2)[-1])
