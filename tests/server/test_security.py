"""Security of `reconciler serve`: tokens and roles, loopback only without tokens, TLS, and
tokens kept out of logs; and what the CLI makes of 401 and 403 (exit codes)."""

from __future__ import annotations

import ssl
import subprocess
import sys

import httpx
import pytest

from tests.helpers import run_cli, self_signed
from tests.server.conftest import PREFIX, job_manifest, settled

ADMIN = "admin-token-0123456789abcdef"
VIEWER = "viewer-token-0123456789abcdef"
AGENT = "agent-token-0123456789abcdef"


@pytest.fixture
def tokens_file(tmp_path):
    path = tmp_path / "tokens"
    path.write_text(f"# who may use the API\n{ADMIN} admin\n\n{VIEWER} viewer\n{AGENT} agent worker-1\n")
    path.chmod(0o600)
    return path


def test_tokens_and_roles(serve, sqlite_url, tokens_file):
    server = serve(sqlite_url, "--tokens", str(tokens_file), token=ADMIN)
    anonymous, wrong = server.http(token=""), server.http(token="x" * 40)
    for client in (anonymous, wrong):
        refused = client.get(f"{PREFIX}/jobs")
        assert refused.status_code == 401 and refused.json()["reason"] == "Unauthorized"
        assert refused.headers["www-authenticate"].startswith("Bearer")
    assert anonymous.get("/healthz").text == "ok"  # no token needed
    assert anonymous.get("/leader").json()["leader"] is True  # nor to ask who leads (a load balancer's probe)

    viewer = server.http(token=VIEWER)
    assert viewer.get(f"{PREFIX}/jobs").status_code == 200
    forbidden = viewer.post(f"{PREFIX}/apply", json={"items": [job_manifest("a")]})
    assert forbidden.status_code == 403 and forbidden.json()["reason"] == "Forbidden"
    assert viewer.delete(f"{PREFIX}/jobs/a").status_code == 403

    admin = server.http()
    assert admin.post(f"{PREFIX}/apply", json={"items": [job_manifest("a")]}).status_code == 200
    assert viewer.get(f"{PREFIX}/jobs/a").json()["metadata"]["name"] == "a"
    assert anonymous.get("/metrics").status_code == 401, "metrics need a token"
    assert "reconciler_jobs" in viewer.get("/metrics").text

    # an agent token: its own node, read; under nodes/worker-1/ the agent routes (test_agent_loopback.py)
    node = {"apiVersion": "reconciler.dev/v1alpha1", "kind": "Node", "metadata": {"name": "worker-1"}, "spec": {}}
    admin.post(f"{PREFIX}/nodes", json=node)
    agent = server.http(token=AGENT)
    assert agent.get(f"{PREFIX}/nodes/worker-1").status_code == 200
    node_name = admin.get(f"{PREFIX}/nodes").json()["items"]
    others = [n["metadata"]["name"] for n in node_name if n["metadata"]["name"] != "worker-1"]
    for path in [f"{PREFIX}/jobs", f"{PREFIX}/nodes"] + [f"{PREFIX}/nodes/{n}" for n in others]:
        assert agent.get(path).status_code == 403, path
    assert agent.put(f"{PREFIX}/nodes/worker-1", json=node).status_code == 403
    for action in ("cordon", "uncordon", "drain"):  # an operator's, not its agent's
        assert agent.post(f"{PREFIX}/nodes/worker-1/{action}").status_code == 403, action
    assert admin.post(f"{PREFIX}/nodes/worker-1/cordon").json()["message"] == "cordoned"

    # the CLI: 401 is exit 2 (fix the invocation), 403 exit 1 (understood and refused)
    no_token = run_cli("get", "jobs", store=sqlite_url, env={"RECONCILER_SERVER": server.url})
    assert no_token.code == 2 and "unauthorized by the server at" in no_token.stderr, no_token.stderr
    manifest = "apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {name: b}\nspec: {command: ['true']}\n"
    denied = run_cli("--server", server.url, "--token", VIEWER, "apply", "-f", "-", store=sqlite_url, input=manifest)
    assert denied.code == 1 and "forbidden by the server" in denied.stderr and "viewer" in denied.stderr
    assert server.cli("get", "jobs", "-o", "name", token=VIEWER).stdout == "job.reconciler.dev/a\n"

    # no token ever reaches the log (requests are logged with -v)
    log = server.log.read_text()
    assert ADMIN not in log and VIEWER not in log and AGENT not in log


def test_tokens_never_logged_with_verbose_access_log(serve, sqlite_url, tokens_file):
    server = serve(sqlite_url, "--tokens", str(tokens_file), "-v", token=ADMIN)
    server.http().get(f"{PREFIX}/jobs")
    server.http(token=VIEWER).post(f"{PREFIX}/apply", json={"items": []})
    server.http(token="not-a-token-0123456789").get(f"{PREFIX}/jobs")
    log = server.log.read_text()
    assert "GET /apis/reconciler.dev/v1alpha1/jobs" in log  # the access log is on
    for secret in (ADMIN, VIEWER, "not-a-token-0123456789"):
        assert secret not in log


