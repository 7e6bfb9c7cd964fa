#!/usr/bin/env python3
"""The same survivors as NVIDIA kvpress on a real prompt: each kvpress press compresses a prompt
once, at its end, through SmolLM2-135M in transformers; kvpolicy's policy of the same name then
compresses the same keys and queries, recorded from that forward pass, in kvpolicy-replay (the
whole prompt as one step, so its eviction runs once, at the prompt's end). For each (layer, kv head)
the two sets of kept positions are compared.

  tools/kvpress-check.sh [--tokens 1024] [--keep 256]     (makes the venv build/kvpress, runs this)
  tools/kvpress-check.sh --engine python                  (kvpolicy's side through the Python package)

With --engine python the same keys, values and queries go through the Python package's
kvpolicy.Cache (pip install .) instead of kvpolicy-replay: one step of the whole prompt, declared as
the prompt, each policy by its registry name with the same options.

kvpress keeps n_kept = int(T * (1 - compression_ratio)) per head (per layer on average for AdaKV,
whose pruned entries are masked, not removed: its survivors are the entries not masked); the ratio
is chosen so that n_kept = --keep = kvpolicy's M. Where the two differ, the script reports whether
the press's scores at the boundary tie in fp32 (kvpress ranks with torch.topk, whose order among
equal scores is not documented; kvpolicy gives ties to the newer entry) or lie within 1e-6 of each
other (the two compute the same score in a different order: kvpress in fp32 from queries it
recomputes, kvpolicy in double). Exit status 1 if any differs otherwise.

Pairs: StreamingLLM (4 sinks), KNorm, KeyDiff, SnapKV (window 64, avg-pool 5), AdaKV over SnapKV
(alpha 0.2), PyramidKV (window 64, beta 3: each layer its own budget, averaging --keep), Expected
Attention (kvpress's defaults: 4 sinks, 512 future positions; kvpolicy told the model's RoPE), KVzip
at ratios 0.5 and 0.75 (kvzip_check: the chat template's header and the text as the prompt, kvpress's
repeat pass as kvpolicy-replay's --probe; with kvpolicy-replay only), KVzap at two thresholds
(kvzap_check: DMSPress over KVzapPress, both given the surrogate --kvzap; with kvpolicy-replay
only), and TOVA, whose kvpress press averages the last query's attention over every query head of the layer
while kvpolicy's averages over the kv head's query group (docs/policies.md): its row is reported,
not required to match.
"""
import argparse
import os

os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' loading bars
import subprocess
import sys
import tempfile

import numpy as np
import torch


def load(gguf):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from transformers.utils import logging

    logging.disable_progress_bar()
    d, f = os.path.dirname(os.path.abspath(gguf)), os.path.basename(gguf)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32, attn_implementation="sdpa")
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    return model.eval(), tok


def record_trace(model, ids, path):
    """Runs the prompt once and writes what each layer's attention saw (post-RoPE queries and keys,
    values, and its input after the input RMSNorm as gate_input) as a kvpolicy-replay trace."""
    from safetensors.numpy import save_file
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    seen = {}

    def recording(module, query, key, value, attention_mask, **kwargs):
        seen[module.layer_idx] = (query[0].detach().clone(), key[0].detach().clone(), value[0].detach().clone())
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    normed = {}

    def record_input(module, args, kwargs):
        normed[module.layer_idx] = kwargs["hidden_states"][0].detach().clone()

    AttentionInterface.register("kvpolicy_record", recording)
    model.set_attn_implementation("kvpolicy_record")
    hooks = [layer.self_attn.register_forward_pre_hook(record_input, with_kwargs=True) for layer in model.model.layers]
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for h in hooks:
            h.remove()
    model.set_attn_implementation("sdpa")
    L = len(seen)
    # C order: the query states are a transposed view, and safetensors writes memory as it lies
    q, k, v = (np.ascontiguousarray(np.stack([seen[l][i].numpy() for l in range(L)]), dtype=np.float32) for i in range(3))
    T = ids.shape[1]
    x = np.ascontiguousarray(np.stack([normed[l].numpy() for l in range(L)]), dtype=np.float32)
    save_file({"keys": k, "values": v, "queries": q, "log_beta": np.zeros((L, k.shape[1], T), np.float32),
               "gate_input": x}, path)
    return L, k.shape[1]


