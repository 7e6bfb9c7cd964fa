"""The ranking method (kvpolicy_tools.train.attention_targets and .ranking) on a tiny random LLaMA:
  - future_max is the max over later queries and the GQA group, as by brute force;
  - the recorder's gate inputs and targets are what transformers' eager attention gives on the same
    model (the attention block's input after its RMSNorm; the softmax probabilities), and the model's
    output is unchanged by recording;
  - the rank key orders entries as SPEC §1's score log_beta * (t + 1 - i), and the token-level key
    as SPEC §8's max over heads;
  - the RankNet pairs: a gate that orders as the targets has recall 1 and a lower loss than one that
    orders against them; recall counted by hand;
  - kvpolicy-gate-targets writes resumable shards, in parts one process each, and refuses a folder made
    with other settings (restated variables and the model's dtype among them); bfloat16 targets are the
    float32 ones of the same documents, rounded;
    kvpolicy-rank-gates lowers the held-out loss, a run stopped and resumed writes the same gate as
    one run, and its gate is a retention gate gate_file reads; a gate kind and policy that do not go
    together, and a checkpoint of another run, are refused;
  - kvpolicy-rank-gates making its documents' targets itself (--tiny, as --gguf) trains on the
    targets kvpolicy-gate-targets stores (x to fp16), resumes to the same gate, and a --time-budget
    overrun exports the gate it has, marked truncated.
usage: PYTHONPATH=python/tools tests/with_torch.sh -m pytest -q -p no:cacheprovider tests/train/test_ranking.py
"""
import glob
import json
import os
import types

import pytest
import torch
from safetensors import safe_open

from kvpolicy_tools.train import ranking, train_gates
from kvpolicy_tools.train.attention_targets import TargetRecorder, future_max
from kvpolicy_tools.train.gates import gate_file, make_gate

from in_process import run_module

root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
text = os.path.join(root, "docs", "architecture.md")  # prose for the tiny model's byte tokens
TARGET_ARGS = ("--tiny", "--text", text, "--seq-len", "256", "--steps-per-document", "4", "--first-step", "32",
               "--threads", "1")
RANK_ARGS = ("--gate", "rg", "--width", "16", "--epochs", "3", "--memory-range", "8", "32", "--lr", "1e-2",
             "--threads", "1", "--checkpoint-every", "2", "--no-progress", "--validate", "1")


def run(module, *args):
    p = run_module(module, *args)
    return p.returncode, p.stdout + p.stderr


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ranking") / "targets")
    rc, log = run("kvpolicy_tools.train.attention_targets", *TARGET_ARGS, "--out", out, "--documents", "2")
    assert rc == 0, log
    for part in ("0/2", "1/2"):  # two processes' parts fill the folder: documents 2 and 3, one each
        rc, log = run("kvpolicy_tools.train.attention_targets", *TARGET_ARGS, "--out", out, "--documents", "4",
                      "--part", part)
        assert rc == 0, log
        assert log.count("doc-") == 1, f"part {part} remade the shards it found, or made another part's:\n{log}"
    return out


def test_future_max_is_the_max_over_later_queries():
    torch.manual_seed(0)
    A = torch.rand(6, 40, 40).tril()
    steps = [0, 7, 8, 39]
    y = future_max(A, 3, steps)
    for h in range(2):
        for k, t in enumerate(steps):
            assert torch.equal(y[h, k], A[3 * h:3 * h + 3, t:].amax(dim=(0, 1)))


def test_targets_are_eager_attention():
    model, _ = train_gates.tiny_model(0)
    ids = torch.tensor(list(open(text, "rb").read()[:96]))
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        ref = model.model(input_ids=ids[None], use_cache=False, output_attentions=True, output_hidden_states=True)
    steps = [5, 40, 95]
    x, y = TargetRecorder(model)(ids, steps)
    groups = model.config.num_attention_heads // model.config.num_key_value_heads
    for l, layer in enumerate(model.model.layers):
        with torch.no_grad():
            normed = layer.input_layernorm(ref.hidden_states[l])[0]
        assert torch.allclose(x[l], normed, atol=1e-6), f"layer {l}: the gate input is not the normed block input"
        assert torch.allclose(y[l], future_max(ref.attentions[l][0], groups, steps), atol=1e-6), f"layer {l}: targets"
    with torch.no_grad():
        out = model.model(input_ids=ids[None], use_cache=False).last_hidden_state
    assert torch.allclose(out, ref.last_hidden_state, atol=1e-5), "recording changed the model's output"


