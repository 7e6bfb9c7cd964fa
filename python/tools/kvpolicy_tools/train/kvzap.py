"""Trains KVzap's surrogate (SPEC §11) for a model: one linear map per layer from a token's attention
input (after the layer's input RMSNorm) to the log of its KVzip+ score in each kv head, written under
kvpress's KVzapModel names (`layers.{l}.weight` [Hkv, D], `layers.{l}.bias` [Hkv]), which the policy
`kvzap` reads as --gate and kvpress's KVzapPress loads.

Targets, as kvpress's kvzap/data.py makes them: the chat template holds the text as the user's turn
with "Repeat the previous context exactly." after it, and the text again as the assistant's; one
forward pass with eager attention; for the text's token k of layer l and kv head h,
  y = log max over the repeated copy's queries q and the group's query heads g of
      attn[g, q, k] * ||W_o,g v_k|| / ||x_q||          (floored at 1e-30 before the log)
The fit is kvpress's linear one (ridge regression, alpha 1, with an intercept), solved in closed
form from running sums (X^T X, X^T y, the means) that every text adds to: each target is computed
once, every token of a text is used, the sums are checkpointed after each text (a run resumes where
it stopped), and the fit takes a second whatever the number of texts.

Training text: the Debian handbook (kvpolicy_tools.data.corpus), cut into windows of --tokens
tokens; refused if it shares a 12-word span with an evaluation text (Debian's GPL-3 and the held-out
Python tutorial). Every --holdout-th window is held out and scored, never fitted: the run reports R^2
per layer on them.

Calibration: KVzap has no budget, so the thresholds that hold M entries per head on average are
found on the handbook's next 2,048 tokens (never fitted): as kvpolicy-lm runs them (16-token steps,
the entries held after each step averaged over the tokens), with a window of M/2, for each M of
--budgets; the file's metadata keeps them (`tau_m64`, ...), and kvpolicy-quality reads them there.

  kvpolicy-train-kvzap --out gates/smollm2-135m/kvzap.safetensors --texts 96
"""
import argparse
import json
import os
import time

os.environ.setdefault("TQDM_DISABLE", "1")

import numpy as np
import torch

REPEAT = "\n\nRepeat the previous context exactly."


def load(gguf):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()
    d, f = os.path.dirname(os.path.abspath(gguf)), os.path.basename(gguf)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32, attn_implementation="eager")
    return model.eval(), AutoTokenizer.from_pretrained(d, gguf_file=f)


