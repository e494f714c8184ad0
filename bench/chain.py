"""Figure 13: time per link of a chain, from whole commands' wall times, beside doit and make.

A chain of N `/bin/true` jobs (job i+1 depends on job i) and a graph of one job, each run by
the whole command a user runs on a fresh state: `reconciler up -f chain.yaml` (SQLite, or
PostgreSQL with --store pg), `doit` (a Python task runner with no durable state beyond its
dependency file) and `make`. Per link = (wall(chain of N) - wall(one job)) / (N - 1), so each
tool's fixed cost (interpreter, imports, store, start and stop) cancels and nothing hides in
how a record's timestamps are taken. The one-job wall time is printed too: it is the fixed
cost. Rounds are interleaved (reconciler, doit, make, ...) so that a slow minute of the
machine touches every tool; the median round is reported.

    .venv/bin/python bench/chain.py [--jobs 300] [--rounds 3] [--store sqlite|pg]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import PYTHON, Row, byte_compile, child_env, log, median, print_table, scratch
from bench.latency import chain_manifests

AIM = 1.0  # issue 15: no slower than doit per link


def dodo(n: int) -> str:
    """A doit file of the same chain: each task runs /bin/true without a shell and always runs."""
    return (
        "DOIT_CONFIG = {'verbosity': 0}\n"
        f"N = {n}\n"
        "def task_link():\n"
        "    for i in range(N):\n"
        "        yield {'name': str(i), 'actions': [['/bin/true']], 'uptodate': [False],\n"
        "               'task_dep': [f'link:{i - 1}'] if i else []}\n"
    )


def makefile(n: int) -> str:
    lines = [".PHONY: all " + " ".join(f"l{i}" for i in range(n)), f"all: l{n - 1}"]
    lines += [f"l{i}:{' l' + str(i - 1) if i else ''}\n\t@/bin/true" for i in range(n)]
    return "\n".join(lines) + "\n"


def timed(argv: list[str], **kwargs) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kwargs)
    return time.perf_counter() - start


def reconciler_wall(n: int, store_kind: str) -> float:
    """`reconciler up` of a chain of n on a fresh store."""
    with scratch(store_kind) as (url, folder):
        manifest = folder / "chain.yaml"
        manifest.write_text(chain_manifests(n))
        argv = [PYTHON, "-m", "reconciler", "up", "-f", str(manifest), "--timeout", f"{max(60, n)}s"]
        return timed(argv, env=child_env(url, folder), cwd=folder)


def doit_wall(n: int, folder: Path) -> float:
    (folder / "dodo.py").write_text(dodo(n))
    (folder / ".doit.db").unlink(missing_ok=True)
    doit = str(Path(PYTHON).with_name("doit"))
    return timed([doit, "-f", str(folder / "dodo.py"), "--db-file", str(folder / ".doit.db")], cwd=folder)


def make_wall(n: int, folder: Path) -> float:
    (folder / "Makefile").write_text(makefile(n))
    return timed(["make", "-s", "-C", str(folder)])


def measure(n: int, rounds: int, store_kind: str) -> dict:
    byte_compile()  # the commands measured import compiled code, as after `pip install`
    tools = {
        "reconciler": lambda k, folder: reconciler_wall(k, store_kind),
        "doit": doit_wall,
        "make": make_wall,
    }
    walls: dict[str, dict[int, list[float]]] = {tool: {1: [], n: []} for tool in tools}
    with scratch("sqlite", prefix="reconciler-bench-chain-") as (_, folder):
        for r in range(rounds):
            for size in (1, n):
                for tool, run in tools.items():
                    walls[tool][size].append(run(size, folder))
            up, doit = walls["reconciler"][n][-1], walls["doit"][n][-1]
            log(f"chain round {r + 1}/{rounds}: up {up:.2f} s, doit {doit:.2f} s")
    out: dict = {"n": n, "rounds": rounds}
    for tool in tools:
        one, chain = median(walls[tool][1]), median(walls[tool][n])
        out[tool] = {"one": one, "chain": chain, "link_ms": (chain - one) / (n - 1) * 1000, "walls": walls[tool][n]}
    return out


def available() -> bool:
    return shutil.which("make") is not None and Path(PYTHON).with_name("doit").exists()


def row(n: int, rounds: int, store_kind: str = "sqlite") -> Row:
    m = measure(n, rounds, store_kind)
    us, doit, make = m["reconciler"], m["doit"], m["make"]
    label = "postgresql" if store_kind == "pg" else "sqlite"
    figure = f"13 chain per link ({label})"
    return Row(
        figure,
        f"up {us['link_ms']:.1f} ms/link",
        f"doit {doit['link_ms']:.1f}, make {make['link_ms']:.1f} ms/link",
        us["link_ms"] / doit["link_ms"],
        "x",
        AIM,
        [
            f"{figure}: chain of {n} /bin/true, each tool's whole command on a fresh state, median of {rounds} "
            f"interleaved rounds; per link = (wall of the chain - wall of one job) / {n - 1}; "
            f"reconciler up {us['chain']:.2f} s (one job {us['one']:.2f} s: its fixed cost), "
            f"doit {doit['chain']:.2f} s (one job {doit['one']:.2f} s), make {make['chain']:.3f} s "
            f"(one job {make['one']:.3f} s); result = reconciler per link / doit per link, "
            f"{us['link_ms'] / make['link_ms']:.1f}x make's"
        ],
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--store", choices=["sqlite", "pg"], default="sqlite")
    args = parser.parse_args(argv)
    print_table([row(args.jobs, args.rounds, args.store)], title="reconciler chain per link")


if __name__ == "__main__":
    main()