def rope_theta(config):
    """The model's RoPE base, where this transformers version keeps it."""
    rope = getattr(config, "rope_parameters", None) or {}
    return rope.get("rope_theta", getattr(config, "rope_theta", None))


def kvpress_survivors(model, ids, press, adakv):
    """kept[l][h] = set of positions kvpress keeps; scores[l] [Hkv, T] the press's scores (None for AdaKV)."""
    from kvpress.presses.scorer_press import ScorerPress

    scores = {}
    inner = press.press if adakv else press
    original = type(inner).score

    def scoring(self, module, *args, **kwargs):
        s = original(self, module, *args, **kwargs)
        scores[module.layer_idx] = s[0].detach().float().clone()
        return s

    type(inner).score = scoring
    try:
        with torch.no_grad(), press(model):
            model(ids)
    finally:
        type(inner).score = original
    T = ids.shape[1]
    kept = {}
    for layer in model.model.layers:
        l = layer.self_attn.layer_idx
        s = scores[l]
        H = s.shape[0]
        if adakv:
            keep = np.ones((H, T), bool)
            _, heads, seq = layer.self_attn.masked_key_indices
            keep[heads.numpy(), seq.numpy()] = False
        else:
            assert isinstance(inner, ScorerPress)
            # PyramidKV's budget is the layer's own (its get_layer_budget); every other press keeps one n_kept
            n_kept = press.get_layer_budget(layer.self_attn, T) if hasattr(press, "get_layer_budget") \
                else int(T * (1 - press.compression_ratio))
            idx = s.topk(n_kept, dim=-1).indices.numpy()
            keep = np.zeros((H, T), bool)
            np.put_along_axis(keep, idx, True, axis=-1)
        kept[l] = keep
    return kept, scores


def kvpolicy_survivors(replay, trace, policy, args, out):
    p = subprocess.run([replay, "--trace", trace, "--policy", policy, "--no-reference", "--out", out] + args,
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"kvpress_survivors: kvpolicy-replay failed: {p.stderr}")
    from safetensors.numpy import load_file

    return load_file(out)["evicted_at"] == -1  # [L, Hkv, T]


def kvpolicy_survivors_python(trace, policy, args):
    """The same as kvpolicy_survivors, through the Python package: kept [L, Hkv, T]."""
    import kvpolicy
    from safetensors.numpy import load_file

    t = load_file(trace)
    k, v, q = t["keys"], t["values"], t["queries"]
    L, H, T, d = k.shape
    options = {args[i][2:].replace("-", "_"): args[i + 1] for i in range(0, len(args), 2) if args[i] != "--prefill"}
    cache = kvpolicy.Cache(policy, layers=L, kv_heads=H, q_heads=q.shape[1], head_dim=d, max_tokens=T + 16, **options)
    cache.add_sequence(0, prompt_tokens=T)
    cache.step(0, k, v, queries=q)
    kept = np.zeros((L, H, T), bool)
    for l in range(L):
        for h in range(H):
            kept[l, h, cache.entries(0, l, h)["position"]] = True
    return kept


