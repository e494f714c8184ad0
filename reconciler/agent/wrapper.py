"""The run wrapper: a few lines of /bin/sh that outlive their supervisor.

Why /bin/sh: a Python wrapper would cost ~300 ms per run; sh costs ~1 ms.
Why a wrapper at all: the agent (or the controller hosting it) may die while a
run goes on. The wrapper is the run's parent, so it alone can learn the exit
status, and it leaves it in `run_dir/exit` for whoever adopts the run later.
"""

from __future__ import annotations

import pathlib

# $0 of the wrapper; shows up in `ps`, which makes stray runs easy to spot.
WRAPPER_NAME = "reconciler-run"

# Positional parameters: $1 = run dir, $2 = 1 to fsync the record, the rest =
# the argv to run.
# - `trap ':'` (caught, not ignored): a SIGTERM, or another catchable signal a
#   user may send the group, must not kill the wrapper before it records the
#   status. Caught traps are reset to the default in the exec'd command;
#   ignored ones would be inherited, making the user's command immune to them.
# - "$@" with an absolute path first: no word splitting, no globbing, and no
#   shell builtin can stand in for the program (a path with a slash is exec'd).
# - After the command, signals are ignored (and inherited by sync/mv) so a late
#   SIGTERM cannot kill the helpers; mv is retried because a SIGKILL sent to
#   "every member but the wrapper" may hit it.
# - umask 077 only after the command: the user's umask stays the user's.
# - The rename makes `exit` appear whole or not at all to readers. With $2 = 1,
#   exit.tmp is also fsynced first, so even after a power loss `exit` is never
#   empty; that costs a fork of `sync` plus a disk flush (~1-1.5 ms a run,
#   about as much as the rest of the wrapper). Without it, a machine crash
#   may lose or empty the record, which readers treat as "no record".
SCRIPT = r"""trap ':' TERM INT HUP QUIT USR1 USR2 ALRM
d=$1
s=$2
shift 2
"$@"
c=$?
trap '' TERM INT HUP QUIT USR1 USR2 ALRM
umask 077
printf '%s\n' "$c" >"$d/exit.tmp"
[ "$s" = 1 ] && sync -- "$d/exit.tmp" 2>/dev/null
n=0
until mv -f -- "$d/exit.tmp" "$d/exit" 2>/dev/null; do
  n=$((n + 1))
  [ "$n" -lt 5 ] || break
done
exit "$c"
"""


def wrapper_argv(run_dir: pathlib.Path, command: list[str], *, fsync: bool = True) -> list[str]:
    """The argv that starts `command` (argv[0] already resolved) under the wrapper."""
    return ["/bin/sh", "-c", SCRIPT, WRAPPER_NAME, str(run_dir), "1" if fsync else "0", *command]