def _serve_exit(store: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reconciler", "--store", store, "serve", "--port", "1", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_non_loopback_host_without_tokens_is_refused(sqlite_url, tmp_path):
    refused = _serve_exit(sqlite_url, "--host", "0.0.0.0")
    assert refused.returncode == 2
    assert "--host 0.0.0.0" in refused.stderr and "loopback only" in refused.stderr and "--tokens" in refused.stderr
    half_tls = _serve_exit(sqlite_url, "--tls-cert", str(tmp_path / "c.pem"))
    assert half_tls.returncode == 2 and "--tls-cert and --tls-key go together" in half_tls.stderr


def test_without_tokens_a_web_page_cannot_drive_the_api(server):
    """Loopback without tokens trusts whoever can reach 127.0.0.1, which a browser can on a
    page's behalf: a rebound DNS name (its own Host) and cross-site requests are refused,
    writes and reads alike; the CLI's and a local browser tab's requests pass."""
    http = server.http(token="")
    apply = {"items": [job_manifest("rebound")]}
    rebound = http.post(f"{PREFIX}/apply", json=apply, headers={"Host": "rebind.evil.example:80"})
    assert rebound.status_code == 403 and "DNS rebinding" in rebound.json()["message"]
    assert http.get(f"{PREFIX}/jobs", headers={"Host": "rebind.evil.example"}).status_code == 403
    cross = http.post(f"{PREFIX}/apply", json=apply, headers={"Origin": "http://evil.example"})
    assert cross.status_code == 403 and "evil.example" in cross.json()["message"]
    form = http.post(f"{PREFIX}/jobs/rebound/cancel", content=b"x", headers={"Sec-Fetch-Site": "cross-site"})
    assert form.status_code == 403
    # another local app's page (a dev server, a notebook) is another origin too
    port = server.url.rsplit(":", 1)[1]
    for origin in ("http://127.0.0.1:3000", "http://localhost:8080", "null", f"http://localhost:{port}"):
        assert http.post(f"{PREFIX}/apply", json=apply, headers={"Origin": origin}).status_code == 403, origin
    assert http.get(f"{PREFIX}/jobs", headers={"Sec-Fetch-Site": "same-site"}).status_code == 403
    assert http.get(f"{PREFIX}/jobs", headers={"Host": "[::1"}).status_code == 403  # malformed: refused, not a 500
    assert http.get(f"{PREFIX}/jobs").json()["items"] == []  # none of it was stored
    for host in ("127.0.0.1", "localhost", "[::1]"):
        assert http.get(f"{PREFIX}/jobs", headers={"Host": f"{host}:{port}"}).status_code == 200
    assert http.get(f"{PREFIX}/jobs", headers={"Sec-Fetch-Site": "same-origin"}).status_code == 200
    same_origin = http.post(f"{PREFIX}/apply", json=apply, headers={"Origin": server.url})
    assert same_origin.status_code == 200
    assert server.cli("get", "jobs", "-o", "name").stdout.strip() == "job.reconciler.dev/rebound"


def test_a_bad_tokens_file_is_refused_naming_file_and_line(sqlite_url, tmp_path):
    path = tmp_path / "tokens"
    path.write_text(f"{ADMIN} admin\nshort admin\n{VIEWER} superuser\n{AGENT} agent\n{ADMIN} viewer\n")
    refused = _serve_exit(sqlite_url, "--tokens", str(path))
    assert refused.returncode == 2
    for line, words in ((2, "too short"), (3, "unknown role 'superuser'"), (4, "names its node"), (5, "same token")):
        assert f"{path}:{line}: " in refused.stderr and words in refused.stderr, refused.stderr
    assert ADMIN not in refused.stderr


def _self_signed(tmp_path, stem: str = "") -> tuple[str, str]:
    cert, key = self_signed(tmp_path, stem)
    return str(cert), str(key)


def test_tls(serve, sqlite_url, tmp_path, tokens_file):
    cert, key = _self_signed(tmp_path)
    server = serve(
        sqlite_url, "--tls-cert", cert, "--tls-key", key, "--tokens", str(tokens_file),
        token=ADMIN, scheme="https", verify=ssl.create_default_context(cafile=cert),
    )  # fmt: skip
    assert server.http().get("/healthz").text == "ok"
    with pytest.raises(httpx.ConnectError):  # a certificate nobody vouched for is refused
        httpx.get(f"{server.url}/healthz", verify=True, timeout=5)
    plain = server.url.replace("https://", "http://")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{plain}/healthz", timeout=5)
    # the CLI over TLS, trusting the certificate through SSL_CERT_FILE
    applied = server.cli("run", "--name", "hello", "--", "true", env={"SSL_CERT_FILE": cert})
    assert applied.code == 0, applied.stderr
    settled(server, "hello")
    listed = server.cli("get", "jobs", "-o", "name", env={"SSL_CERT_FILE": cert})
    assert listed.code == 0 and listed.stdout == "job.reconciler.dev/hello\n"
    other, _ = _self_signed(tmp_path, "other-")
    untrusted = server.cli("get", "jobs", env={"SSL_CERT_FILE": other})
    assert untrusted.code == 1 and f"cannot reach the server at {server.url}" in untrusted.stderr
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr


def test_a_viewer_is_refused_a_nodes_runs_and_nothing_else_of_a_node():
    """A node's runs carry every placed run's spec and environment: its agent's (and an
    admin's) to read; a node merely named runs-something is read as any node is."""
    from reconciler.server.auth import Identity, refusal

    viewer = Identity("viewer", None)
    assert refusal(viewer, "GET", f"{PREFIX}/nodes/w1/runs") is not None
    assert refusal(viewer, "GET", f"{PREFIX}/nodes/w1/runs/x/report") is not None
    for path in (f"{PREFIX}/nodes/runs-a", f"{PREFIX}/nodes/runsbox/held", f"{PREFIX}/nodes", f"{PREFIX}/jobs/runs"):
        assert refusal(viewer, "GET", path) is None, path
