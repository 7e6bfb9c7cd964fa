"""Gated attention inside a frozen transformers LLaMA-family model, the training form of each gate.

- Retention-gated attention (TRIM-KV Eq. 3; DBTrimKV the same): the logit of key i at query t gets
  the additive bias (t - i) * log_beta_i, log_beta per (layer, kv head, token), shared by the query
  heads of a GQA group.
- Write-gated attention (WG-KV §3.2, the log-space form): keys within W_local of the query get no
  bias; older keys get log(g_i + eps), so g_i = 0 hides key i from distant queries.

The gate reads what SPEC says it reads: the retention gates the attention block's input (the
hidden state after the layer's input RMSNorm), the write gate the keys before and after RoPE. Hooks
capture them; the attention function is registered with transformers' AttentionInterface, so the
model's own projections, RoPE and MLPs run unchanged.
"""
import torch
import torch.nn.functional as F
from transformers import AttentionInterface

NAME = "kvpolicy_gated"
WRITE_EPS = 1e-6  # log(m + eps) (WG-KV §3.2)


def causal_distance(T, device):
    """[T, T] with t - i below and on the diagonal, and the mask of keys after the query."""
    pos = torch.arange(T, device=device)
    dist = pos[:, None] - pos[None, :]
    return dist.clamp(min=0).to(torch.float32), dist < 0


def retention_bias(log_beta):
    """log_beta [B, H, T] -> bias [B, H, T, T]: (t - i) * log_beta_i for i <= t, -inf after t."""
    T = log_beta.shape[-1]
    dist, future = causal_distance(T, log_beta.device)
    return (dist * log_beta[:, :, None, :]).masked_fill(future, float("-inf"))


def write_bias(g, local_window):
    """g [B, H, T] -> bias [B, H, T, T]: 0 where t - i < W_local, log(g_i + eps) beyond, -inf after t."""
    T = g.shape[-1]
    dist, future = causal_distance(T, g.device)
    far = torch.log(g + WRITE_EPS)[:, :, None, :].expand(-1, -1, T, -1)
    bias = torch.where(dist < local_window, torch.zeros_like(far), far)
    return bias.masked_fill(future, float("-inf"))


class GatedModel:
    """Wraps a frozen model with one gate. `teacher()` runs it as it is (full causal attention);
    `student()` runs it with the gate's bias and records each layer's gate output in `outputs`
    (log_beta for rg/rg10, g for wg) for the capacity or sparsity loss."""

    def __init__(self, model, gate, local_window=256):
        self.model, self.gate, self.local_window = model, gate, local_window
        self.mode = "teacher"
        self.normed, self.k_pre, self.outputs, self.biases = {}, {}, {}, {}
        AttentionInterface.register(NAME, _attention)
        model.config._attn_implementation = NAME
        for layer in model.model.layers:
            attn = layer.self_attn
            attn._kvpolicy = self
            attn.register_forward_pre_hook(self._capture_input, with_kwargs=True)
            attn.k_proj.register_forward_hook(self._capture_k_pre(attn))

    def _capture_input(self, module, args, kwargs):
        self.normed[module.layer_idx] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]

    def _capture_k_pre(self, attn):
        def hook(_module, _args, out):
            self.k_pre[attn.layer_idx] = out
        return hook

    def _run(self, mode, ids, **kw):
        self.mode = mode
        for captured in (self.normed, self.k_pre, self.outputs, self.biases):
            captured.clear()
        return self.model(input_ids=ids, use_cache=False, **kw)

    def teacher(self, ids, **kw):
        with torch.no_grad():
            return self._run("teacher", ids, **kw)

    def student(self, ids, **kw):
        return self._run("student", ids, **kw)

    def bias(self, module, key):
        """The layer's gate output and attention bias [B, Hkv, T, T] (key: post-RoPE [B, Hkv, T, d])."""
        l = module.layer_idx
        if self.gate.kind == "wg":
            B, H, T, d = key.shape
            k_pre = self.k_pre[l].view(B, T, H, d).transpose(1, 2)
            g = self.gate(l, k_pre, key)
            self.outputs[l] = g
            return write_bias(g, self.local_window)
        log_beta = self.gate(l, self.normed[l])
        self.outputs[l] = log_beta
        bias = retention_bias(log_beta)
        self.biases[l] = bias  # the capacity loss sums exp(bias) over keys (objectives.py)
        return bias


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    ctx = module._kvpolicy
    Hq, Hkv = query.shape[1], key.shape[1]
    if ctx.mode == "teacher":
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, enable_gqa=Hq != Hkv)
    else:
        bias = ctx.bias(module, key).to(query.dtype).repeat_interleave(Hq // Hkv, dim=1)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=bias, scale=scaling, enable_gqa=Hq != Hkv)
    return out.transpose(1, 2).contiguous(), None
