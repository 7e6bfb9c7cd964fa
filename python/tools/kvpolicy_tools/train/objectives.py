"""Each paper's training objective, on the outputs of GatedModel (gated_attention.py).

- TRIM-KV (Eq. 4-5): forward KL D_KL(p || q) from the frozen full-attention model p to the gated
  model q, plus next-token cross-entropy of q, plus lambda_cap * L_cap with, per (layer, kv head),
  L_cap = 1 / (T (T - M)) * sum_t max(0, sum_{i<=t} beta_i^(t-i) - M), averaged over layers and heads.
- DBTrimKV (§4.1): the same quality loss; the capacity is global: sum over (layer, head) inside the
  hinge against M_global = L * Hkv * M. We divide it by L * Hkv * T * (T - M) so that one lambda
  means the same for both (the paper leaves the normalisation open).
- WG-KV (§3.3): L2 distillation of the final hidden states to the full model's, plus
  lambda * L_sparsity with L_sparsity = mean over (l, h, t) of g + g (1 - g).
- Answers (long-range documents, kvpolicy_tools.data.longrange): the quality term averaged over the
  positions that predict an answer token is added, weighted, to the one averaged over every position.
  An answer is a few tokens of hundreds, so the mean over all positions alone barely pays for
  keeping the fact it needs; the authors' code computes its KL on the label tokens only (TRAINING.md).
- Keeping stated facts (rg, rg10; long-range documents): L_keep = T * mean over (layer, kv head,
  fact token) of -log beta_i, minus the log of the score beta_i^T a fact token would have after one
  sequence, so a fact token's score stays near 1 while the capacity term makes the rest forget. Not
  in the papers: in a few hundred steps (theirs are 10,000) the soft objective alone did not
  separate fact tokens from prose (docs/training.md). The facts are all of a document's
  statements, asked about or not.
- Ranking stated facts (rg, rg10; long-range documents): L_rank = mean over (layer, kv head, fact
  token) of max(0, s_(M) - s_f), where s_i = (t - i) log beta_i is the log of the score eviction
  ranks by at the document's last position t (SPEC §1) and s_(M) the M-th best score among the
  other tokens: zero exactly when every fact token would survive a top-M eviction there. L_keep
  raises the facts' scores alone; this term also lowers the prose that outranks them. Not in the
  papers.
- Anchoring the rest (rg, rg10; --anchor): L_anchor = mean over (layer, kv head, token that is not a
  stated fact) of (log(-log beta_i) - log(-log beta_ref_i))^2, beta_ref from a reference gate
  reading the same hidden states. Top-M eviction ranks by (t - i) log beta_i, so the order of two
  tokens is that of log(-log beta_i) + log(t - i): this term holds that axis where the reference
  gate put it (a gate whose prose ranking keeps perplexity) while L_keep and L_rank lift the facts.
  Not in the papers.
"""
import torch
import torch.nn.functional as F


