"""The three trainable gates, in torch, with the tensor names and shapes SPEC gives the C++ loaders.

- RetentionGate  TRIM-KV's `rg` (SPEC §1): log_beta = logsigmoid(W2 act(W1 x + b1) + b), per layer.
- Rg10Gate       DBTrimKV's `rg10` (SPEC §2): a two-layer MLP per layer, then one readout (W3, b)
                 tied across every layer, as the authors' code ties it.
- WriteGate      WG-KV's write gate (SPEC §3): per kv head, g = sigmoid(w2 . gelu(W1 f + b1) + b2)
                 on f = [rmsnorm(k_pre) * w_pre ; rmsnorm(k_post) * w_post].

`export()` returns the state dict under SPEC's names, ready for safetensors; the C++ gates
(include/kvpolicy/gate/) load it unchanged.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu}


def rope_to_adjacent(w: torch.Tensor, head_dim: int, dim: int) -> torch.Tensor:
    """Reorders `dim` of `w` (length head_dim or a multiple) from transformers' rotate-half layout of a
    head's components (pairs (j, j + d/2)) to llama.cpp's adjacent-pairs layout (pairs (2j, 2j + 1)),
    which kvpolicy-lm uses (kvpolicy-gguf-to-lm): adjacent component 2j + s is half-layout s*d/2 + j."""
    half = head_dim // 2
    n = w.shape[dim] // head_dim
    order = torch.tensor([s * half + j for j in range(half) for s in range(2)])
    index = torch.cat([order + i * head_dim for i in range(n)])
    return w.index_select(dim, index.to(w.device))


def _put_linear(out, name, linear):
    """A linear layer under SPEC's names: `name.weight` and, where it has one, `name.bias`."""
    out[name + ".weight"] = linear.weight
    if linear.bias is not None:
        out[name + ".bias"] = linear.bias


class RetentionGate(nn.Module):
    """TRIM-KV's per-layer retention gate (SPEC §1). forward(l, x [B, T, D]) -> log_beta [B, Hkv, T]."""

    kind = "rg"

    def __init__(self, layers, hidden, kv_heads, width=512, activation="silu", bias_init=10.0):
        super().__init__()
        self.act = ACTIVATIONS[activation]
        self.linear1 = nn.ModuleList(nn.Linear(hidden, width) for _ in range(layers))
        self.linear2 = nn.ModuleList(nn.Linear(width, kv_heads, bias=False) for _ in range(layers))
        # the bias starts high: beta ~ 1, no forgetting at the start of training (TRIM-KV §4.2)
        self.bias = nn.ParameterList(nn.Parameter(torch.full((kv_heads,), float(bias_init))) for _ in range(layers))
        for l2 in self.linear2:  # a small readout keeps z near the bias at the start
            nn.init.normal_(l2.weight, std=1e-3)

    def forward(self, layer, x):
        z = self.linear2[layer](self.act(self.linear1[layer](x))) + self.bias[layer]
        return F.logsigmoid(z).transpose(1, 2)

    def export(self, head_dim):
        out = {}
        for l in range(len(self.linear1)):
            p = f"model.layers.{l}.self_attn.retention_gate."
            _put_linear(out, p + "linear1", self.linear1[l])
            _put_linear(out, p + "linear2", self.linear2[l])
            out[p + "bias"] = self.bias[l]
        return out


