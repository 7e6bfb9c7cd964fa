"""kvpolicy inside Hugging Face transformers (5.x): an attention implementation, "kvpolicy", and a
Cache whose entries live in a kvpolicy Cache that evicts physically per (layer, kv head).

    import kvpolicy.transformers                       # registers attn_implementation="kvpolicy"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="kvpolicy", dtype=torch.float32)
    cache = kvpolicy.transformers.Cache("trimkv", budget=128, buffer=16, sinks=4, gate="trimkv.safetensors")
    model.generate(ids, past_key_values=cache, max_new_tokens=32)
    cache.entries_held(), cache.bytes_held()

How it runs: each attention layer's update() hands this Cache the step's new keys and values and
gets them back unchanged; the "kvpolicy" attention function then appends them to the kvpolicy
Cache (with the policy's scores, from the library's producer of its inputs, handed what its needs
list: the layer's normed input, the keys before and after RoPE, the values, two hidden-state bands)
and attends the queries over
what each head holds, causal within the step. The last layer commits the step: the policy's
trigger and eviction. Positions are the tokens processed (get_seq_length), never the entries held.

LLaMA-family models only (llama, mistral, qwen2, qwen3: RoPE, GQA, 1/sqrt(d) scaling); on the CPU;
one sequence per batch row, no padding. EpiKV and HS-var read the hidden states of their bands A
and B (the inputs of decoder layers A and B, as output_hidden_states indexes them); a band equal to
the layer count (the final norm's output, after the last attention) is refused here.
"""
from __future__ import annotations

import inspect
import threading

import numpy as np
import torch
import transformers
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

from . import _core

NAME = "kvpolicy"
MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")

# The cache whose update() ran last on this thread: the attention function that follows it in the
# same layer finds it here (transformers hands the attention function no cache).
_current = threading.local()


def _normed_input_hook(module, args, output):
    """A forward hook on every module while a Cache that reads the normed input exists: keeps the
    last RMSNorm output of shape [B, T, hidden], which at an attention call is that layer's normed
    input, the gates' input (SPEC §1, §3). Qwen3's per-head q/k norms are [B, T, H, d] and never taken."""
    if _gated_caches and isinstance(output, torch.Tensor) and output.dim() == 3 \
            and type(module).__name__.endswith("RMSNorm"):
        _current.normed = output


def _band_hook(module, args):
    """A forward pre-hook on every module while an EpiKV-family Cache exists: keeps the input of
    each decoder layer (hidden state l, output_hidden_states' indexing) that is one of its bands."""
    if _bands and args and type(module).__name__.endswith("DecoderLayer"):
        layer = getattr(getattr(module, "self_attn", None), "layer_idx", None)
        if layer in _bands:
            if not hasattr(_current, "hidden"):
                _current.hidden = {}
            _current.hidden[layer] = args[0]


_hook_handle = None
_band_handle = None
_gated_caches = 0
_bands_of = {}  # id(cache) -> its bands, for every live EpiKV-family Cache
_bands = set()  # their union: the decoder-layer inputs the hook keeps


def _install_normed_input_hook():
    global _hook_handle, _gated_caches
    _gated_caches += 1
    if _hook_handle is None:
        _hook_handle = torch.nn.modules.module.register_module_forward_hook(_normed_input_hook)


