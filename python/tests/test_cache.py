"""kvpolicy's Python package against the library's own semantics:
- kvpolicy.__version__ is the installed distribution's version (CMakeLists.txt's project() line);
- the registry as Python sees it: every policy, its options and defaults;
- a StreamingLLM cache keeps exactly the sinks and the newest entries (SPEC §5), step by step, and
  its attention equals a float64 softmax over what it keeps;
- step() and append/attend/commit give the same cache and outputs; step_batch() those of step();
- every policy runs a stream of steps (with its inputs: scores for the learned ones), from NumPy
  and from CPU torch tensors without a copy;
- bad input (dtype, shape, layout, device, NaN, unknown sequence or option) raises kvpolicy.Error
  naming the value, and the cache is unchanged;
- the GIL is released during a step (two threads step two sequences of one cache).
"""
import importlib.metadata
import threading

import numpy as np
import pytest

import kvpolicy

SHAPE = dict(layers=2, kv_heads=2, q_heads=4, head_dim=16)
L, H, HQ, D = SHAPE["layers"], SHAPE["kv_heads"], SHAPE["q_heads"], SHAPE["head_dim"]


def rand(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def held(cache, seq):
    """Every head's positions, sorted: what the cache holds."""
    return [[sorted(cache.entries(seq, l, h)["position"].tolist()) for h in range(H)] for l in range(L)]


def reference_attention(q, keys, values):
    """float64 softmax(q k^T / sqrt(d)) v over the keys a head holds: q [G, d], keys/values [n, d]."""
    s = (q.astype(np.float64) @ keys.astype(np.float64).T) / np.sqrt(D)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return p @ values.astype(np.float64)


def test_version_is_the_installed_distributions():
    assert kvpolicy.__version__ == importlib.metadata.version("kvpolicy")
    assert all(part.isdigit() for part in kvpolicy.__version__.split("."))


def test_registry_lists_every_policy_with_its_options():
    p = kvpolicy.policies()
    for name in ("full", "trimkv", "dbtrimkv", "wgkv", "epikv", "streamingllm", "h2o", "snapkv", "tova", "adakv"):
        assert name in p
    assert p["trimkv"]["inputs"] == "retention_gate"
    assert (p["trimkv"]["scores"], p["trimkv"]["gated"], p["trimkv"]["probes"]) == ("log_beta", True, False)
    assert (p["wgkv"]["scores"], p["kvzip"]["probes"], p["h2o"]["scores"]) == ("gate", True, "none")
    assert p["trimkv"]["options"]["budget"]["default"] == 1024
    assert p["snapkv"]["options"]["pool"]["choices"] == ["avg", "max"]
    assert p["snapkv"]["needs_prompt_length"] is True
    assert all(isinstance(v["help"], str) and v["help"] for v in p.values())


def test_streamingllm_keeps_the_sinks_and_the_newest_and_attends_over_them():
    M, B, S = 8, 2, 2
    cache = kvpolicy.Cache("streamingllm", **SHAPE, max_tokens=64, budget=M, buffer=B, sinks=S)
    cache.add_sequence(7)
    rng = np.random.default_rng(1)
    n = 0
    for step in range(40):
        T = 5 if step == 0 else 1
        k, v, q = rand(rng, L, H, T, D), rand(rng, L, H, T, D), rand(rng, L, HQ, T, D)
        report = cache.step(7, k, v, queries=q, return_evicted=True)
        n += T
        # attention over what each head held once this step's entries were in (before eviction): check
        # the last query of the step against the float64 reference over the held entries after commit
        # only when nothing was evicted (then the two sets agree)
        if report.evicted == 0:
            for l in range(L):
                for h in range(H):
                    e = cache.entries(7, l, h)
                    got = report.out[l, h * (HQ // H):(h + 1) * (HQ // H), T - 1]
                    want = reference_attention(q[l, h * (HQ // H):(h + 1) * (HQ // H), T - 1], e["keys"], e["values"])
                    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        length = n if n < M + B else None
        for heads in held(cache, 7):
            for positions in heads:
                if length is not None:
                    assert positions == list(range(n))
                else:  # after the first eviction: S sinks and the newest, between M and M + B - 1 entries
                    assert positions[:S] == list(range(S))
                    newest = positions[S:]
                    assert newest == list(range(n - len(newest), n))
                    assert M <= len(positions) < M + B
        if report.evicted:
            assert report.triggered
            assert report.evicted_entries.shape == (report.evicted, 3)
    assert cache.tokens(7) == n
    assert cache.total_length(7) == sum(len(p) for heads in held(cache, 7) for p in heads)


def test_layer_by_layer_equals_one_step_and_the_batch_equals_each_step():
    rng = np.random.default_rng(2)
    kw = dict(**SHAPE, max_tokens=64, max_sequences=2, budget=6, buffer=3)
    a, b, c = (kvpolicy.Cache("h2o", **kw) for _ in range(3))
    for cache in (a, b, c):
        cache.add_sequence(0)
        cache.add_sequence(1)
    for step in range(25):
        T = 4 if step == 0 else 1
        steps = []
        for seq in (0, 1):
            k, v, q = rand(rng, L, H, T, D), rand(rng, L, H, T, D), rand(rng, L, HQ, T, D)
            ra = a.step(seq, k, v, queries=q)
            outs = []
            for l in range(L):
                b.append(seq, l, k[l], v[l])
                outs.append(b.attend(seq, l, q[l]))
            rb = b.commit(seq)
            np.testing.assert_array_equal(ra.out, np.stack(outs))
            assert (ra.triggered, ra.evicted) == (rb.triggered, rb.evicted)
            steps.append(dict(seq=seq, keys=k, values=v, queries=q))
        rc = c.step_batch(steps)
        assert len(rc) == 2
        for seq in (0, 1):
            assert held(a, seq) == held(b, seq) == held(c, seq)
            np.testing.assert_array_equal(a.entries(seq, 1, 1)["attention_mass"], c.entries(seq, 1, 1)["attention_mass"])


def inputs_for(info, rng, T):
    """The scores a policy's entries need, by what its input source writes (info["scores"]): log
    beta in (-inf, 0], g in [0, 1], or a frozen score (any real: around KVzap's tau)."""
    kind = info["scores"]
    if kind == "log_beta":
        return -rng.uniform(0, 0.2, (L, H, T)).astype(np.float32)
    if kind == "gate":
        return rng.uniform(0, 1, (L, H, T)).astype(np.float32)
    if kind == "score":
        return rng.normal(-6, 2, (L, H, T)).astype(np.float32)
    return None


@pytest.mark.parametrize("name", sorted(kvpolicy.policies()))
def test_every_policy_runs_and_holds_what_it_reports(name):
    info = kvpolicy.policies()[name]
    opts = {k: 6 for k in ("budget",) if k in info["options"]}
    if "buffer" in info["options"]:
        opts["buffer"] = 2
    if "local" in info["options"]:
        opts["local"] = 4
    if "window" in info["options"] and info["options"]["window"]["default"] > 6:
        opts["window"] = 4  # a window longer than the budget (KVzap's 128) would keep all 41 tokens
    cache = kvpolicy.Cache(name, **SHAPE, max_tokens=64, **opts)
    rng = np.random.default_rng(3)
    cache.add_sequence(0, prompt_tokens=12 if info["needs_prompt_length"] else -1)
    evicted, added = 0, 0
    probe = info["probes"]  # KVzip: a probe step after the prompt (SPEC §10)
    for step in range(30):
        probing = probe and step == 1
        T = 12 if step == 0 else 8 if probing else 1
        if probing:
            cache.open_probe(0)
        k, v, q = rand(rng, L, H, T, D), rand(rng, L, H, T, D), rand(rng, L, HQ, T, D)
        scores = inputs_for(info, rng, T)
        if info["inputs"] == "hidden_states":  # EpiKV's frozen scores, set after append (SPEC §4)
            for l in range(L):
                cache.append(0, l, k[l], v[l])
                cache.attend(0, l, q[l])
                cache.set_step_scores(0, l, rng.uniform(0, 1, (H, T)).astype(np.float32))
            r = cache.commit(0)
        else:
            r = cache.step(0, k, v, scores=scores, queries=q)
            assert np.isfinite(r.out).all()
        evicted += r.evicted - (L * H * T if probing else 0)  # a probe's own entries leave with it
        added += 0 if probing else T
    assert cache.tokens(0) == added
    total = sum(cache.length(0, l, h) for l in range(L) for h in range(H))
    assert total == cache.total_length(0) == L * H * added - evicted
    if name != "full":
        assert evicted > 0, f"{name} never evicted in 41 tokens at M = 6"


def test_torch_tensors_are_read_in_place():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    k, v, q = rand(rng, L, H, 3, D), rand(rng, L, H, 3, D), rand(rng, L, HQ, 3, D)
    a = kvpolicy.Cache("full", **SHAPE, max_tokens=16)
    b = kvpolicy.Cache("full", **SHAPE, max_tokens=16)
    for cache in (a, b):
        cache.add_sequence(0)
    out = torch.empty(L, HQ, 3, D)
    ra = a.step(0, torch.from_numpy(k), torch.from_numpy(v), queries=torch.from_numpy(q), out=out)
    rb = b.step(0, k, v, queries=q)
    assert ra.out is out  # written in place
    np.testing.assert_array_equal(out.numpy(), rb.out)
    with pytest.raises(kvpolicy.Error, match="not C-contiguous"):
        a.step(0, torch.from_numpy(k).transpose(2, 3), torch.from_numpy(v))
    with pytest.raises(kvpolicy.Error, match="dtype float16"):
        a.step(0, torch.from_numpy(k).half(), torch.from_numpy(v))


def test_storage_types_hold_what_float32_holds():
    rng = np.random.default_rng(5)
    caches = {s: kvpolicy.Cache("knorm", **SHAPE, max_tokens=64, storage=s, budget=5, buffer=2)
              for s in ("float32", "float16", "bfloat16")}
    for c in caches.values():
        c.add_sequence(0)
    for step in range(20):
        T = 3 if step == 0 else 1
        k, v, q = rand(rng, L, H, T, D), rand(rng, L, H, T, D), rand(rng, L, HQ, T, D)
        outs = {s: c.step(0, k, v, queries=q).out for s, c in caches.items()}
        np.testing.assert_allclose(outs["float16"], outs["float32"], atol=5e-3)
        np.testing.assert_allclose(outs["bfloat16"], outs["float32"], atol=5e-2)
    assert caches["float16"].storage == "float16"
    with pytest.raises(kvpolicy.Error, match="storage 'int8'"):
        kvpolicy.Cache("full", **SHAPE, max_tokens=8, storage="int8")


def snapshot(cache, seq):
    return cache.tokens(seq), held(cache, seq), cache.pages_free


@pytest.mark.parametrize("bad, message", [
    (lambda k, v: (k.astype(np.float64), v), "keys: dtype float64"),
    (lambda k, v: (k, np.ascontiguousarray(v[:, :, :, :-1])), r"values: shape \(2, 2, 1, 15\)"),
    (lambda k, v: (np.concatenate([k, k], axis=3)[:, :, :, ::2], v), "keys: not C-contiguous"),
    (lambda k, v: (np.where(np.arange(D) == 3, np.nan, k).astype(np.float32), v), "not finite"),
    (lambda k, v: (k[0], v), "keys: 3 dimensions"),
])
def test_bad_input_raises_naming_the_value_and_changes_nothing(bad, message):
    rng = np.random.default_rng(6)
    cache = kvpolicy.Cache("streamingllm", **SHAPE, max_tokens=32, budget=4, buffer=1)
    cache.add_sequence(0)
    for _ in range(6):
        cache.step(0, rand(rng, L, H, 1, D), rand(rng, L, H, 1, D))
    before = snapshot(cache, 0)
    k, v = bad(rand(rng, L, H, 1, D), rand(rng, L, H, 1, D))
    with pytest.raises(kvpolicy.Error, match=message):
        cache.step(0, k, v)
    assert snapshot(cache, 0) == before
    cache.step(0, rand(rng, L, H, 1, D), rand(rng, L, H, 1, D))  # and it goes on
    assert cache.tokens(0) == before[0] + 1


def test_errors_name_the_sequence_the_policy_and_the_option():
    with pytest.raises(kvpolicy.Error, match="unknown policy 'nope'"):
        kvpolicy.Cache("nope", **SHAPE, max_tokens=8)
    with pytest.raises(kvpolicy.Error, match="--pool does not apply to policy trimkv"):
        kvpolicy.Cache("trimkv", **SHAPE, max_tokens=8, pool="max")
    with pytest.raises(kvpolicy.Error, match="budget"):
        kvpolicy.Cache("trimkv", **SHAPE, max_tokens=8, budget=0)
    cache = kvpolicy.Cache("trimkv", **SHAPE, max_tokens=8)
    with pytest.raises(kvpolicy.Error, match="unknown sequence 3"):
        cache.tokens(3)
    cache.add_sequence(3)
    with pytest.raises(kvpolicy.Error, match="already exists"):
        cache.add_sequence(3)
    k = np.zeros((L, H, 1, D), np.float32)
    with pytest.raises(kvpolicy.Error, match="pass scores="):
        cache.step(3, k, k)
    with pytest.raises(kvpolicy.Error, match="out of memory"):
        cache.step(3, np.zeros((L, H, 64, D), np.float32), np.zeros((L, H, 64, D), np.float32),
                   scores=np.zeros((L, H, 64), np.float32))
    assert cache.tokens(3) == 0 and cache.total_length(3) == 0
    assert issubclass(kvpolicy.Error, ValueError)


def test_steps_release_the_gil():
    """While one thread runs a long step (a 1,024-token prefill over 8 layers), the main thread runs
    Python: a step that held the GIL would stop it for the whole step."""
    cache = kvpolicy.Cache("full", layers=8, kv_heads=4, q_heads=16, head_dim=64, max_tokens=1024)
    rng = np.random.default_rng(7)
    k, v, q = rand(rng, 8, 4, 1024, 64), rand(rng, 8, 4, 1024, 64), rand(rng, 8, 16, 1024, 64)
    cache.add_sequence(0)
    done = []
    worker = threading.Thread(target=lambda: done.append(cache.step(0, k, v, queries=q)))
    ticks = 0
    worker.start()
    while worker.is_alive():
        ticks += 1
        threading.Event().wait(0.001)
    worker.join()
    assert done and cache.tokens(0) == 1024
    assert ticks >= 20, f"the main thread ran {ticks} times during the step"


def test_the_producer_of_a_policys_inputs():
    """Producer gives finite scores of the stated shapes for the kv-statistics and EpiKV families,
    says what it reads, keeps state per sequence (the same input twice scores differently once the
    window moves; another sequence starts fresh), and refuses what its policy does not read."""
    rng = np.random.default_rng(8)
    s = kvpolicy.Producer("kv-key", hidden=32, **SHAPE)
    assert s.needs == dict(normed_input=False, keys_pre_rope=False, keys=True, values=True, bands=None, key_layout="any",
                           reconstruction=None)
    k, v = rand(rng, H, 5, D), rand(rng, H, 5, D)
    out = s.layer(0, 0, keys=k, values=v)
    assert out.shape == (H, 5) and np.isfinite(out).all()
    np.testing.assert_array_equal(s.layer(1, 0, keys=k, values=v), out)  # sequence 1: its own state
    with pytest.raises(kvpolicy.Error, match="reads the layer's values, which was not given"):
        s.layer(0, 1, keys=k)
    with pytest.raises(kvpolicy.Error, match="not per token"):
        s.tokens(0, rand(rng, 6, 32), rand(rng, 6, 32))
    sig = kvpolicy.Producer("epikv", hidden=32, band_a=1, band_b=2, **SHAPE)
    assert sig.needs["bands"] == (1, 2) and kvpolicy.Producer.needs_of("epikv", band_a=1, band_b=2) == sig.needs
    h_a, h_b = rand(rng, 6, 32), rand(rng, 6, 32)
    first, second = sig.tokens(0, h_a, h_b), sig.tokens(0, h_a, h_b)
    assert first.shape == (6,) and np.isfinite(first).all() and not np.array_equal(first, second)
    sig.drop(0)
    np.testing.assert_array_equal(sig.tokens(0, h_a, h_b), first)  # dropped: starts over
    with pytest.raises(kvpolicy.Error, match="h_b: shape"):
        sig.tokens(0, h_a, rand(rng, 6, 31))
    with pytest.raises(kvpolicy.Error, match="needs its trained gate"):
        kvpolicy.Producer("trimkv", hidden=32, **SHAPE)
    knorm = kvpolicy.Producer.needs_of("knorm")
    assert knorm["bands"] is None and not any(knorm[k] for k in ("normed_input", "keys_pre_rope", "keys", "values"))
