"""No input can stop the controller (issue 16): manifests generated with extreme values
(durations past any timer, integers past any column, NUL bytes, far dates, huge factors,
odd strings) are either refused by apply with exit 2, naming the field, or stored; and a
controller given whatever was stored keeps reconciling: a plain job applied beside them
still runs to Succeeded."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.data.inprocess import cli
from tests.helpers import remove_run_cgroups, wait_until

DURATIONS = st.sampled_from(
    ["0s", "1ms", "99ms", "100ms", "1s", "3650d", "3650d1ms", "110000d", "99999999999999999999d", "1.5h", "-1s", "1"]
)
SIZES = st.sampled_from(["0", "1", "4Ki", "1Pi", "2Pi", "9999Pi", "99999999999999999999999", "-1", "1.5Gi"])
INTS = st.one_of(
    st.sampled_from([0, 1, -1, 63, 255, 256, 65535, 65536, 1_000_000, 1_000_001, 10**9, 2**31, 2**63, 10**30]),
    st.integers(),
)
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1.0, 1000.0, 1000.5, 1e308]))
TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["a\0b", "\n", "$(echo hi)", "é", "x" * 5000, "../../etc/passwd", "/dev/null"]),
)
TIMES = st.sampled_from(
    ["0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "2026-01-01T00:00:00", "1970-01-01T00:00:00Z", "not a time"]
)


def harmless_argv(texts: list[str]) -> list[str]:
    """What runs is /bin/true, whatever the generated words (this suite runs as root)."""
    return ["/bin/true", *texts]


def harmless_shell(text: str) -> str:
    """A shell line that only tests the text: quoted, it expands nothing and runs nothing."""
    return ": " + shlex.quote(text)


PROBE_COMMANDS = st.lists(TEXT, max_size=2).map(harmless_argv)


@st.composite
def specs(draw: st.DrawFn) -> dict:
    if draw(st.booleans()):
        spec: dict = {"shell": harmless_shell(draw(TEXT))}
    else:
        spec = {"command": harmless_argv(draw(st.lists(TEXT, max_size=3)))}
    optional = {
        "timeout": DURATIONS,
        "runTimeout": DURATIONS,
        "stopGracePeriod": DURATIONS,
        "slots": INTS,
        "priority": INTS,
        "logLimit": SIZES,
        "env": st.dictionaries(TEXT, TEXT, max_size=2),
        "resources": st.fixed_dictionaries({}, optional={"cpu": st.one_of(TEXT, FLOATS), "memory": SIZES}),
        "retry": st.fixed_dictionaries(
            {},
            optional={
                "limit": INTS,
                "onExitCodes": st.lists(INTS, max_size=3),
                "backoff": st.fixed_dictionaries(
                    {}, optional={"delay": DURATIONS, "factor": FLOATS, "maxDelay": DURATIONS, "jitter": DURATIONS}
                ),
            },
        ),
        "waitFor": st.fixed_dictionaries(
            {
                "conditions": st.lists(
                    st.one_of(
                        st.fixed_dictionaries({"until": TIMES}),
                        st.fixed_dictionaries({"delay": DURATIONS}),
                        st.fixed_dictionaries({"path": TEXT}, optional={"interval": DURATIONS}),
                        st.fixed_dictionaries({"probe": st.fixed_dictionaries({"command": PROBE_COMMANDS})}),
                    ),
                    max_size=2,
                )
            },
            optional={"abortAfter": DURATIONS, "abortAt": TIMES},
        ),
    }
    for key, strategy in optional.items():
        if draw(st.booleans()):
            spec[key] = draw(strategy)
    return spec


def job(name: str, spec: dict) -> str:
    return yaml.safe_dump(
        {"apiVersion": "reconciler.dev/v1alpha1", "kind": "Job", "metadata": {"name": name}, "spec": spec}
    )


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(specs(), min_size=1, max_size=4))
def test_apply_refuses_or_the_controller_keeps_reconciling(tmp_path_factory, hostile):
    root = tmp_path_factory.mktemp("hostile")
    url = f"sqlite:///{root / 'state' / 'state.db'}"
    for i, spec in enumerate(hostile):
        (root / f"h{i}.yaml").write_text(job(f"hostile-{i}", spec))
        result = cli("apply", "-f", str(root / f"h{i}.yaml"), store=url)
        assert result.code in (0, 2), result
        assert "Traceback" not in result.stderr, result.stderr
        if result.code == 2:
            assert result.stderr.startswith(f"error: {root / f'h{i}.yaml'}:"), result.stderr  # names the file
    (root / "canary.yaml").write_text(job("canary", {"command": ["true"]}))
    assert cli("apply", "-f", str(root / "canary.yaml"), store=url).code == 0

    log = root / "controller.log"
    with open(log, "wb") as out:
        controller = subprocess.Popen(
            [sys.executable, "-m", "reconciler", "--store", url, "controller"], stdout=out, stderr=subprocess.STDOUT
        )
    try:

        def canary_done() -> bool:
            assert controller.poll() is None, f"the controller exited {controller.returncode}:\n{log.read_text()}"
            got = cli("get", "job", "canary", "-o", "json", store=url)
            return json.loads(got.stdout).get("status", {}).get("outcome") == "Succeeded"

        wait_until(canary_done, timeout=30, interval=0.1, message="the canary job ran beside the hostile ones")
    finally:
        controller.send_signal(signal.SIGTERM)
        try:
            controller.wait(20)
        except subprocess.TimeoutExpired:
            controller.kill()
    subprocess.run(["pkill", "-KILL", "-f", str(root)], check=False)  # runs of the hostile jobs that are still up
    remove_run_cgroups(root)  # theirs too: no controller recorded those runs' ends
