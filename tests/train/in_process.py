"""The package's commands run inside the test process: `python -m MODULE ARGS` as runpy runs it, its
output captured. Each command imports torch and transformers, about 20 s a process on CI's 2-core
machines; the training tests run commands dozens of times, so they run them where those imports are
already made. What a process gives back is kept: the exit status (0; SystemExit's code; 1 and the
message for a SystemExit with a text; 1 and the traceback for any other exception), stdout and stderr.
"""
import contextlib
import io
import runpy
import subprocess
import sys
import traceback
import warnings


def run_module(module, *args):
    """`python -m module args...` in this process: a subprocess.CompletedProcess."""
    out, err = io.StringIO(), io.StringIO()
    argv, sys.argv = sys.argv, ["-m", *map(str, args)]  # runpy puts the module's path in argv[0], as -m does
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            # the tests import the module before running it as __main__: runpy warns, -m would not
            warnings.filterwarnings("ignore", message=".*found in sys.modules after import of package",
                                    category=RuntimeWarning)
            try:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
                code = 0
            except SystemExit as e:
                code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
                if not isinstance(e.code, (int, type(None))):
                    print(e.code, file=sys.stderr)
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        sys.argv = argv
    command = [sys.executable, "-m", module, *map(str, args)]
    return subprocess.CompletedProcess(command, code, out.getvalue(), err.getvalue())
