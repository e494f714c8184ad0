"""examples/grafana: every metric the dashboard queries is one reconciler exports (a scrape of
a real store in the format Prometheus reads), so the dashboard cannot chart a name that
does not exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from reconciler.converge import controller_running
from reconciler.metrics import exposition
from reconciler.store import Store

DASHBOARD = Path(__file__).resolve().parents[2] / "examples" / "grafana" / "reconciler-dashboard.json"


def test_the_dashboard_queries_only_exported_metrics(sqlite_url):
    store = Store(sqlite_url)
    try:
        with controller_running(store):  # as in `controller --metrics-port` and `serve`
            body, _ = exposition(store)
    finally:
        store.dispose()
    exported = {f.name for f in text_string_to_metric_families(body.decode())}
    # every family is exported even before anything happened (empty families have no samples)
    dashboard = json.loads(DASHBOARD.read_text())
    queried = {
        re.sub(r"_(bucket|sum|count|total)$", "", name)
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"reconciler_[a-z_]+", target["expr"])
    }
    assert queried, "the dashboard queries nothing"
    assert queried <= exported, f"not exported: {sorted(queried - exported)}"
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
