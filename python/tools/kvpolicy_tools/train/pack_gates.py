"""Packs a per-head retention gate and one trained for the token-level layout into one file (SPEC §8,
"Gate for the layout"): the first under SPEC's names, the second under the same names prefixed
`token_level.`. A cache in the token-level mode (kvpolicy-lm --mode union, kvpolicy-llama) reads the
second, the per-head mode the first, so a user passes one --gate either way.

  python -m kvpolicy_tools.train.pack_gates PER_HEAD TOKEN_LEVEL OUT

Both are retention gates' exports (kvpolicy-rank-gates, kvpolicy-train-gates): PER_HEAD of a kind the
policy reads (TRIM-KV: rg or rg10; DBTrimKV: rg10, SPEC §2), TOKEN_LEVEL rg or rg10 for either policy
(in that layout both rank positions by the max over every layer's heads, SPEC §8). OUT's metadata is
PER_HEAD's, with `token_level` holding TOKEN_LEVEL's as JSON.
Either may be a file that already holds both: PER_HEAD gives its per-head gate, TOKEN_LEVEL its
token-level one (so a new per-head gate can be packed with a committed file's token-level gate).
Refuses a file that is not a retention gate's export, and a PER_HEAD gate of a kind its policy (its
metadata's `policy`) does not read.
"""
import argparse
import json
import os

from safetensors import safe_open
from safetensors.torch import save_file

from kvpolicy_tools.train.gates import TOKEN_LEVEL, gate_file, holds_token_level_gate


def gate_tensors(path, token_level):
    """The tensors (under SPEC's names) and metadata of one of a file's gates: its token-level gate where
    token_level and the file holds one, else its per-head gate (an export that holds one gate serves as
    either)."""
    take_section = token_level and holds_token_level_gate(path)
    with safe_open(path, "pt") as f:
        tensors = {n[len(TOKEN_LEVEL):] if take_section else n: f.get_tensor(n) for n in f.keys()
                   if n.startswith(TOKEN_LEVEL) == take_section}
        meta = dict(f.metadata() or {})
    if take_section:
        meta = json.loads(meta.get("token_level", "{}"))
    meta.pop("token_level", None)
    return tensors, meta


def pack(per_head, token_level, out):
    kinds = []
    for path, section in ((per_head, False), (token_level, True)):
        try:  # a retention gate's export, or ValueError naming it
            kinds.append(gate_file(path, token_level=section and holds_token_level_gate(path))[0])
        except ValueError as e:
            raise SystemExit(f"pack_gates: {e}")
    (first, meta), (second, second_meta) = gate_tensors(per_head, False), gate_tensors(token_level, True)
    if meta.get("policy") == "dbtrimkv" and kinds[0] != "rg10":  # its global ranking reads tied gates (SPEC §2)
        raise SystemExit(f"pack_gates: {per_head} is DBTrimKV's gate and holds a {kinds[0]} gate; DBTrimKV's "
                         "per-head layout reads rg10 gates only")
    tensors = {**first, **{TOKEN_LEVEL + n: t for n, t in second.items()}}
    save_file(tensors, out + ".tmp", metadata={**meta, "token_level": json.dumps(second_meta, sort_keys=True)})
    os.replace(out + ".tmp", out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("per_head", help="the per-head gate's export")
    ap.add_argument("token_level", help="the export of the gate trained for the token-level layout")
    ap.add_argument("out")
    a = ap.parse_args()
    pack(a.per_head, a.token_level, a.out)


if __name__ == "__main__":
    main()