def test_rank_key_orders_as_the_spec_score():
    torch.manual_seed(1)
    L, H, T = 2, 3, 50
    log_beta = -torch.rand(L, H, T) * 0.05
    steps = torch.tensor([10, 30, 49])
    q = ranking.rank_keys(log_beta, steps)
    for k, t in enumerate(steps.tolist()):
        score = log_beta[..., :t + 1] * (t + 1 - torch.arange(t + 1))  # SPEC §1: log_beta * (n + 1 - p)
        assert torch.equal(q[..., k, :t + 1].argsort(dim=-1), score.argsort(dim=-1))
        best = score.reshape(L * H, -1).amax(dim=0)  # SPEC §8: a position's score is its best head's
        assert torch.equal(q[..., k, :t + 1].reshape(L * H, -1).amax(dim=0).argsort(), best.argsort())


def test_ranking_pairs_loss_and_recall():
    gen = torch.Generator().manual_seed(0)
    y = torch.rand(4, 30) + 1e-3
    good, g_recall = ranking.ranking_pairs(y.log() * 10, y, 8, 64, gen)
    bad, b_recall = ranking.ranking_pairs(-y.log() * 10, y, 8, 64, gen)
    assert g_recall.item() == 1.0 and b_recall.item() == 0.0
    assert good.item() < 0.05 < bad.item()
    weighted, _ = ranking.ranking_pairs(y.log() * 10, y, 8, 64, gen, weighted=True)
    assert weighted.item() < bad.item()
    # by hand: the oracle keeps columns 0 and 1 (targets 4, 3); the keys' top 2 are columns 1 and 2
    _, recall = ranking.ranking_pairs(torch.tensor([[0.0, 5.0, 4.0, 1.0]]), torch.tensor([[4.0, 3.0, 2.0, 1.0]]),
                                      2, 8, gen)
    assert recall.item() == 0.5