def quality_terms(student_logits, teacher_logits, ids):
    """Per position t < T - 1 (the ones with a next token): forward KL and next-token cross-entropy, [B, T - 1] each."""
    log_q = F.log_softmax(student_logits[:, :-1].float(), dim=-1)
    log_p = F.log_softmax(teacher_logits[:, :-1].float(), dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    ce = -log_q.gather(-1, ids[:, 1:, None]).squeeze(-1)
    return kl, ce


def predicts_answer(answer_mask):
    """[B, T] answer tokens -> [B, T - 1] positions whose next token is one."""
    return answer_mask[:, 1:]


def retained_mass(bias):
    """sum_{i<=t} beta_i^(t-i) for every t: [B, H, T, T] bias -> [B, H, T] (exp(-inf) = 0 after t)."""
    return bias.exp().sum(-1)


def capacity_loss(biases, memory, global_budget):
    """TRIM-KV's per-head hinge, or DBTrimKV's global one (global_budget), over every layer's bias."""
    mass = torch.stack([retained_mass(biases[l]) for l in sorted(biases)])  # [L, B, H, T]
    L, _, H, T = mass.shape
    if T <= memory:  # no step can exceed M: the hinge is zero
        return mass.sum() * 0.0
    if global_budget:
        over = F.relu(mass.sum(dim=(0, 2)) - L * H * memory)  # [B, T]
        return over.sum(-1).mean() / (L * H * T * (T - memory))
    over = F.relu(mass - memory)
    return over.sum(-1).mean() / (T * (T - memory))


def sparsity_loss(gates):
    g = torch.stack([gates[l] for l in sorted(gates)])
    return (g + g * (1 - g)).mean()


def distill_loss(student_hidden, teacher_hidden):
    """Squared L2 distance of the final hidden states, averaged over tokens and components."""
    return (student_hidden.float() - teacher_hidden.float()).pow(2).mean()


def keep_loss(log_betas, fact_mask):
    """T * mean of -log beta over every layer, kv head and fact token ([B, T] mask)."""
    lb = torch.stack([log_betas[l] for l in sorted(log_betas)])  # [L, B, H, T]
    T = lb.shape[-1]
    return -lb.permute(0, 2, 1, 3)[:, :, fact_mask].mean() * T


def rank_loss(log_betas, fact_mask, memory):
    """L_rank over every layer's log beta [B, H, T] and a [B, T] fact mask, at top-M eviction's
    budget `memory`; zero for a document whose other tokens are M or fewer (nothing is evicted)."""
    lb = torch.stack([log_betas[l] for l in sorted(log_betas)])  # [L, B, H, T]
    T = lb.shape[-1]
    score = lb * torch.arange(T - 1, -1, -1, dtype=lb.dtype, device=lb.device)  # (t - i) log beta_i, t = T - 1
    terms = []
    for b in range(lb.shape[1]):
        facts = fact_mask[b]
        others = score[:, b][..., ~facts]  # [L, H, T - F]
        if not bool(facts.any()) or others.shape[-1] <= memory:
            continue
        mth = others.topk(memory, dim=-1).values[..., -1:]  # the M-th best other score per head
        terms.append(F.relu(mth - score[:, b][..., facts]).mean())
    return torch.stack(terms).mean() if terms else lb.sum() * 0.0


def log_decay_rate(log_beta):
    """log(-log beta): the axis eviction ranks tokens on (see L_anchor); a beta that rounds to 1 is held at
    -log beta = 1e-20 rather than sent to -inf."""
    return (-log_beta).clamp(min=1e-20).log()


def anchor_loss(log_betas, reference, fact_mask=None):
    """L_anchor over every layer's log beta [B, H, T] against the reference gate's (same keys), the
    tokens of a [B, T] fact mask left out; zero when every token is a fact."""
    lb = torch.stack([log_betas[l] for l in sorted(log_betas)])  # [L, B, H, T]
    ref = torch.stack([reference[l] for l in sorted(log_betas)])
    sq = (log_decay_rate(lb) - log_decay_rate(ref)).pow(2).permute(0, 2, 1, 3)  # [L, H, B, T]
    rest = torch.ones(sq.shape[2:], dtype=torch.bool, device=sq.device) if fact_mask is None else ~fact_mask
    return sq[:, :, rest].mean() if bool(rest.any()) else lb.sum() * 0.0


def objective(gm, ids, memory, lam, answer_mask=None, answer_weight=0.0, fact_mask=None, keep_weight=0.0,
              rank_weight=0.0, global_budget=None, anchor=None, anchor_weight=0.0):
    """The gate's paper objective on one batch of token ids [B, T]: (loss, its parts). With an
    answer mask [B, T] (bool) holding answer tokens and answer_weight > 0, the quality term over the
    positions that predict them is added with that weight (part "answer"); with a fact mask and
    keep_weight > 0 (rg, rg10), keep_weight * L_keep (part "keep"); rank_weight > 0 (rg, rg10),
    rank_weight * L_rank at M = memory (part "rank"). global_budget: the capacity hinge DBTrimKV's
    (True) or TRIM-KV's per head (False); by default the gate's policy (rg10 global, rg per head).
    anchor (a retention gate, frozen) and anchor_weight > 0: anchor_weight * L_anchor against it on
    the same layer inputs (part "anchor")."""
    on_answers = answer_mask is not None and answer_weight > 0 and bool(predicts_answer(answer_mask).any())
    if gm.gate.kind == "wg":
        teacher = gm.teacher(ids, output_hidden_states=True).hidden_states[-1]
        student = gm.student(ids, output_hidden_states=True).hidden_states[-1]
        distill, sparsity = distill_loss(student, teacher), sparsity_loss(gm.outputs)
        admitted = torch.stack([(g >= 0.1).float().mean() for g in gm.outputs.values()]).mean()  # tau = 0.1
        parts = {"distill": distill, "sparsity": sparsity, "admitted": admitted}
        loss = distill + lam * sparsity
        if on_answers:
            m = predicts_answer(answer_mask)
            parts["answer"] = distill_loss(student[:, :-1][m], teacher[:, :-1][m])
            loss = loss + answer_weight * parts["answer"]
        return loss, parts
    teacher = gm.teacher(ids).logits
    student = gm.student(ids).logits
    kl_t, ce_t = quality_terms(student, teacher, ids)
    kl, ce = kl_t.mean(), ce_t.mean()
    cap = capacity_loss(gm.biases, memory, global_budget=gm.gate.kind == "rg10" if global_budget is None else global_budget)
    loss, parts = kl + ce + lam * cap, {"kl": kl, "ce": ce, "cap": cap}
    if on_answers:
        m = predicts_answer(answer_mask)
        parts["answer"] = kl_t[m].mean() + ce_t[m].mean()
        loss = loss + answer_weight * parts["answer"]
    if fact_mask is not None and keep_weight > 0 and bool(fact_mask.any()):
        parts["keep"] = keep_loss(gm.outputs, fact_mask)
        loss = loss + keep_weight * parts["keep"]
    if fact_mask is not None and rank_weight > 0 and bool(fact_mask.any()):
        parts["rank"] = rank_loss(gm.outputs, fact_mask, memory)
        loss = loss + rank_weight * parts["rank"]
    if anchor is not None and anchor_weight > 0:
        with torch.no_grad():  # the reference reads what the gate read: this run's layer inputs
            reference = {l: anchor(l, gm.normed[l]) for l in gm.outputs}
        parts["anchor"] = anchor_loss(gm.outputs, reference, fact_mask)
        loss = loss + anchor_weight * parts["anchor"]
    return loss, parts
