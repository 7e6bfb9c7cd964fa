"""What a gate-training run shares with the others (kvpolicy_tools.train.train_gates, .ranking): the
learning-rate schedule, the written gate (SPEC's names, the dtypes the C++ loaders read) and the
curves drawn from a run's log.csv. No model library is imported here, so a trainer that does not run
the model (ranking.py) starts without one.
"""
import copy
import csv
import math

import torch
from safetensors.torch import save_file


def schedule(step, steps, warmup):
    """Linear warm-up, then cosine decay to 10% (the learning-rate factor)."""
    w = max(1, int(warmup * steps))
    if step < w:
        return (step + 1) / w
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - w) / max(1, steps - w)))


def export(gate, path, head_dim, adjacent_rope, meta):
    """Matrices in bf16, vectors (biases, norm weights) in fp32: the sensitive bias of a retention
    gate sits near 10, where bf16's step (0.0625) would move beta visibly."""
    kw = {"adjacent_rope": adjacent_rope} if gate.kind == "wg" else {}
    tensors = {}
    for k, v in gate.export(head_dim, **kw).items():
        v = v.detach().float().cpu()
        tensors[k] = (v.to(torch.bfloat16) if v.dim() >= 2 else v).contiguous().clone()
    save_file(tensors, path, metadata={k: str(v) for k, v in meta.items()})


def rounded_as_exported(gate):
    """A copy of the gate whose matrices hold the bf16 values export() writes (parity tests)."""
    g = copy.deepcopy(gate)
    with torch.no_grad():
        for p in g.parameters():
            if p.dim() >= 2:
                p.copy_(p.to(torch.bfloat16).float())
    return g


def plot(log_path, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(log_path) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return
    keys = [k for k in rows[0] if k not in ("step", "lr", "seconds", "tokens")]
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2))
    for ax, k in zip(axes if len(keys) > 1 else [axes], keys):
        present = [r for r in rows if r[k] != ""]  # the answer term is empty on plain-prose steps
        if not present:
            continue
        steps = [int(r["step"]) for r in present]
        values = [float(r[k]) for r in present]
        smooth, s = [], values[0]
        for v in values:  # an exponential moving average over ~20 steps: one window is noisy
            s = 0.95 * s + 0.05 * v
            smooth.append(s)
        ax.plot(steps, values, lw=0.6, alpha=0.4)
        ax.plot(steps, smooth, lw=1.6)
        ax.set_title(k)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