def test_fact_pairs_take_the_facts_the_oracle_keeps():
    torch.manual_seed(2)
    R, n, M, pairs, focus_pairs = 3, 40, 8, 64, 16
    y = torch.rand(R, n) + 1e-3
    focus = torch.zeros(R, n, dtype=torch.bool)
    fact = y[0].argsort(descending=True)[M // 2]  # row 0: a fact inside the oracle's keep set
    focus[0, fact] = True
    focus[1, y[1].argsort()[0]] = True  # row 1: a fact the oracle drops; row 2: none
    for fp in (0, focus_pairs):
        keys = torch.randn(R, n)
        keys[0, fact] = -100.0  # the gate ranks the fact last: every pair holding it is wrong by a wide margin
        keys.requires_grad_(True)
        loss, _ = ranking.ranking_pairs(keys, y, M, pairs, torch.Generator().manual_seed(0), focus=focus, focus_pairs=fp)
        loss.backward()
        # each pair (kept = the fact) adds -1 / (R * pairs) to the fact's gradient (softplus' slope is 1 there)
        share = -keys.grad[0, fact].item() * R * pairs
        if fp:
            assert share >= focus_pairs - 1e-3, f"{share:.2f} pairs hold the fact, not at least {focus_pairs}"
            assert keys.grad[1].abs().sum() > 0 and keys.grad[2].abs().sum() > 0
        else:
            without = share
    assert share > without + focus_pairs / 2, f"the fact's pairs: {without:.1f} without focus, {share:.1f} with"


def test_token_level_ranks_positions_by_the_heads_mean_target():
    gen = torch.Generator().manual_seed(0)
    T = 12
    y = torch.rand(2, 2, 1, T)
    order = y.mean(dim=(0, 1))[0]  # the position's target
    # a gate whose best head ranks each position as its target (others far below): recall 1
    age = (T - torch.arange(T)).float()  # t + 1 - i at t = T - 1
    log_beta = torch.full((2, 2, T), -10.0)
    log_beta[1, 0] = -torch.exp(-order * 20) / age  # key -(log decay rate + log age) = 20 * target
    shard = {"steps": torch.tensor([T - 1]), "y": y}
    _, recall = ranking.document_loss(log_beta, shard, "token", [4], 16, 1.0, gen)
    assert recall.item() == 1.0


def test_heads_target_aggregates_a_positions_heads():
    y = torch.tensor([[0.1, 0.9], [0.3, 0.0], [0.8, 0.3]])  # [heads, positions]
    assert torch.allclose(ranking.heads_target(y, "mean"), torch.tensor([[0.4, 0.4]]))
    assert torch.equal(ranking.heads_target(y, "max"), torch.tensor([[0.8, 0.9]]))
    assert torch.allclose(ranking.heads_target(y, "2"), torch.tensor([[0.55, 0.6]]))
    assert torch.allclose(ranking.heads_target(y, "9"), ranking.heads_target(y, "mean"))  # more than the heads: all


def test_targets_resume_and_refuse_other_settings(targets):
    assert len(glob.glob(os.path.join(targets, "doc-*.pt"))) == 4
    shard = torch.load(os.path.join(targets, "doc-00000.pt"))
    L, T = shard["x"].shape[:2]
    assert shard["y"].shape == (L, 2, 4, T) and shard["x"].dtype == torch.float16
    with open(os.path.join(targets, "targets.json")) as f:
        assert json.load(f)["model"]["num_key_value_heads"] == 2
    rc, log = run("kvpolicy_tools.train.attention_targets", *TARGET_ARGS, "--out", targets, "--documents", "4",
                  "--prose-fraction", "0.5")
    assert rc != 0 and "other settings (prose_fraction)" in log, log
    rc, log = run("kvpolicy_tools.train.attention_targets", *TARGET_ARGS, "--out", targets, "--documents", "4",
                  "--restated-variables")
    assert rc != 0 and "other settings (restated_variables)" in log, log
    rc, log = run("kvpolicy_tools.train.attention_targets", *TARGET_ARGS, "--out", targets, "--documents", "4",
                  "--dtype", "bfloat16")
    assert rc != 0 and "other settings (dtype)" in log, log


def test_bfloat16_targets_are_float32_targets_rounded(targets, tmp_path):
    out = str(tmp_path / "bf16")
    rc, log = run("kvpolicy_tools.train.attention_targets", *TARGET_ARGS, "--out", out, "--documents", "1",
                  "--dtype", "bfloat16")
    assert rc == 0, log
    with open(os.path.join(out, "targets.json")) as f:
        assert json.load(f)["settings"]["dtype"] == "bfloat16"
    a, b = (torch.load(os.path.join(d, "doc-00000.pt")) for d in (targets, out))
    for k in ("ids", "answers", "facts", "steps"):
        assert torch.equal(a[k], b[k]), k
    assert b["x"].dtype == torch.float16 and b["y"].dtype == torch.float32
    x_error = float((a["x"].float() - b["x"].float()).norm() / a["x"].float().norm())
    assert 0 < x_error < 0.05, x_error  # rounded (not float32's), and close
    assert 0 < float((a["y"] - b["y"]).abs().max()) < 0.05


def test_ranking_trains_resumes_and_writes_a_gate(targets, tmp_path):
    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    rc, log = run("kvpolicy_tools.train.ranking", *RANK_ARGS, "--targets", targets, "--out", whole)
    assert rc == 0, log
    rc, log = run("kvpolicy_tools.train.ranking", *RANK_ARGS, "--targets", targets, "--out", parts, "--stop-after", "5")
    assert rc == 0 and "stopped after step 5" in log, log
    rc, log = run("kvpolicy_tools.train.ranking", *RANK_ARGS, "--targets", targets, "--out", parts)
    assert rc == 0 and "resumed at step 5" in log, log
    tensors = []
    for d in (whole, parts):
        with safe_open(os.path.join(d, "gate.safetensors"), "pt") as f:
            tensors.append({k: f.get_tensor(k) for k in f.keys()})
    assert tensors[0].keys() == tensors[1].keys()
    for k in tensors[0]:
        assert torch.equal(tensors[0][k], tensors[1][k]), f"{k}: a resumed run wrote another gate"
    with open(os.path.join(whole, "summary.json")) as f:
        summary = json.load(f)
    assert summary["method"] == "ranking" and summary["tokens_per_second"] > 0 and summary["documents"] == 3
    kind, width, load = gate_file(os.path.join(whole, "gate.safetensors"))
    assert (kind, width) == ("rg", 16)
    # the held-out shard's loss falls from the initial gate's
    with open(os.path.join(targets, "targets.json")) as f:
        config = types.SimpleNamespace(**json.load(f)["model"])
    held_out = sorted(glob.glob(os.path.join(targets, "doc-*.pt")))[-1:]
    torch.manual_seed(0)
    initial = make_gate("rg", config, 16, bias_init=8.0)
    trained = make_gate("rg", config, 16)
    load(trained, config.head_dim)
    before, _ = ranking.evaluate(initial, held_out, "trimkv", (8, 16), 64, 1.0)
    after, _ = ranking.evaluate(trained, held_out, "trimkv", (8, 16), 64, 1.0)
    assert after < before, f"the held-out ranking loss went from {before} to {after}"
    assert summary["validation"]["shards"] == 1
    # a checkpoint of another run is refused
    rc, log = run("kvpolicy_tools.train.ranking", *RANK_ARGS, "--targets", targets, "--out", whole, "--tau", "0.5")
    assert rc != 0 and "--tau" in log, log


def test_ranking_refuses_a_policy_the_gate_is_not_for(targets, tmp_path):
    rc, log = run("kvpolicy_tools.train.ranking", "--gate", "rg", "--policy", "dbtrimkv", "--targets", targets,
                  "--out", str(tmp_path / "x"))
    assert rc != 0 and "--policy dbtrimkv" in log, log
    rc, log = run("kvpolicy_tools.train.ranking", "--gate", "rg", "--fact-pairs", "40", "--targets", targets,
                  "--out", str(tmp_path / "z"))
    assert rc != 0 and "--fact-pairs 40" in log, log
    rc, log = run("kvpolicy_tools.train.ranking", "--gate", "rg", "--targets", str(tmp_path), "--out", str(tmp_path / "y"))
    assert rc != 0 and "no targets.json" in log, log


def test_probe_targets_read_the_document_with_every_fact_asked(targets, tmp_path):
    probed = str(tmp_path / "probed")
    rc, log = run("kvpolicy_tools.train.attention_targets", *TARGET_ARGS, "--out", probed, "--documents", "4", "--probe")
    assert rc == 0, log
    model, _ = train_gates.tiny_model(0)
    model.config._attn_implementation = "eager"
    groups = model.config.num_attention_heads // model.config.num_key_value_heads
    data = train_gates.LongRangeData(types.SimpleNamespace(seed=0, prose_fraction=0.25, seq_len=256, numerals=0.25,
                                                           text=text), None)
    grew = 0
    for d in range(4):
        plain = torch.load(os.path.join(targets, f"doc-{d:05d}.pt"))
        with_probe = torch.load(os.path.join(probed, f"doc-{d:05d}.pt"))
        # the shard holds the document alone, and a causal model reads it the same with the probe after it
        assert torch.equal(plain["ids"], with_probe["ids"]) and torch.equal(plain["steps"], with_probe["steps"])
        assert plain["x"].shape == with_probe["x"].shape and torch.allclose(plain["x"].float(), with_probe["x"].float(), atol=1e-2)
        # every target is the max over a superset of later queries: never lower, higher where the probe reads more
        assert (with_probe["y"] >= plain["y"] - 1e-5).all(), f"document {d}: a probed target below the plain one"
        # and the probe's queries are among them: eager attention over the document and its probe
        # (longrange.probe's text, as LongRangeData gives it) has these targets
        _, _, _, probe = data.probed(d)
        grew += probe.numel() > 0
        ids = torch.cat([plain["ids"], probe[0]])
        with torch.no_grad():
            ref = model.model(input_ids=ids[None], use_cache=False, output_attentions=True)
        for l in range(len(model.model.layers)):
            y = future_max(ref.attentions[l][0], groups, with_probe["steps"].tolist())[..., :plain["ids"].numel()]
            assert torch.allclose(with_probe["y"][l], y, atol=1e-6), f"document {d}, layer {l}: not the probed targets"
    assert grew, "no document with a probe among the four"
    rc, log = run("kvpolicy_tools.train.attention_targets", *TARGET_ARGS, "--out", targets, "--documents", "4", "--probe")
    assert rc != 0 and "other settings (probe)" in log, log
    rc, log = run("kvpolicy_tools.train.attention_targets", *TARGET_ARGS, "--out", probed, "--documents", "4")
    assert rc != 0 and "other settings (probe)" in log, log  # a setting the folder has and the run lacks


def test_pack_gates_holds_both_layouts_gates(tmp_path):
    from kvpolicy_tools.train.pack_gates import pack
    from kvpolicy_tools.train.runs import export

    config = types.SimpleNamespace(num_hidden_layers=2, hidden_size=24, num_key_value_heads=2, num_attention_heads=4,
                                   head_dim=6, hidden_act="silu")
    torch.manual_seed(0)
    per_head, token = make_gate("rg", config, 8, bias_init=3.0), make_gate("rg10", config, 4, bias_init=9.0)
    paths = {name: str(tmp_path / f"{name}.safetensors") for name in ("per_head", "token", "both", "again")}
    export(per_head, paths["per_head"], 6, True, {"kvpolicy_gate": "rg"})
    export(token, paths["token"], 6, True, {"kvpolicy_gate": "rg10", "trained_for": "token"})
    pack(paths["per_head"], paths["token"], paths["both"])
    for token_level, source in ((False, per_head), (True, token)):
        kind, width, load = gate_file(paths["both"], token_level=token_level)
        assert (kind, width) == (source.kind, 8 if source is per_head else 4)
        loaded = make_gate(kind, config, width)
        load(loaded, 6)
        x = torch.randn(1, 5, 24)
        assert torch.allclose(loaded(0, x), source(0, x), atol=0.05), f"token_level={token_level}: another gate"
    with safe_open(paths["both"], "pt") as f:
        assert json.loads(f.metadata()["token_level"])["trained_for"] == "token"
        assert f.metadata()["kvpolicy_gate"] == "rg"
    with pytest.raises(ValueError, match="no token-level gate"):
        gate_file(paths["per_head"], token_level=True)
    # a packed file gives its per-head gate as PER_HEAD and its token-level gate as TOKEN_LEVEL
    pack(paths["both"], paths["both"], paths["again"])
    with safe_open(paths["both"], "pt") as f, safe_open(paths["again"], "pt") as g:
        assert sorted(f.keys()) == sorted(g.keys()) and all(torch.equal(f.get_tensor(k), g.get_tensor(k)) for k in f.keys())
        assert f.metadata() == g.metadata()
    os.remove(paths["again"])
    # DBTrimKV's global ranking reads tied gates: its per-head gate is refused as rg; its token-level gate
    # may be rg (SPEC §8: in that layout both policies rank positions by the max over every head)
    export(per_head, paths["per_head"], 6, True, {"kvpolicy_gate": "rg", "policy": "dbtrimkv"})
    with pytest.raises(SystemExit, match="per-head layout reads rg10 gates only"):
        pack(paths["per_head"], paths["token"], paths["again"])
    assert not os.path.exists(paths["again"])
    export(token, paths["per_head"], 6, True, {"kvpolicy_gate": "rg10", "policy": "dbtrimkv"})
    export(per_head, paths["token"], 6, True, {"kvpolicy_gate": "rg", "trained_for": "token"})
    pack(paths["per_head"], paths["token"], paths["again"])
    assert [gate_file(paths["again"], token_level=t)[0] for t in (False, True)] == ["rg10", "rg"]
    os.remove(paths["again"])
    # scale_gate scales both layouts' readouts, each by its own kind's names
    from kvpolicy_tools.train.scale_gate import scale
    scaled = str(tmp_path / "scaled.safetensors")
    scale(paths["both"], 0.5, scaled)
    for token_level, source in ((False, per_head), (True, token)):
        kind, width, load = gate_file(scaled, token_level=token_level)
        loaded = make_gate(kind, config, width)
        load(loaded, 6)
        z_scaled, z = (torch.logit(g(0, torch.ones(1, 3, 24) * 0.1).exp().clamp(1e-6, 1 - 1e-6)) for g in (loaded, source))
        assert torch.allclose(z_scaled, 0.5 * z, atol=0.05), f"token_level={token_level}: the logit is not halved"


def test_ranking_makes_its_own_targets(targets, tmp_path):
    online = ("--tiny", "--text", text, "--seq-len", "256", "--steps-per-document", "4", "--first-step", "32",
              "--documents", "3", "--device", "cpu")
    args = RANK_ARGS[:RANK_ARGS.index("--validate")]  # (the last option)
    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    rc, log = run("kvpolicy_tools.train.ranking", *args, *online, "--out", whole)
    assert rc == 0, log
    rc, log = run("kvpolicy_tools.train.ranking", *args, *online, "--out", parts, "--stop-after", "4")
    assert rc == 0 and "stopped after step 4" in log, log
    rc, log = run("kvpolicy_tools.train.ranking", *args, *online, "--out", parts)
    assert rc == 0 and "resumed at step 4" in log, log
    gates = []
    for d in (whole, parts):
        with safe_open(os.path.join(d, "gate.safetensors"), "pt") as f:
            gates.append({k: f.get_tensor(k) for k in f.keys()})
            assert f.metadata()["targets_made"] == "while training"
    for k in gates[0]:
        assert torch.equal(gates[0][k], gates[1][k]), f"{k}: a resumed run wrote another gate"
    # the targets it made are the stored ones: the same documents, steps and targets
    from kvpolicy_tools.train.attention_targets import document_shard
    from kvpolicy_tools.train.documents import document_data
    a = types.SimpleNamespace(seed=0, prose_fraction=0.25, seq_len=256, numerals=0.25, text=text, probe=False,
                              steps_per_document=4, first_step=32)
    model, tok = train_gates.tiny_model(0)
    made = document_shard(TargetRecorder(model), document_data(a, tok), 1, a)
    stored = torch.load(os.path.join(targets, "doc-00001.pt"))
    for k in ("ids", "answers", "facts", "steps"):
        assert torch.equal(made[k], stored[k]), k
    assert torch.equal(made["x"].to(torch.float16), stored["x"]) and torch.allclose(made["y"], stored["y"])
    rc, log = run("kvpolicy_tools.train.ranking", *args, *online, "--out", str(tmp_path / "v"), "--validate", "1")
    assert rc != 0 and "--validate 1" in log, log
    rc, log = run("kvpolicy_tools.train.ranking", *args, "--tiny", "--out", str(tmp_path / "n"))
    assert rc != 0 and "--documents 0" in log, log
    # a run past its time budget exports what it has
    rc, log = run("kvpolicy_tools.train.ranking", *args, *online, "--out", str(tmp_path / "t"), "--time-budget", "1e-6")
    assert rc == 0 and "overrun: exported after step 1 " in log, log
    with safe_open(os.path.join(tmp_path, "t", "gate.safetensors"), "pt") as f:
        assert f.metadata()["truncated_at"] == "1"
