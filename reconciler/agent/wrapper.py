"""The run wrapper: a few lines of /bin/sh that outlive their supervisor, or the same
protocol compiled from C (`reconciler-run.c`, built by cwrapper.py where a compiler exists).

Why /bin/sh: a Python wrapper would cost ~300 ms per run; sh costs ~1 ms, the C build less
(bench/start.py, figure 19).
Why a wrapper at all: the agent (or the controller hosting it) may die while a
run goes on. The wrapper is the run's parent, so it alone can learn the exit
status, and it leaves it in `run_dir/exit` for whoever adopts the run later.
"""

from __future__ import annotations

import pathlib
import signal

# $0 of the wrapper; shows up in `ps`, which makes stray runs easy to spot.
WRAPPER_NAME = "reconciler-run"

# Catchable signals someone may send the whole group. The wrapper catches
# them (never ignores them: ignored dispositions would be inherited by the
# user's command, caught ones are reset to the default by exec).
_CAUGHT = ("TERM", "INT", "HUP", "QUIT", "USR1", "USR2", "ALRM")
# A signal that arrives before the command started means "do not start it":
# the handler notes the code the command would have died with.
_TRAPS = "\n".join(f"trap 't={128 + getattr(signal, 'SIG' + name)}' {name}" for name in _CAUGHT)

# Positional parameters: $1 = run dir, $2 = 1 to fsync the record, $3 = the
# run's cgroup files to join, blank-separated (none: no cgroup), $4 = an address-space
# limit in KiB for `ulimit -v` (empty: none), the rest = the argv to run
# (argv[0] an absolute path, so no shell builtin can stand in for the program,
# and "$@" means no splitting, globbing or redirection).
# - `exec 2>>`: spawn_run gives the wrapper a pipe as stderr, which closes once
#   the traps are armed; groups.py waits for that before it sends a signal, so
#   no signal of ours can kill the wrapper before it records.
# - The wrapper joins the run's cgroup (a builtin echo, no fork: its pid to a
#   cgroup.procs, 0 to a v1 `tasks`, the shell's own thread, which the kernel moves
#   without its lock on every migration) before the command is forked, so all the command starts is in
#   it. A join that fails (the cgroup removed under it) leaves sh's message in the
#   run's stderr and the run unlimited, as where no cgroup could be made; it is
#   not a reason to refuse the run. `ulimit -v` is the fallback where no cgroup
#   can be made at all.
# - A signal landing after the `[ -z "$t" ]` test and before the forked child
#   has exec'd the program is absorbed: dash's (v)forked child still runs the
#   wrapper's handler until exec. Measured: up to a millisecond or so after
#   spawn_run returns, under load. A stop in that window ends by the SIGKILL
#   step (137) instead of SIGTERM; nothing in sh can close it.
# - After the command, signals are ignored (and inherited by sync) so a late
#   SIGTERM cannot kill the helper.
# - umask 077 only after the command: the user's umask stays the user's.
# - The record is one write(2) of a few bytes by sh's builtin printf, ending in
#   a newline: readers see it whole or see no complete line, and no process is
#   forked for it (a `mv` from a temporary file cost a fork and exec per run,
#   about a third of the wrapper's cost). With $2 = 1 the record is also
#   fsynced (a fork of `sync` plus a disk flush, ~1-1.5 ms a run). Without it,
#   a machine crash may lose or empty the record, which readers treat as "no
#   record".
# Joins the run's cgroup: each path in $g, its pid to a cgroup.procs, 0 to a v1 tasks.
JOIN = 'for f in $g; do case $f in */tasks) echo 0 >"$f" ;; *) echo $$ >"$f" ;; esac; done'

SCRIPT = f"""t=
{_TRAPS}
d=$1
s=$2
g=$3
v=$4
shift 4
exec 2>>"$d/stderr"
{JOIN}
[ -n "$v" ] && ulimit -v "$v"
if [ -z "$t" ]; then
  "$@"
  c=$?
else
  c=$t
fi
trap '' {" ".join(_CAUGHT)}
umask 077
printf '%s\\n' "$c" >"$d/exit"
[ "$s" = 1 ] && sync -- "$d/exit" 2>/dev/null
exit "$c"
"""


def wrapper_argv(
    run_dir: pathlib.Path,
    command: list[str],
    *,
    fsync: bool = True,
    join: list[pathlib.Path] | None = None,
    address_space_kib: int | None = None,
    binary: pathlib.Path | None = None,
) -> list[str]:
    """The argv that starts `command` (argv[0] already resolved) under the wrapper; it joins
    the cgroup files `join` (paths without blanks or wildcards: the shell splits them)
    and sets `ulimit -v address_space_kib` first. `binary`: the C wrapper, else the sh script.
    Both take the same positions, so an agent that restarts finds either by argv[3] and [4]."""
    cgroup = " ".join(str(p) for p in join or [])
    limit = "" if address_space_kib is None else str(address_space_kib)
    head = [str(binary), "-c", "-"] if binary is not None else ["/bin/sh", "-c", SCRIPT]
    return [*head, WRAPPER_NAME, str(run_dir), "1" if fsync else "0", cgroup, limit, *command]