class Rg10Gate(nn.Module):
    """DBTrimKV's rg10 (SPEC §2): u = act(W2[l] act(W1[l] x + b1[l]) + b2[l]); log_beta =
    logsigmoid(W3 u + b) with (W3, b) one pair shared by every layer."""

    kind = "rg10"

    def __init__(self, layers, hidden, kv_heads, width=512, activation="silu", bias_init=18.0):
        super().__init__()
        self.act = ACTIVATIONS[activation]
        self.linear1 = nn.ModuleList(nn.Linear(hidden, width) for _ in range(layers))
        self.linear2 = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.linear3 = nn.Linear(width, kv_heads, bias=False)  # tied across layers
        self.bias = nn.Parameter(torch.full((kv_heads,), float(bias_init)))
        nn.init.normal_(self.linear3.weight, std=1e-3)

    def forward(self, layer, x):
        u = self.act(self.linear2[layer](self.act(self.linear1[layer](x))))
        return F.logsigmoid(self.linear3(u) + self.bias).transpose(1, 2)

    def export(self, head_dim):
        out = {}
        for l in range(len(self.linear1)):
            p = f"model.layers.{l}.self_attn.retention_gate."
            _put_linear(out, p + "linear1", self.linear1[l])
            _put_linear(out, p + "linear2", self.linear2[l])
            # the tied pair under every layer's name, as the authors' state dicts store it (SPEC §2)
            _put_linear(out, p + "linear3", self.linear3)
            out[p + "bias"] = self.bias
        return out


class WriteGate(nn.Module):
    """WG-KV's write gate (SPEC §3), one grouped MLP per layer: forward(l, k_pre, k_post [B, Hkv, T, d])
    -> g [B, Hkv, T] in (0, 1), soft (the training form, WG-KV §3.2); inference clamps at 1e-3 and
    thresholds at tau."""

    kind = "wg"
    eps = 1e-6

    def __init__(self, layers, kv_heads, head_dim, expansion=4.0, bias_init=2.0):
        super().__init__()
        E = int(round(expansion * head_dim))
        self.pre_norm = nn.ParameterList(nn.Parameter(torch.ones(head_dim)) for _ in range(layers))
        self.post_norm = nn.ParameterList(nn.Parameter(torch.ones(head_dim)) for _ in range(layers))
        bound1, bound2 = 1 / math.sqrt(2 * head_dim), 1 / math.sqrt(E)
        self.w1 = nn.ParameterList(nn.Parameter(torch.empty(kv_heads, E, 2 * head_dim).uniform_(-bound1, bound1)) for _ in range(layers))
        self.b1 = nn.ParameterList(nn.Parameter(torch.zeros(kv_heads, E)) for _ in range(layers))
        self.w2 = nn.ParameterList(nn.Parameter(torch.empty(kv_heads, E).uniform_(-bound2, bound2) * 1e-2) for _ in range(layers))
        # g starts near 1 (every token admitted: the full model), as the retention gates start at beta ~ 1
        self.b2 = nn.ParameterList(nn.Parameter(torch.full((kv_heads,), float(bias_init))) for _ in range(layers))

    @staticmethod
    def _rmsnorm(x, w, eps):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def forward(self, layer, k_pre, k_post):
        f = torch.cat([self._rmsnorm(k_pre, self.pre_norm[layer], self.eps),
                       self._rmsnorm(k_post, self.post_norm[layer], self.eps)], dim=-1)  # [B, H, T, 2d]
        u = F.gelu(torch.einsum("bhtf,hef->bhte", f, self.w1[layer]) + self.b1[layer][None, :, None, :])
        z = torch.einsum("bhte,he->bht", u, self.w2[layer]) + self.b2[layer][None, :, None]
        return torch.sigmoid(z)

    def export(self, head_dim, adjacent_rope=True):
        """adjacent_rope: the model's keys as kvpolicy-lm computes them (llama.cpp's layout), so the
        per-component weights are reordered from transformers' layout (rope_to_adjacent)."""
        out = {}
        for l in range(len(self.w1)):
            p = f"model.layers.{l}.self_attn.write_gate."
            pre, post, w1 = self.pre_norm[l], self.post_norm[l], self.w1[l]
            if adjacent_rope:
                pre, post = rope_to_adjacent(pre, head_dim, 0), rope_to_adjacent(post, head_dim, 0)
                w1 = rope_to_adjacent(w1, head_dim, 2)  # both halves of f, each one head's components
            out[p + "pre_norm.weight"] = pre
            out[p + "post_norm.weight"] = post
            out[p + "w1.weight"] = w1
            out[p + "w1.bias"] = self.b1[l]
            out[p + "w2.weight"] = self.w2[l]
            out[p + "w2.bias"] = self.b2[l]
        return out


