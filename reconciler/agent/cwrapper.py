"""The run wrapper compiled from C (`reconciler-run.c`), where a C compiler exists.

The same protocol as wrapper.py's /bin/sh script, argv position for argv position, for less
CPU a run: linked statically where the C library allows (no dynamic loader, no shell to load
and parse a script), the command started by posix_spawn (a vfork) instead of a fork of the
shell. On this project's VM a process costs ~0.9 ms of CPU whatever it runs, so the saving
is a fraction of the wrapper's cost, not most of it (bench/start.py, figure 19).

`Binary` builds it once per state folder, named by the hash of its source
(`STATE/bin/reconciler-run-<hash>`, 0700), in a thread of the agent, so the first runs of a
fresh state use the sh script while it builds and a build never sits on a run's path. A copy
kept in the user's cache (`$XDG_CACHE_HOME/reconciler`) makes later state folders on the
machine take it without a compiler run. Every step is atomic (written under a temporary
name, checked by running it once, renamed), so a process killed while building leaves at
most a temporary file, never a half binary under the name spawn_run uses; and where no
compiler exists, or the build or the check fails, runs keep the sh script.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from reconciler.files import make_private_dirs

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("reconciler-run.c")
CC_ENV = "RECONCILER_CC"  # the C compiler to build the wrapper with; "none": keep the sh wrapper
BUILD_TIMEOUT = 120.0


def binary_name() -> str:
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    return f"reconciler-run-{digest}"


def compiler() -> str | None:
    """The C compiler to build with: $RECONCILER_CC, else cc, gcc or clang on PATH."""
    chosen = os.environ.get(CC_ENV)
    if chosen == "none":
        return None
    if chosen:
        return shutil.which(chosen)
    for name in ("cc", "gcc", "clang"):
        if found := shutil.which(name):
            return found
    return None


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "reconciler" / "bin"


def _works(binary: Path) -> bool:
    """The binary keeps the protocol's main line: runs a command, records its exit code."""
    with tempfile.TemporaryDirectory(prefix=".check-", dir=binary.parent) as tmp:
        run_dir = Path(tmp)
        (run_dir / "stderr").touch()
        argv = [str(binary), "-c", "-", "reconciler-run", tmp, "0", "", "", "/bin/sh", "-c", "exit 3"]
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return False
        try:
            return done.returncode == 3 and (run_dir / "exit").read_text() == "3\n"
        except OSError:
            return False


def _install(source: Path, target: Path) -> bool:
    """Copy `source` to `target` atomically (0700), checked by running it; False if not."""
    make_private_dirs(target.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
            shutil.copyfileobj(src, out)
        os.chmod(tmp, 0o700)
        if not _works(Path(tmp)):
            return False
        os.rename(tmp, target)
        return True
    except OSError:
        return False
    finally:
        Path(tmp).unlink(missing_ok=True)


def _compile(cc: str, target: Path) -> bool:
    make_private_dirs(target.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        for flags in (["-O2", "-static"], ["-O2"]):  # static where libc.a exists: no dynamic loader per run
            done = subprocess.run(
                [cc, *flags, "-o", tmp, str(SOURCE)],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=BUILD_TIMEOUT,
                check=False,
            )
            if done.returncode == 0:
                break
        if done.returncode != 0:
            log.warning("the C run wrapper did not build (%s): runs keep the sh wrapper", done.stderr.decode()[-500:])
            return False
        os.chmod(tmp, 0o700)
        if not _works(Path(tmp)):
            log.warning("the C run wrapper built but failed its check: runs keep the sh wrapper")
            return False
        os.rename(tmp, target)
        return True
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("the C run wrapper did not build (%s): runs keep the sh wrapper", exc)
        return False
    finally:
        Path(tmp).unlink(missing_ok=True)


def _sweep(folder: Path, keep: str) -> None:
    """Builds of an earlier source and what a process killed while building left (temporary
    files, check folders) go. A run still under an old build keeps its inode, and an agent
    finds runs by argv[3] and [4], never by the binary's name."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith((".reconciler-run-", ".check-")):
            try:
                stale = time.time() - entry.stat().st_mtime > 2 * BUILD_TIMEOUT  # not a build under way
            except OSError:
                continue
            if stale:
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
        elif entry.name.startswith("reconciler-run-") and entry.name != keep:
            entry.unlink(missing_ok=True)


def build(state_dir: Path) -> Path | None:
    """The C wrapper for this state folder: found, copied from the user's cache, or compiled
    (and then kept in the cache too); None where there is no compiler or it failed."""
    name = binary_name()
    target = Path(state_dir) / "bin" / name
    if os.access(target, os.X_OK):
        return target
    _sweep(target.parent, name)
    cc = compiler()
    if cc is None and os.environ.get(CC_ENV) == "none":
        return None
    cached = _cache_dir() / name
    if os.access(cached, os.X_OK) and _install(cached, target):
        return target
    if cc is None:
        log.info("no C compiler: runs use the sh wrapper")
        return None
    if not _compile(cc, target):
        return None
    with contextlib.suppress(OSError):  # best effort: a cache that cannot be written costs the next state a build
        _install(target, cached)
    return target


class Binary:
    """The C wrapper of one agent, built in a thread: `path` is None until it is ready (or
    for good, where it cannot be built), and spawn_run uses the sh script meanwhile."""

    def __init__(self, state_dir: Path) -> None:
        self.path: Path | None = None
        self._done = threading.Event()
        name = binary_name()
        ready = Path(state_dir) / "bin" / name
        if os.access(ready, os.X_OK):  # the common case after the first start: no thread
            self.path = ready
            self._done.set()
            return
        self._thread = threading.Thread(target=self._build, args=(state_dir,), name="wrapper-build", daemon=True)
        self._thread.start()

    def _build(self, state_dir: Path) -> None:
        try:
            self.path = build(state_dir)
        except Exception:  # never a reason to stop the agent: runs keep the sh wrapper
            log.warning("the C run wrapper could not be built", exc_info=True)
        finally:
            self._done.set()

    def wait(self, timeout: float | None = None) -> Path | None:
        """The binary once the build has ended (tests, benches), or None."""
        self._done.wait(timeout)
        return self.path