def kvzip_check(model, tok, text_ids, a, tmp, ratios=(0.5, 0.75)):
    """KVzip (SPEC §10) against kvpress's KVzipPress: the prompt is the chat template's header and the
    text (as kvpress's pipeline builds it), kvpress runs its repeat pass after the prefill; kvpolicy
    replays a trace of the prompt followed by the same repeat tokens, the prompt as --prefill and
    the repeat tokens as the --probe. KVzip selects over every layer and head at once, so where the
    kept sets differ the entries that differ are explained together. Returns whether any differs
    otherwise."""
    import types

    import kvpress.presses.kvzip_press as kvzip_module
    from kvpress import KVzipPress
    from transformers import DynamicCache

    # kvpress loads the tokenizer by the model's name; this model is a local GGUF
    kvzip_module.AutoTokenizer = types.SimpleNamespace(from_pretrained=lambda *args, **kwargs: tok)
    dummy, separator = "dummy context", "\n" + "#" * len("dummy context")
    templated = tok.apply_chat_template([{"role": "user", "content": dummy + separator}], add_generation_prompt=True,
                                        tokenize=False, enable_thinking=False)
    head, suffix = templated.split(separator)
    prefix_ids = tok.encode(head.split(dummy)[0], add_special_tokens=False)
    suffix_ids = tok.encode(suffix, add_special_tokens=False)
    P = len(prefix_ids)
    ids = torch.tensor([prefix_ids + text_ids[: a.tokens - P]])
    T = ids.shape[1]
    # the probe: kvpress's first chunk's instruction, the template's assistant header, the text again
    probe = tok.encode("\n\nRepeat the previous context exactly.", add_special_tokens=False) + suffix_ids + ids[0, P:].tolist()
    trace = os.path.join(tmp, "kvzip-trace.safetensors")
    L, H = record_trace(model, torch.tensor([ids[0].tolist() + probe]), trace)
    print(f"\nKVzip: {T} tokens ({P} of them the chat template's header), a probe of {len(probe)} tokens; kvpress's "
          f"chunk_size {T} (one chunk)")
    print(f"{'ratio':<20}{'heads equal':>12}{'entries differ':>16}{'at a tie':>10}{'near-tie':>10}{'other':>8}")
    failed = False
    for ratio in ratios:
        press = KVzipPress(compression_ratio=ratio, chunk_size=T)
        scores = {}
        original_post = KVzipPress.compress_post

        def keeping_scores(self, m):
            scores["val"] = self.score_val[:, 0].detach().float().clone()  # [L, Hkv, T], before the sinks' raise
            return original_post(self, m)

        KVzipPress.compress_post = keeping_scores
        try:
            with torch.no_grad(), press(model):
                model(input_ids=ids, past_key_values=DynamicCache(config=model.config))
        finally:
            KVzipPress.compress_post = original_post
        theirs = np.ones((L, H, T), bool)
        for layer in model.model.layers:
            attn = layer.self_attn
            _, heads, seq = attn.masked_key_indices
            theirs[attn.layer_idx, heads.numpy(), seq.numpy()] = False
            attn.masked_key_indices = None
        args = ["--prefill", str(T), "--probe", str(len(probe)), "--ratio", repr(ratio), "--prefix", str(P)]
        ours = kvpolicy_survivors(a.replay, trace, "kvzip", args, os.path.join(tmp, "kvzip.safetensors"))[:, :, :T]
        equal = sum(np.array_equal(ours[l, h], theirs[l, h]) for l in range(L) for h in range(H))
        differ = int((ours != theirs).sum())
        why = {"tie": 0, "near-tie": 0, "differs": 0}
        if differ:
            score = scores["val"].numpy()
            score[..., :4] = np.inf  # the sinks, which both keep last
            why[explain(torch.from_numpy(score), ours, theirs)] += 1
        print(f"{ratio:<20}{equal:>8} / {L * H:<3}{differ:>16}{why['tie']:>10}{why['near-tie']:>10}{why['differs']:>8}")
        failed = failed or why["differs"] > 0
    return failed


def qfilter_press(path, ratio):
    """kvpress's QFilterPress given the filters of the file at `path` (q_filters [L, Hkv, d], as
    kvpolicy-train-qfilters writes them and the policy qfilter reads them) instead of the Hub's."""
    from kvpress import QFilterPress
    from safetensors.torch import load_file

    filters = load_file(path)["q_filters"]

    class GivenFilters(QFilterPress):
        def post_init_from_model(self, model):
            self.q_filters = filters.to(model.dtype)

    return GivenFilters(compression_ratio=ratio)


