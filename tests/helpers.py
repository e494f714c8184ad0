"""Test helpers shared by every suite: the real CLI in a subprocess, and waiting with a deadline."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str


def run_cli(
    *args: str,
    store: str,
    input: str | None = None,
    timeout: float = 60,
    env: dict | None = None,
    cwd: str | None = None,
) -> Result:
    """Run `python -m reconciler ARGS` against `store`, as a user would."""
    full_env = {**os.environ, "RECONCILER_STORE": store, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "reconciler", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def wait_until(predicate: Callable[[], T], timeout: float = 20.0, interval: float = 0.02, message: str = "") -> T:
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {message or predicate}")
        time.sleep(interval)


def remove_run_cgroups(root: Path) -> None:
    """After a test killed its runs itself (no controller recorded their ends), remove their
    cgroups: each is named like its run folder (`<job>.<uid>.<n>`), found under `root`.
    Anything still in one is the test's own and is killed first."""
    from reconciler.agent.cgroups import CgroupUnavailable, detect

    try:
        hierarchy = detect()
    except CgroupUnavailable:
        return
    # os.walk, not rglob: a folder may vanish under the walk (the agent's wrapper build, in a
    # thread of its own, removes its temporary ones), which os.walk skips and rglob raises on
    names = {run for parent, dirs, _ in os.walk(root) if os.path.basename(parent) == "runs" for run in dirs}
    for name in names:
        with contextlib.suppress(CgroupUnavailable, OSError, AssertionError):
            group = hierarchy.open(name)
            if group.exists():
                group.kill_all()
                wait_until(lambda group=group: not group.pids(), timeout=10, message=f"cgroup {name} empty")
                group.remove()


def self_signed(folder: Path, stem: str = "") -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (its own issuer: trusted by naming it, as SSL_CERT_FILE
    does) and its key, made with the cryptography package."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / f"{stem}cert.pem", folder / f"{stem}key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return cert_path, key_path
