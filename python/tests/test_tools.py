"""The evaluation and training package (kvpolicy_tools) installed with the bindings: each of its
commands is on the PATH of the environment it was installed into, and answers with its usage."""
import contextlib
import importlib.metadata
import io
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
    "kvpolicy-pack-gates": "kvpolicy_tools.train.pack_gates:main",
    "kvpolicy-train-kvzap": "kvpolicy_tools.train.kvzap:main",
    "kvpolicy-train-qfilters": "kvpolicy_tools.train.qfilters:main",
    "kvpolicy-gguf-to-lm": "kvpolicy_tools.convert.gguf_to_lm:main",
    "kvpolicy-fetch-model": "kvpolicy_tools.convert.fetch_model:main",
    "kvpolicy-convert-checkpoint": "kvpolicy_tools.convert.convert_checkpoint:main",
}


def test_the_commands_are_declared():
    assert {name: e.value for name, e in entry_points().items()} == COMMANDS


def entry_points():
    return {e.name: e for e in importlib.metadata.entry_points(group="console_scripts")
            if e.name.startswith("kvpolicy-")}


def run_in_process(entry_point, argv):
    """What the installed script runs (`sys.exit(main())`, argv[0] its own path), in this process:
    (exit status, stdout and stderr). Three of the commands import torch and transformers, about 20 s
    a process on CI's 2-core machines, where the test process has imported them already."""
    out = io.StringIO()
    saved, sys.argv = sys.argv, argv
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                code = entry_point.load()()
            except SystemExit as e:
                code = e.code
                if not isinstance(code, (int, type(None))):  # Python prints a text's exit, status 1
                    print(code, file=sys.stderr)
                    code = 1
    finally:
        sys.argv = saved
    return (0 if code is None else code), out.getvalue()


def test_each_command_runs_and_prints_its_usage():
    points = entry_points()
    for name in COMMANDS:
        exe = os.path.join(os.path.dirname(sys.executable), name)
        assert os.access(exe, os.X_OK), f"{name} is not installed beside {sys.executable}"
        # argparse's commands answer --help; the two positional ones print their usage when given none
        args = [] if name in ("kvpolicy-gguf-to-lm", "kvpolicy-quality-plot") else ["--help"]
        code, out = run_in_process(points[name], [exe, *args])
        assert (code == 0) == bool(args), f"{name} {args}: exit status {code}\n{out[-500:]}"
        assert name in out, f"{name}: its usage does not name it\n{out[-500:]}"


def test_an_installed_command_runs_as_its_own_process():
    # the scripts pip writes are one template: one of them run as a user runs it
    exe = os.path.join(os.path.dirname(sys.executable), "kvpolicy-fetch-model")
    p = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "kvpolicy-fetch-model" in p.stdout, p.stdout + p.stderr