def kvzap_check(model, ids, a, tmp, trace, taus=(-4.0, -1.5)):
    """KVzap (SPEC §11) against kvpress's DMSPress(KVzapPress) given the same surrogate (--kvzap, a
    file kvpolicy-train-kvzap wrote, loaded into kvpress's KVzapModel): kvpress masks, in its
    prefill, every entry before the last 128 whose score is < tau; kvpolicy-replay runs the policy
    on the recorded attention inputs, the prompt as one step. Where a head differs, the entries
    that differ are explained by the score kvpress computed (a score within 1e-5 of tau is a near
    tie: the two surrogates sum the same products in a different order). Returns whether any
    differs otherwise."""
    from kvpress import DMSPress, KVzapPress
    from kvpress.presses.kvzap_press import KVzapConfig, KVzapModel
    from safetensors.torch import load_file

    weights = load_file(a.kvzap)
    L = len(model.model.layers)
    H, D = weights["layers.0.weight"].shape
    surrogate = KVzapModel(KVzapConfig(input_dim=D, output_dim=H, n_modules=L)).eval()
    surrogate.load_state_dict(weights)
    T = ids.shape[1]
    print(f"\nKVzap: {T} tokens, the surrogate {os.path.basename(a.kvzap)} (linear), window 128")
    print(f"{'tau':<20}{'heads equal':>12}{'entries differ':>16}{'near-tau':>10}{'other':>8}{'kept':>10}")
    failed = False
    for tau in taus:
        press = KVzapPress(model_type="linear")
        press.post_init_from_model = lambda model: None  # the surrogate is given, not fetched by the model's name
        press.kvzap_model = surrogate
        dms = DMSPress(press=press, threshold=tau, sliding_window_size=128)
        scores = {}
        original = KVzapPress.score

        def keeping(self, module, hidden_states, *args):
            s = original(self, module, hidden_states, *args)
            scores[module.layer_idx] = s[0].detach().clone()
            return s

        KVzapPress.score = keeping
        try:
            with torch.no_grad(), dms(model):
                model(ids)
        finally:
            KVzapPress.score = original
        theirs = np.ones((L, H, T), bool)
        for layer in model.model.layers:
            attn = layer.self_attn
            if attn.masked_key_indices is not None:
                _, heads, seq = attn.masked_key_indices
                theirs[attn.layer_idx, heads.numpy(), seq.numpy()] = False
            attn.masked_key_indices = None
        args = ["--prefill", str(T), "--gate", a.kvzap, "--tau", repr(tau)]
        ours = kvpolicy_survivors(a.replay, trace, "kvzap", args, os.path.join(tmp, "kvzap.safetensors"))
        equal = sum(np.array_equal(ours[l, h], theirs[l, h]) for l in range(L) for h in range(H))
        differ = ours != theirs
        score = np.stack([scores[l].numpy() for l in range(L)])
        near = int((differ & (np.abs(score - tau) <= 1e-5)).sum())
        other = int(differ.sum()) - near
        print(f"{tau:<20}{equal:>8} / {L * H:<3}{int(differ.sum()):>16}{near:>10}{other:>8}{ours.mean():>10.3f}")
        failed = failed or other > 0
    return failed


