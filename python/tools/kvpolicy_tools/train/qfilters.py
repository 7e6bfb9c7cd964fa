"""Computes a model's Q-Filters (Godey et al. 2025): for each (layer, query head) the first right
singular vector v1 of the queries it computes on text (after RoPE, as the attention meets the
cached keys), signed so that the queries project on it positively on average; a kv head's filter is
the mean of its group's. Written as kvpress's QFilters state dict, `q_filters` [L, Hkv, d] holding
f = -v1+, so that kvpress's score -(f . k) and the policy `qfilter`'s (--gate) keep the keys the
queries lean towards: the paper's <k, v1+>. The queries are transformers', in RoPE's rotate-half
layout: the file says so (metadata rope_layout = half), and the policy reorders the filters for an
engine whose keys pair components adjacently (kvpolicy-lm, kvpolicy-llama).

v1 is the top eigenvector of Q^T Q, so each text only adds to running sums (Q^T Q and the sum of Q
per query head), checkpointed after each window: a run resumes where it stopped, every token of a
window counts, and the decomposition at the end takes a second whatever the number of windows.

Text: the Debian handbook's windows (kvpolicy_tools.data.corpus), refused if it shares a 12-word span
with an evaluation text (Debian's GPL-3 and the held-out Python tutorial).

  kvpolicy-train-qfilters --out gates/smollm2-135m/qfilter.safetensors --texts 32
"""
import argparse
import json
import os
import time

os.environ.setdefault("TQDM_DISABLE", "1")

import numpy as np
import torch

from kvpolicy_tools.train.kvzap import load, run_hooked, windows


def queries(model, ids):
    """Q [L, Hq, T, d]: every layer's queries on ids, after RoPE (positions 0 .. T-1)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    cfg = model.config
    Hq = cfg.num_attention_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // Hq
    T = ids.shape[1]
    position_ids = torch.arange(T)[None]
    out = {}

    def register(attn):
        def hook(module, args, kwargs):
            hs = kwargs["hidden_states"]  # [1, T, D], after the input RMSNorm
            q = module.q_proj(hs).view(1, T, Hq, d).transpose(1, 2)
            cos, sin = kwargs["position_embeddings"]
            q, _ = apply_rotary_pos_emb(q, q, cos, sin)
            out[module.layer_idx] = q[0].double()

        return attn.register_forward_pre_hook(hook, with_kwargs=True)

    run_hooked(model, ids, register)
    del position_ids
    return torch.stack([out[l] for l in range(cfg.num_hidden_layers)])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default="build/train/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default="gates/smollm2-135m/qfilter.safetensors")
    ap.add_argument("--work", default="build/qfilters", help="the running sums (resumable)")
    ap.add_argument("--texts", type=int, default=32, help="windows of the handbook")
    ap.add_argument("--tokens", type=int, default=1000, help="tokens per window")
    a = ap.parse_args()
    from safetensors.numpy import save_file

    from kvpolicy_tools.data import corpus

    model, tok = load(a.gguf)
    handbook = corpus.handbook_text()
    text = handbook[: a.texts * a.tokens * 6]
    corpus.check_disjoint(text, extra=[("the held-out Python tutorial", corpus.heldout_python_text())])
    cfg = model.config
    L, Hq, Hkv = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // Hq
    os.makedirs(a.work, exist_ok=True)
    stamp = json.dumps({"gguf": os.path.basename(a.gguf), "tokens": a.tokens})
    sums_path = os.path.join(a.work, "sums.npz")
    gram, total, n, done = np.zeros((L, Hq, d, d)), np.zeros((L, Hq, d)), 0, 0
    if os.path.isfile(sums_path) and open(os.path.join(a.work, "stamp.json")).read() == stamp:
        z = np.load(sums_path)
        gram, total, n, done = z["gram"], z["total"], int(z["n"]), int(z["done"])
        print(f"qfilters: resuming after {done} windows ({n} tokens)")
    else:
        open(os.path.join(a.work, "stamp.json"), "w").write(stamp)
    texts = windows(tok, text, a.tokens, a.texts)
    if len(texts) < a.texts:
        raise SystemExit(f"qfilters: the handbook gives {len(texts)} windows of {a.tokens} tokens, fewer than --texts {a.texts}")
    for i in range(done, a.texts):
        t0 = time.time()
        ids = tok(texts[i], return_tensors="pt")["input_ids"]
        with torch.no_grad():
            Q = queries(model, ids).numpy()  # [L, Hq, T, d]
        gram += np.einsum("lhti,lhtj->lhij", Q, Q)
        total += Q.sum(axis=2)
        n += Q.shape[2]
        done = i + 1
        np.savez(sums_path, gram=gram, total=total, n=n, done=done)
        print(f"qfilters: window {done}/{a.texts}: {Q.shape[2]} tokens, {time.time() - t0:.1f} s", flush=True)
    _, vectors = np.linalg.eigh(gram)  # ascending: the last column is v1
    v1 = vectors[..., -1]  # [L, Hq, d]
    v1 *= np.sign(np.einsum("lhd,lhd->lh", v1, total))[..., None]  # the queries' mean projection > 0
    mean_projection = np.einsum("lhd,lhd->lh", v1, total) / n
    f = -v1.reshape(L, Hkv, Hq // Hkv, d).mean(axis=2)
    print(f"qfilters: {n} tokens; the queries' mean projection on v1+ per head: min {mean_projection.min():.3f} "
          f"median {np.median(mean_projection):.3f}")
    meta = {"kvpolicy_filters": "q-filters", "trained_on": f"debian-handbook, {done} windows of {a.tokens} tokens ({n} tokens)",
            "convention": "q_filters = -mean over the group of v1+ (kvpress scores -(f . k))",
            "rope_layout": "half"}  # transformers' keys pair components (j, j + d/2); the policy reorders
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    save_file({"q_filters": np.ascontiguousarray(f, dtype=np.float32)}, a.out, metadata=meta)
    print(f"qfilters: wrote {a.out} (q_filters [{L}, {Hkv}, {d}])")


if __name__ == "__main__":
    main()