def windows(tok, text, tokens, count):
    """The first `count` windows of `tokens` tokens of the text, as text."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    out = []
    for start in range(0, len(ids) - tokens, tokens):
        out.append(tok.decode(ids[start:start + tokens]).strip())
        if len(out) == count:
            break
    return out


def spans(tok, text):
    """ids of the templated repeat prompt, and the token ranges of the text and of its repetition."""
    chat = [{"role": "user", "content": text + REPEAT}, {"role": "assistant", "content": text}]
    full = tok.apply_chat_template(chat, tokenize=False)
    first = full.index(text)
    second = full.index(text, first + len(text))
    enc = tok(full, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]

    def inside(begin, end):
        idx = [i for i, (a, b) in enumerate(offsets) if a >= begin and b <= end and b > a]
        return idx[0], idx[-1] + 1

    return torch.tensor([enc["input_ids"]]), inside(first, first + len(text)), inside(second, second + len(text))


def run_hooked(model, ids, register):
    """The base model (no LM head) on ids with a hook on every layer's attention (`register(attn)`
    installs it and returns its handle), removed afterwards."""
    hooks = [register(layer.self_attn) for layer in model.model.layers]
    try:
        with torch.no_grad():
            model.model(input_ids=ids)
    finally:
        for h in hooks:
            h.remove()


def targets(model, ids, text_span, repeat_span):
    """X [L, C, D] (each text token's attention input) and y [L, C, Hkv] (log KVzip+), C = the text's tokens."""
    cfg = model.config
    Hq, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    G, d = Hq // Hkv, cfg.hidden_size // Hq
    sp, ep = text_span
    sr, er = repeat_span
    X, Y = {}, {}

    def hook(module, args, kwargs, output):
        hs = kwargs["hidden_states"][0]  # [S, D], after the input RMSNorm
        attn = output[1][0]  # [Hq, S, S]
        v = module.v_proj(hs[sp:ep]).view(ep - sp, Hkv, d)  # [C, Hkv, d]
        wo = module.o_proj.weight.view(cfg.hidden_size, Hq, d)  # [D, Hq, d]
        # ||W_o,g v_k|| for query head g and its kv head's value of each text token k: [Hq, C]
        contribution = torch.stack([(v[:, g // G] @ wo[:, g].T).norm(dim=-1) for g in range(Hq)])
        query_norm = hs[sr:er].norm(dim=-1)  # [R]
        s = attn[:, sr:er, sp:ep] / query_norm[None, :, None] * contribution[:, None, :]  # [Hq, R, C]
        s = s.amax(dim=1).view(Hkv, G, ep - sp).amax(dim=1)  # [Hkv, C]
        X[module.layer_idx] = hs[sp:ep].detach().clone()
        Y[module.layer_idx] = torch.log(s.clamp_min(1e-30)).T.detach().clone()  # an attention fp32 rounds to 0

    run_hooked(model, ids, lambda attn: attn.register_forward_hook(hook, with_kwargs=True))
    L = len(model.model.layers)
    if len(Y) != L:
        raise SystemExit("kvzap: the attention layers gave no weights (eager attention is needed)")
    return torch.stack([X[l] for l in range(L)]).double().numpy(), torch.stack([Y[l] for l in range(L)]).double().numpy()


class Sums:
    """Per layer: n, sum x, sum y, X^T X, X^T y, in double; saved and resumed as one .npz."""

    def __init__(self, L, D, H):
        self.done, self.n = 0, 0
        self.sx, self.sy = np.zeros((L, D)), np.zeros((L, H))
        self.xx, self.xy = np.zeros((L, D, D)), np.zeros((L, D, H))

    def add(self, X, Y):
        self.n += X.shape[1]
        self.sx += X.sum(axis=1)
        self.sy += Y.sum(axis=1)
        Xt = X.transpose(0, 2, 1)
        self.xx += Xt @ X  # BLAS, per layer
        self.xy += Xt @ Y

    def save(self, path):
        np.savez(path + ".tmp.npz", done=self.done, n=self.n, sx=self.sx, sy=self.sy, xx=self.xx, xy=self.xy)
        os.replace(path + ".tmp.npz", path)

    def load(self, path):
        z = np.load(path)
        self.done, self.n = int(z["done"]), int(z["n"])
        self.sx, self.sy, self.xx, self.xy = z["sx"], z["sy"], z["xx"], z["xy"]

    def fit(self, alpha):
        """Ridge with an intercept (sklearn's Ridge: the centred X and y, the intercept unpenalised):
        W [L, H, D], b [L, H]."""
        L, D = self.sx.shape
        mx, my = self.sx / self.n, self.sy / self.n
        W, b = [], []
        for l in range(L):
            cxx = self.xx[l] - self.n * np.outer(mx[l], mx[l])
            cxy = self.xy[l] - self.n * np.outer(mx[l], my[l])
            w = np.linalg.solve(cxx + alpha * np.eye(D), cxy)  # [D, H]
            W.append(w.T)
            b.append(my[l] - mx[l] @ w)
        return np.stack(W), np.stack(b)


def calibration_scores(model, tok, text, W, b, tokens=2048):
    """The surrogate's scores [L, H, T] on the first `tokens` tokens of `text`."""
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"][:tokens]])
    X = {}

    def hook(module, args, kwargs):
        X[module.layer_idx] = kwargs["hidden_states"][0].detach().double().numpy()

    run_hooked(model, ids, lambda attn: attn.register_forward_pre_hook(hook, with_kwargs=True))
    return np.stack([(X[l] @ W[l].T + b[l]).T for l in range(len(X))]).astype(np.float32)


def mean_held(scores, tau, window, step=16):
    """Entries held per head after each step of `step` tokens, token-weighted (kvpolicy-lm's average),
    under KVzap's rule: the `window` newest and every older entry scoring >= tau."""
    L, H, T = scores.shape
    above = np.cumsum(scores >= np.float32(tau), axis=-1).sum(axis=(0, 1)) / (L * H)  # [T]
    total = 0.0
    for n in range(step, T + 1, step):
        old = n - window
        total += step * (min(n, window) + (above[old - 1] if old > 0 else 0.0))
    return total / (T - T % step)


def tau_for(scores, m, window):
    """The tau whose mean_held is closest to m (bisection: mean_held falls as tau rises)."""
    lo, hi = float(scores.min()) - 1, float(scores.max()) + 1
    for _ in range(60):
        mid = (lo + hi) / 2
        if mean_held(scores, mid, window) > m:
            lo = mid
        else:
            hi = mid
    return hi


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default="build/train/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default="gates/smollm2-135m/kvzap.safetensors")
    ap.add_argument("--work", default="build/kvzap", help="the running sums and the held-out targets (resumable)")
    ap.add_argument("--texts", type=int, default=96, help="windows of the handbook, the held-out ones among them")
    ap.add_argument("--tokens", type=int, default=1000, help="tokens per window (kvpress: 750 to 1250)")
    ap.add_argument("--holdout", type=int, default=8, help="every N-th window is held out and scored")
    ap.add_argument("--alpha", type=float, default=1.0, help="ridge penalty (sklearn's Ridge default, as kvpress)")
    ap.add_argument("--budgets", default="64 128 256 512", help="M per head the thresholds are calibrated for")
    a = ap.parse_args()
    from safetensors.numpy import save_file

    from kvpolicy_tools.data import corpus

    model, tok = load(a.gguf)
    # the handbook's first part, which the windows come from (about 4 characters a token), is what is checked
    handbook = corpus.handbook_text()
    text = handbook[: a.texts * a.tokens * 6]
    corpus.check_disjoint(text, extra=[("the held-out Python tutorial", corpus.heldout_python_text())])
    cfg = model.config
    L, D, H = cfg.num_hidden_layers, cfg.hidden_size, cfg.num_key_value_heads
    os.makedirs(a.work, exist_ok=True)
    stamp = json.dumps({"gguf": os.path.basename(a.gguf), "tokens": a.tokens, "holdout": a.holdout})
    sums_path = os.path.join(a.work, "sums.npz")
    sums = Sums(L, D, H)
    held = {"X": [], "Y": []}
    if os.path.isfile(sums_path) and open(os.path.join(a.work, "stamp.json")).read() == stamp:
        sums.load(sums_path)
        for f in sorted(os.listdir(a.work)):
            if f.startswith("heldout-"):
                z = np.load(os.path.join(a.work, f))
                held["X"].append(z["X"])
                held["Y"].append(z["Y"])
        print(f"kvzap: resuming after {sums.done} windows ({sums.n} tokens fitted)")
    else:
        open(os.path.join(a.work, "stamp.json"), "w").write(stamp)
    texts = windows(tok, text, a.tokens, a.texts)
    if len(texts) < a.texts:
        raise SystemExit(f"kvzap: the handbook gives {len(texts)} windows of {a.tokens} tokens, fewer than --texts {a.texts}")
    for i in range(sums.done, a.texts):
        t0 = time.time()
        ids, text_span, repeat_span = spans(tok, texts[i])
        X, Y = targets(model, ids, text_span, repeat_span)
        if i % a.holdout == a.holdout - 1:
            np.savez(os.path.join(a.work, f"heldout-{i:05d}.npz"), X=X.astype(np.float32), Y=Y.astype(np.float32))
            held["X"].append(X.astype(np.float32))
            held["Y"].append(Y.astype(np.float32))
        else:
            sums.add(X, Y)
        sums.done = i + 1
        sums.save(sums_path)
        print(f"kvzap: window {i + 1}/{a.texts}: {ids.shape[1]} tokens, {X.shape[1]} targets, "
              f"{'held out' if i % a.holdout == a.holdout - 1 else 'fitted'}, {time.time() - t0:.1f} s", flush=True)
    W, b = sums.fit(a.alpha)
    if held["X"]:
        X = np.concatenate(held["X"], axis=1).astype(np.float64)
        Y = np.concatenate(held["Y"], axis=1).astype(np.float64)
        pred = X @ W.transpose(0, 2, 1) + b[:, None, :]
        r2 = 1 - ((pred - Y) ** 2).sum(axis=(1, 2)) / ((Y - Y.mean(axis=1, keepdims=True)) ** 2).sum(axis=(1, 2))
        print(f"kvzap: held out {X.shape[1]} tokens: R^2 per layer min {r2.min():.3f} mean {r2.mean():.3f} "
              f"max {r2.max():.3f}; targets mean {Y.mean():.2f}, 10/50/90% quantiles "
              + " / ".join(f"{q:.2f}" for q in np.quantile(Y, [0.1, 0.5, 0.9])))
    tensors = {}
    for l in range(L):
        tensors[f"layers.{l}.weight"] = np.ascontiguousarray(W[l], dtype=np.float32)
        tensors[f"layers.{l}.bias"] = np.ascontiguousarray(b[l], dtype=np.float32)
    meta = {"kvpolicy_surrogate": "kvzap-linear", "input_dim": str(D), "output_dim": str(H), "n_modules": str(L),
            "trained_on": f"debian-handbook, {sums.done} windows of {a.tokens} tokens ({sums.n} fitted)",
            "alpha": repr(a.alpha)}
    # the text after the windows' part: never fitted
    rest = handbook[len(tok.decode(tok(text, add_special_tokens=False)["input_ids"][: a.texts * a.tokens])):]
    corpus.check_disjoint(rest[:20000])
    scores = calibration_scores(model, tok, rest, W, b)
    for m in map(int, a.budgets.split()):
        tau = tau_for(scores, m, m // 2)
        meta[f"tau_m{m}"] = repr(tau)
        print(f"kvzap: M = {m}: tau {tau:.4f} holds {mean_held(scores, tau, m // 2):.1f} per head on average "
              f"(window {m // 2}) on the handbook's 2,048 calibration tokens")
    meta["calibration"] = "debian-handbook, the 2,048 tokens after the training windows; window M/2; 16-token steps"
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    save_file(tensors, a.out, metadata=meta)
    print(f"kvzap: wrote {a.out} ({L} layers, D = {D}, Hkv = {H}; fitted on {sums.n} tokens)")


if __name__ == "__main__":
    main()