def explain(score, ours, theirs):
    """For entries whose fate differs (one head, or a whole layer for AdaKV's pooled choice): do the
    ones only kvpolicy keeps score what the ones only kvpress keeps score (a tie), or within 1e-6?"""
    score = score.numpy()
    a, b = score[ours & ~theirs], score[theirs & ~ours]
    if np.array_equal(np.sort(a), np.sort(b)):
        return "tie"
    if np.allclose(np.sort(a), np.sort(b), rtol=1e-6, atol=1e-9):
        return "near-tie"
    return "differs"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default="build/train/SmolLM2-135M-Instruct.Q4_1.gguf", help="default: %(default)s, from the repository's root")
    ap.add_argument("--replay", default="build/default/apps/kvpolicy-replay")
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--keep", type=int, default=256, help="n_kept of kvpress, M of kvpolicy")
    ap.add_argument("--kvzap", default="gates/smollm2-135m/kvzap.safetensors",
                    help="KVzap's surrogate, given to both sides (kvpolicy-train-kvzap writes it); none: no KVzap check")
    ap.add_argument("--qfilter", default="gates/smollm2-135m/qfilter.safetensors",
                    help="Q-Filters' filters, given to both sides (kvpolicy-train-qfilters writes them); none: not checked")
    ap.add_argument("--engine", choices=["replay", "python"], default="replay",
                    help="kvpolicy's side: kvpolicy-replay, or the Python package's Cache")
    a = ap.parse_args()
    from kvpress import (AdaKVPress, ExpectedAttentionPress, KeyDiffPress, KnormPress, PyramidKVPress, SnapKVPress,
                         StreamingLLMPress, TOVAPress)

    torch.manual_seed(0)
    model, tok = load(a.gguf)
    ids = torch.tensor([tok(open(a.text).read())["input_ids"][: a.tokens]])
    T, M = ids.shape[1], a.keep
    ratio = (T - M - 0.5) / T  # int(T * (1 - ratio)) == M
    assert int(T * (1 - ratio)) == M
    per_head = ["--prefill", str(T), "--budget", str(M), "--buffer", "1"]
    window = ["--prefill", str(T), "--budget", str(M), "--window", "64"]
    pairs = [
        ("streamingllm", StreamingLLMPress(compression_ratio=ratio, n_sink=4), False, per_head + ["--sinks", "4"], True),
        ("knorm", KnormPress(compression_ratio=ratio), False, per_head, True),
        ("keydiff", KeyDiffPress(compression_ratio=ratio), False, per_head, True),
        ("snapkv", SnapKVPress(compression_ratio=ratio, window_size=64, kernel_size=5), False, window, True),
        ("adakv", AdaKVPress(SnapKVPress(compression_ratio=ratio, window_size=64, kernel_size=5), alpha_safeguard=0.2),
         True, window + ["--safeguard", "0.2"], True),
        # the layers' budgets average T * (1 - ratio) = M; beta 3 keeps the last layer's (M / 3) above the window
        ("pyramidkv", PyramidKVPress(compression_ratio=1 - M / T, window_size=64, kernel_size=5, beta=3), False,
         window + ["--beta", "3"], True),
        ("tova", TOVAPress(compression_ratio=ratio), False, per_head + ["--window", "1"], False),
        # kvpress computes the queries before RoPE itself; kvpolicy rotates the recorded ones back by the model's RoPE
        ("expected-attention", ExpectedAttentionPress(compression_ratio=ratio), False,
         ["--prefill", str(T), "--budget", str(M), "--rope-theta", repr(float(rope_theta(model.config))),
          "--rope-layout", "half"], True),
    ]
    # the replay engine only: the Python package's side here steps without the scores a gated policy needs
    if a.engine == "replay" and a.qfilter and os.path.isfile(a.qfilter):
        pairs.append(("qfilter", qfilter_press(a.qfilter, ratio), False, per_head + ["--gate", a.qfilter], True))
    elif a.engine == "replay" and a.qfilter:
        print(f"Q-Filters: no filters at {a.qfilter}: not checked")
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.safetensors")
        L, H = record_trace(model, ids, trace)
        print(f"SmolLM2-135M, {T} tokens of {os.path.basename(a.text)}, keep {M} per head; {L} layers x {H} kv heads; "
              f"kvpolicy through {'kvpolicy-replay' if a.engine == 'replay' else 'the Python package'}")
        print(f"{'policy':<20}{'heads equal':>12}{'entries differ':>16}{'at a tie':>10}{'near-tie':>10}{'other':>8}")
        for name, press, adakv, args, required in pairs:
            theirs, scores = kvpress_survivors(model, ids, press, adakv)
            ours = kvpolicy_survivors(a.replay, trace, name, args, os.path.join(tmp, name + ".safetensors")) \
                if a.engine == "replay" else kvpolicy_survivors_python(trace, name, args)
            equal, differ, why = 0, 0, {"tie": 0, "near-tie": 0, "differs": 0}
            for l in range(L):
                equal += sum(np.array_equal(ours[l, h], theirs[l][h]) for h in range(H))
                differ += int((ours[l] != theirs[l]).sum())
                # AdaKV chooses across a layer's heads: a difference is explained per layer
                units = [(ours[l], theirs[l], scores[l])] if adakv else \
                    [(ours[l, h], theirs[l][h], scores[l][h]) for h in range(H)]
                for o, t, s in units:
                    if not np.array_equal(o, t):
                        why[explain(s, o, t)] += 1
            print(f"{name:<20}{equal:>8} / {L * H:<3}{differ:>16}{why['tie']:>10}{why['near-tie']:>10}{why['differs']:>8}"
                  + ("" if required else "   (kvpress averages over every head of the layer)"))
            failed = failed or (required and why["differs"] > 0)
        if a.engine == "replay":  # the probe is kvpolicy-replay's --probe; the Python package's comes with its engine
            failed = kvzip_check(model, tok, tok(open(a.text).read())["input_ids"], a, tmp) or failed
            if a.kvzap and os.path.isfile(a.kvzap):
                failed = kvzap_check(model, ids, a, tmp, trace) or failed
            elif a.kvzap:
                print(f"\nKVzap: no surrogate at {a.kvzap}: not checked")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
