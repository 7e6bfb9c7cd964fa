"""The evaluation and training package (kvpolicy_tools) installed with the bindings: each of its
commands is on the PATH of the environment it was installed into, and answers with its usage."""
import importlib.metadata
import os
import subprocess
import sys

COMMANDS = {
    "kvpolicy-retrieval": "kvpolicy_tools.eval.retrieval:main",
    "kvpolicy-quality": "kvpolicy_tools.eval.quality:main",
    "kvpolicy-quality-plot": "kvpolicy_tools.eval.quality_plot:main",
    "kvpolicy-train-gates": "kvpolicy_tools.train.train_gates:main",
    "kvpolicy-gate-targets": "kvpolicy_tools.train.attention_targets:main",
    "kvpolicy-rank-gates": "kvpolicy_tools.train.ranking:main",
    "kvpolicy-gguf-to-lm": "kvpolicy_tools.convert.gguf_to_lm:main",
    "kvpolicy-fetch-model": "kvpolicy_tools.convert.fetch_model:main",
    "kvpolicy-convert-checkpoint": "kvpolicy_tools.convert.convert_checkpoint:main",
}


def test_the_commands_are_declared():
    declared = {e.name: e.value for e in importlib.metadata.entry_points(group="console_scripts")
                if e.name.startswith("kvpolicy-")}
    assert declared == COMMANDS


def test_each_command_runs_and_prints_its_usage():
    for name in COMMANDS:
        exe = os.path.join(os.path.dirname(sys.executable), name)
        assert os.access(exe, os.X_OK), f"{name} is not installed beside {sys.executable}"
        # argparse's commands answer --help; the two positional ones print their usage when given none
        args = [] if name in ("kvpolicy-gguf-to-lm", "kvpolicy-quality-plot") else ["--help"]
        p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=300)
        out = p.stdout + p.stderr
        assert (p.returncode == 0) == bool(args), f"{name} {args}: rc {p.returncode}\n{out[-500:]}"
        assert name in out, f"{name}: its usage does not name it\n{out[-500:]}"