def load_exported(gate, tensors, head_dim):
    """Loads a retention gate (rg, rg10) from the tensors its export() wrote (a committed
    `.safetensors`), so training can go on from a gate this repository ships. Their export is the
    parameters themselves under SPEC's names; the write gate's is reordered for RoPE, so not it."""
    if gate.kind == "wg":
        raise ValueError("load_exported: a write gate's export is reordered for RoPE; start it from a checkpoint.pt")
    params = gate.export(head_dim)
    if set(params) != set(tensors):
        missing, extra = sorted(set(params) - set(tensors)), sorted(set(tensors) - set(params))
        raise ValueError(f"load_exported: the file is not this gate (missing {missing[:3]}, unexpected {extra[:3]})")
    with torch.no_grad():
        for name, param in params.items():
            if tuple(tensors[name].shape) != tuple(param.shape):
                raise ValueError(f"load_exported: {name} is {tuple(tensors[name].shape)}, the gate's {tuple(param.shape)}")
            param.copy_(tensors[name])


TOKEN_LEVEL = "token_level."  # the names of a file's gate for the token-level layout (SPEC §8)


def gate_file(path, device="cpu", token_level=False):
    """(kind, width) of the gate a file training wrote holds, and a function that loads it into a
    gate of that kind and width: a run's checkpoint.pt (any kind, as its args say) or a retention
    gate's `.safetensors` export (rg or rg10, as its tensors say: the tied readout `linear3` is
    rg10's). token_level: the export's gate for the token-level layout (SPEC §8, the names under
    TOKEN_LEVEL), which a file may hold beside its per-head gate. ValueError naming the file when it
    is neither (a write gate's export included: it is reordered for RoPE, so a write gate is read
    from its checkpoint.pt)."""
    if path.endswith(".pt"):
        if token_level:
            raise ValueError(f"{path}: a checkpoint holds one gate; its token-level gate is in an export")
        ck = torch.load(path, map_location=device)
        return ck["args"]["gate"], ck["args"]["width"], lambda gate, head_dim: gate.load_state_dict(ck["gate"])
    from safetensors.torch import load_file
    every = load_file(path, device=str(device))
    tensors = {k[len(TOKEN_LEVEL):] if token_level else k: v for k, v in every.items()
               if k.startswith(TOKEN_LEVEL) == token_level}
    if token_level and not tensors:
        raise ValueError(f"{path} holds no token-level gate (no {TOKEN_LEVEL}* tensors)")
    first = "model.layers.0.self_attn.retention_gate."
    if first + "linear1.weight" not in tensors:
        raise ValueError(f"{path} is not a retention gate's export (no {first}linear1.weight)")
    kind = "rg10" if first + "linear3.weight" in tensors else "rg"
    return kind, tensors[first + "linear1.weight"].shape[0], lambda gate, head_dim: load_exported(gate, tensors, head_dim)


def holds_token_level_gate(path):
    """Whether a retention gate's export holds a gate for the token-level layout (SPEC §8) beside its
    per-head one; read from the file's names, its tensors left unread."""
    if path.endswith(".pt"):
        return False
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        return any(k.startswith(TOKEN_LEVEL) for k in f.keys())


def attention_head_size(config):
    """A transformers config's attention head size: its head_dim, or hidden_size / num_attention_heads
    where it has none (LLaMA-family configs before head_dim)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def make_gate(kind, config, width, activation=None, bias_init=None):
    """The gate `kind` (rg, rg10, wg) for a transformers LLaMA-family config."""
    L, D, H = config.num_hidden_layers, config.hidden_size, config.num_key_value_heads
    d = attention_head_size(config)
    act = activation or ("silu" if config.hidden_act == "silu" else "gelu")
    if kind == "rg":
        return RetentionGate(L, D, H, width, act, 10.0 if bias_init is None else bias_init)
    if kind == "rg10":
        return Rg10Gate(L, D, H, width, act, 18.0 if bias_init is None else bias_init)
    if kind == "wg":
        return WriteGate(L, H, d, 4.0, 2.0 if bias_init is None else bias_init)
    raise ValueError(f"unknown gate '{kind}' (rg, rg10 or wg)")