def _half_to_adjacent(x):
    """[..., d] from transformers' rotate-half component order to adjacent pairs (llama.cpp's, which
    kvpolicy-lm's write gates read: docs/training.md)."""
    d = x.shape[-1]
    return torch.stack((x[..., : d // 2], x[..., d // 2:]), dim=-1).reshape(x.shape)


def _model_options(policy, config):
    """The options that describe the model (its RoPE: base and rotate-half pairs), for a policy that
    takes them; the user's own values override these."""
    takes = _core.policies()[policy]["options"]
    if "rope_theta" not in takes:
        return {}
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise _core.Error(f"kvpolicy: policy {policy} undoes plain RoPE; this model's RoPE is '{kind}'")
    theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise _core.Error(f"kvpolicy: policy {policy} needs the model's RoPE base; its config names none")
    return {"rope_theta": float(theta), "rope_layout": "half"}


class Cache(transformers.Cache):
    """A transformers Cache backed by a kvpolicy Cache of the named policy (kvpolicy.policies()).

    policy, options: as kvpolicy.Cache takes them (budget=, buffer=, sinks=, ...); gate: the policy's
    trained gate (a safetensors file) for trimkv, dbtrimkv and wgkv. max_tokens: the most tokens a
    sequence reaches (the pool holds that many entries per head, twice that and 64 for a policy whose
    probe repeats the prompt beside it: the policy bounds what stays).
    """

    def __init__(self, policy: str, *, gate=None, max_tokens: int = 4096, storage: str = "float32", **options):
        if policy not in _core.policies():
            raise _core.Error(f"kvpolicy: unknown policy '{policy}' (known: {', '.join(sorted(_core.policies()))})")
        super().__init__(layers=[])
        self.policy, self.options = policy, dict(options)
        # what the producer of the policy's inputs reads (the gate's file among its options)
        self._producer_options = dict(options, **({} if gate is None else {"gate": str(gate)}))
        self.needs = _core.Producer.needs_of(policy, **self._producer_options)
        self.max_tokens, self.storage = int(max_tokens), storage
        self.cache = None  # the kvpolicy Cache, made at the first attention call (the model's shape)
        self.producer = None  # and the producer of its inputs
        self.config = None
        self.batch = 0
        self._reads_normed = self.needs["normed_input"] or self.needs["keys_pre_rope"]
        self._per_layer = self._reads_normed or self.needs["keys"] or self.needs["values"]
        if self._reads_normed:  # the keys before RoPE are k_proj of the normed input
            _install_normed_input_hook()
        self.bands = self.needs["bands"]
        if self.bands is not None:
            global _band_handle
            if _band_handle is None:
                _band_handle = torch.nn.modules.module.register_module_forward_pre_hook(_band_hook)
            _bands_of[id(self)] = self.bands
            _bands.update(self.bands)

    def __del__(self):
        global _gated_caches
        if getattr(self, "_reads_normed", False):
            _gated_caches -= 1
        if _bands_of.pop(id(self), None) is not None:
            _bands.clear()
            _bands.update(*_bands_of.values())

    # ---- transformers' Cache interface ---------------------------------------------------------
    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        _current.cache = self
        return key_states, value_states

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.cache is None or 0 not in self.cache else self.cache.tokens(0)

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0):
        return self.get_seq_length() + query_length, 0

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.get_seq_length()

    def get_max_length(self, layer_idx=None) -> int:
        return -1

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_initialized(self) -> bool:
        return self.cache is not None

    def reset(self):
        self.cache, self.producer, self.batch = None, None, 0

    def reorder_cache(self, beam_idx):
        raise _core.Error("kvpolicy: beam search reorders whole caches; each kvpolicy sequence holds its own "
                          "entries (use greedy or sampling)")

    def crop(self, tokens_to_remove):
        raise _core.Error("kvpolicy: a cache whose policy evicted cannot be cropped back (assisted decoding)")

    def batch_repeat_interleave(self, repeats):
        raise _core.Error("kvpolicy: num_return_sequences > 1 copies caches; make one Cache per sequence")

    def batch_select_indices(self, indices):
        raise _core.Error("kvpolicy: selecting batch rows of a kvpolicy cache is not supported")

    # ---- a probe after the prompt (SPEC §10) ---------------------------------------------------
    def probe_ids(self, tokenizer, prompt_ids):
        """The tokens of the probe a policy that reads a reconstruction (KVzip) runs after the prompt
        prompt_ids [B, n0]: its instruction, the chat template's assistant header where the tokenizer
        has a template ("\\n" where it has none), then the prompt from the policy's prefix on; None
        for any other policy."""
        r = self.needs["reconstruction"]
        if r is None:
            return None
        header = "\n"
        if getattr(tokenizer, "chat_template", None):  # what the template puts after a user turn
            dummy, separator = "dummy context", "\n" + "#" * len("dummy context")
            header = tokenizer.apply_chat_template([{"role": "user", "content": dummy + separator}],
                                                   add_generation_prompt=True, tokenize=False).split(separator)[1]
        lead = tokenizer.encode(r["instruction"], add_special_tokens=False) + tokenizer.encode(header, add_special_tokens=False)
        lead = torch.tensor([lead] * prompt_ids.shape[0], dtype=prompt_ids.dtype)
        return torch.cat([lead, prompt_ids[:, r["prefix"]:]], dim=1)

    def probe(self, model, ids):
        """Runs ids [B, Q] through model as one probe step of every sequence (SPEC §10: KVzip's
        repetition, probe_ids): the policy scores with them and evicts, their entries leave, and each
        sequence stays at its length. After the prompt, before the first token after it."""
        if self.needs["reconstruction"] is None:  # another policy's inputs would take the probe's tokens in
            raise _core.Error(f"kvpolicy: policy {self.policy} reads no probe (its inputs are not a reconstruction)")
        if self.cache is None:
            raise _core.Error("kvpolicy: a probe follows the prompt; run the prompt through the model first")
        if ids.shape[0] != self.batch:
            raise _core.Error(f"kvpolicy: the probe has {ids.shape[0]} rows, this cache {self.batch} sequences")
        for b in range(self.batch):
            self.cache.open_probe(b)
        # the cache argument's name: `cache` from transformers 5.3, `past_key_values` before
        given = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        with torch.no_grad():
            model(ids, use_cache=True, **{given: self})

    # ---- what the policy holds -----------------------------------------------------------------
    def entries_held(self) -> int:
        """Entries held over every sequence, layer and kv head (the full cache holds tokens x L x Hkv)."""
        return 0 if self.cache is None else sum(self.cache.total_length(b) for b in range(self.batch))

    def bytes_held(self) -> int:
        """K and V bytes of the entries held, in the cache's storage type."""
        if self.cache is None:
            return 0
        per = {"float32": 4, "float16": 2, "bfloat16": 2}[self.storage]
        return self.entries_held() * 2 * self.head_dim * per

    # ---- the attention step --------------------------------------------------------------------
    def _start(self, module, batch):
        c = module.config
        if c.model_type not in MODEL_TYPES:
            raise _core.Error(f"kvpolicy: model type '{c.model_type}' is not LLaMA-family ({', '.join(MODEL_TYPES)})")
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.config, self.head_dim = c, head_dim
        # a probe after the prompt (KVzip, SPEC §10) holds the prompt again beside it until its commit
        held = 2 * self.max_tokens + 64 if self.needs["reconstruction"] is not None else self.max_tokens
        self.cache = _core.Cache(self.policy, layers=c.num_hidden_layers, kv_heads=c.num_key_value_heads,
                                 q_heads=c.num_attention_heads, head_dim=head_dim, max_tokens=held,
                                 max_sequences=batch, storage=self.storage,
                                 **{**_model_options(self.policy, c), **self.options})
        self.batch = batch
        self.producer = _core.Producer(self.policy, layers=c.num_hidden_layers, hidden=c.hidden_size,
                                       kv_heads=c.num_key_value_heads, q_heads=c.num_attention_heads,
                                       head_dim=head_dim, **self._producer_options)
        if self.bands is not None and max(self.bands) >= c.num_hidden_layers:
            raise _core.Error(f"kvpolicy: bands {self.bands}: a band of {c.num_hidden_layers} is the final norm's "
                              f"output, which comes after the last attention; give bands below it here")

    def attend(self, module, query, key, value, scaling):
        """query [B, Hq, T, d], key/value [B, Hkv, T, d] -> [B, T, Hq, d] (transformers' layout)."""
        B, Hq, T, d = query.shape
        if query.device.type != "cpu":
            raise _core.Error(f"kvpolicy: the model runs on {query.device}; this cache is on the CPU")
        if scaling is not None and abs(scaling - d ** -0.5) > 1e-6 * d ** -0.5:
            raise _core.Error(f"kvpolicy: attention scaling {scaling} is not 1/sqrt(head_dim) = {d ** -0.5}")
        layer = module.layer_idx
        if self.cache is None:
            self._start(module, B)
        if B != self.batch:
            raise _core.Error(f"kvpolicy: batch {B} differs from this cache's {self.batch} sequences")
        for b in range(B):
            if b not in self.cache:
                self.cache.add_sequence(b, T)  # the first step is the prompt, as kvpolicy-lm declares it
        q = query.detach().float().contiguous()
        k = key.detach().float().contiguous()
        v = value.detach().float().contiguous()
        out = torch.empty(B, Hq, T, d, dtype=torch.float32)
        given = self._layer_inputs(module, k, v, T) if self._per_layer else None
        for b in range(B):
            s = None
            if given is not None:
                s = self.producer.layer(b, layer, **{name: x[b].contiguous().numpy() for name, x in given.items()})
            self.cache.append(b, layer, k[b].numpy(), v[b].numpy(), scores=s)
            self.cache.attend(b, layer, q[b].numpy(), out=out[b].numpy())
        if layer == self.config.num_hidden_layers - 1:
            if self.bands is not None:
                self._set_hidden_scores(B, T)
            for b in range(B):
                self.cache.commit(b)
        return out.to(query.dtype).transpose(1, 2).contiguous()

    def _set_hidden_scores(self, B, T):
        """EpiKV's frozen scores (SPEC §4): one per token from bands A and B, the same in every layer
        and kv head, set before the commit that reads them."""
        hidden = getattr(_current, "hidden", {})
        missing = [band for band in self.bands if band not in hidden]
        if missing:
            raise _core.Error(f"kvpolicy: the hidden states of bands {missing} were not seen")
        L, H = self.config.num_hidden_layers, self.config.num_key_value_heads
        for b in range(B):
            h_a, h_b = (hidden[band][b].detach().float().contiguous().numpy() for band in self.bands)
            token = self.producer.tokens(b, h_a, h_b)
            scores = np.ascontiguousarray(np.broadcast_to(token, (H, T)), dtype=np.float32)
            for layer in range(L):
                self.cache.set_step_scores(b, layer, scores)

    def _layer_inputs(self, module, k, v, T):
        """What the producer reads of this layer's step, as its needs list: {name: [B, ...] tensor}."""
        needs, given = self.needs, {}
        if self._reads_normed:
            normed = getattr(_current, "normed", None)
            if normed is None or normed.shape[-2] != T:
                raise _core.Error("kvpolicy: the layer's normed input was not seen (is the model LLaMA-family?)")
            if needs["normed_input"]:
                given["normed_input"] = normed.detach().float()
            if needs["keys_pre_rope"]:
                B, Hkv, _, d = k.shape
                with torch.no_grad():
                    k_pre = module.k_proj(normed).view(B, T, Hkv, d)
                    if hasattr(module, "k_norm"):  # Qwen3: the key as RoPE receives it
                        k_pre = module.k_norm(k_pre)
                given["keys_pre_rope"] = k_pre.transpose(1, 2).float()
        if needs["keys"]:
            given["keys"] = k
        if needs["values"]:
            given["values"] = v
        if needs["key_layout"] == "adjacent":  # transformers' keys are in rotate-half order
            for name in ("keys_pre_rope", "keys"):
                if name in given:
                    given[name] = _half_to_adjacent(given[name])
        return given


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    cache = getattr(_current, "cache", None)
    if cache is None:
        raise _core.Error("kvpolicy: attn_implementation='kvpolicy' needs past_key_values=kvpolicy.transformers.Cache(...)")
    _current.cache = None  # one attention call per update()
    return cache.attend(module, query, key, value, scaling), None


def _refuse_padding(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                    attention_mask=None, **kwargs):
    """The mask function of attn_implementation='kvpolicy': the kvpolicy Cache attends causally within
    each sequence's own entries, so no mask is built; a padded batch is refused."""
    if attention_mask is not None and not bool(attention_mask.all()):
        raise _core.Error("kvpolicy: a padded batch: each batch row is one kvpolicy sequence and must be unpadded "
                          "(run sequences of different lengths as separate batches or caches)")
    return None


AttentionInterface.register(NAME, _attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, _refuse_padding)
