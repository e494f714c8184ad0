"""Run the CLI's real entry point (`reconciler.cli.app.main`) inside the test process.

A subprocess costs ~0.3-0.9 s (a new interpreter importing pydantic, typer, SQLAlchemy);
the same call in-process costs ~10 ms, which is what lets the manifest suites run a
hundred CLI calls in seconds. It is the same code path as the console script: argument
parsing, the verb, the error-to-exit-code mapping and the rendering; only the streams
are captured. Anything that escapes `main()` other than SystemExit is what the console
script would print as a Python traceback, so it is reported as one on stderr (tests
assert that no "Traceback" ever appears).

Each module that uses it also checks a few calls through `tests.helpers.run_cli` (a real
subprocess) for identical results, so the shortcut is itself under test.
"""

from __future__ import annotations

import contextlib
import io
import sys
import threading
import traceback

from tests.helpers import Result

_lock = threading.Lock()
_registered = False


def cli(*args: str, store: str, input: str | None = None) -> Result:
    """`reconciler --store STORE ARGS...` in-process; returns (code, stdout, stderr)."""
    global _registered
    from reconciler.cli import app as app_module

    out, err = io.StringIO(), io.StringIO()
    with _lock:
        saved = sys.argv, sys.stdin
        sys.argv = ["reconciler", "--store", store, *args]
        sys.stdin = io.StringIO(input or "")
        code = 0
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                if _registered:  # verb modules register themselves once per process, as in the script
                    with _patched(app_module, "_register_optional", lambda: None):
                        app_module.main()
                else:
                    _registered = True
                    app_module.main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # what the console script would die with
            err.write("Traceback (most recent call last):\n" + traceback.format_exc())
            code = 1
        finally:
            sys.argv, sys.stdin = saved
    return Result(code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _patched(module, name, value):
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)
