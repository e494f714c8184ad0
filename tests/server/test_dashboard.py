"""The dashboard at `GET /`, in a real browser: headless Chromium (Debian's /usr/bin/chromium;
.ci/run installs it) driven by Playwright against a real `reconciler serve` running real
jobs. Screenshots of the graph and of a job page are saved under the test's tmp dir (and
to docs/ when RECONCILER_DOCS_SCREENSHOTS=1, which is how the README's copy was made)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import PREFIX, Server, job_manifest

CHROMIUM = "/usr/bin/chromium"
ADMIN = "admin-token-0123456789abcdef"
VIEWER = "viewer-token-0123456789abcdef"
DOCS = Path(__file__).resolve().parents[2] / "docs"
SEEN = 30_000  # ms: how long a page may take to show a change (the watch stream is immediate)

sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    opened = context.new_page()
    yield opened
    context.close()


def _apply(server: Server, *items: dict) -> None:
    answer = server.http().post(f"{PREFIX}/apply", json={"items": list(items)})
    assert answer.status_code == 200, answer.text


def _held(name: str, go: Path, before: str = "", after: str = "", **spec) -> dict:
    """A job whose run lasts until the test creates `go` (in its working directory)."""
    script = f"{before}while [ ! -e {go.name} ]; do sleep 0.05; done; {after or 'true'}"
    return job_manifest(name, ["sh", "-c", script], workingDir=str(go.parent), **spec)


def _shoot(page, tmp_path: Path, name: str) -> Path:
    shot = tmp_path / name
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 0
    if os.environ.get("RECONCILER_DOCS_SCREENSHOTS") == "1":
        shutil.copy(shot, DOCS / name)
    return shot


def _sign_in(page, server: Server, path: str, token: str) -> None:
    page.goto(server.url + path)
    page.wait_for_selector("#login", state="visible", timeout=SEEN)
    page.fill("#login input[name=token]", token)
    page.click("#login button[type=submit]")
    page.wait_for_selector("#main .fragment", timeout=SEEN)


def test_graph_shows_a_job_go_from_running_to_succeeded_without_a_reload(page, server, tmp_path):
    go = tmp_path / "go"
    shards = [f"analyse-{i}" for i in (1, 2, 3)]
    pool = {"apiVersion": "reconciler.dev/v1alpha1", "kind": "Pool", "metadata": {"name": "analysis"}}
    _apply(
        server,
        {**pool, "spec": {"slots": 2}},  # two shards at a time: the third queues
        job_manifest("prepare", ["true"]),
        *(_held(name, go, dependsOn=[{"job": "prepare"}], pool="analysis") for name in shards),
        job_manifest("report", ["true"], dependsOn=[{"job": name} for name in shards]),
    )
    page.goto(server.url + "/")
    page.wait_for_selector('g[data-job="prepare"].st-Succeeded', timeout=SEEN)
    page.wait_for_selector("g.job.st-Queued", timeout=SEEN)
    running = page.locator("g.job.st-Running").first
    running.wait_for(timeout=SEEN)
    watched = running.get_attribute("data-job")
    assert watched in shards
    assert page.locator("path.edge").count() == 6  # prepare -> each shard -> report
    assert page.locator('g[data-job="report"].st-Waiting').count() == 1
    page.wait_for_selector(".legend .st-Queued", timeout=SEEN)  # the counts follow too
    _shoot(page, tmp_path, "dashboard-graph.png")
    page.evaluate("window.stillTheSamePage = true")
    page.wait_for_selector("#live.on", timeout=SEEN)
    go.touch()
    page.wait_for_selector(f'g[data-job="{watched}"].st-Succeeded', timeout=SEEN)
    page.wait_for_selector('g[data-job="report"].st-Succeeded', timeout=SEEN)
    assert page.evaluate("window.stillTheSamePage") is True  # no reload: the watch stream did it


def test_job_page_follows_its_logs_live(page, server, tmp_path):
    go = tmp_path / "go"
    _apply(server, _held("talker", go, before="echo first line; ", after="echo second line"))
    page.goto(server.url + "/ui/jobs/talker")
    page.wait_for_selector("h2 .st-Running", timeout=SEEN)
    page.click("#follow-logs")
    page.wait_for_selector("pre.log:has-text('first line')", timeout=SEEN)  # the CSP forbids eval: selectors
    go.touch()
    page.wait_for_selector("pre.log:has-text('second line')", timeout=SEEN)  # the CSP forbids eval: selectors
    page.wait_for_selector("h2 .st-Succeeded", timeout=SEEN)  # the page followed the job too
    page.wait_for_selector("#logs .said:text('the run has ended')", timeout=SEEN)
    runs = page.locator("table.runs tbody tr")
    assert runs.count() == 1
    assert runs.first.locator("td").nth(5).inner_text() == "0"  # exit code
    assert page.locator("pre.log").inner_text().splitlines() == ["first line", "second line"]
    _shoot(page, tmp_path, "dashboard-job.png")


@pytest.fixture
def secured(serve, sqlite_url, tmp_path) -> Server:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{ADMIN} admin\n{VIEWER} viewer\n")
    return serve(sqlite_url, "--tokens", str(tokens), token=ADMIN)


def test_admin_cancels_a_running_job_and_a_viewer_sees_no_buttons(browser, secured, tmp_path):
    _apply(secured, job_manifest("long", ["sleep", "300"]))
    admin = browser.new_context().new_page()
    _sign_in(admin, secured, "/ui/jobs/long", ADMIN)
    admin.wait_for_selector("h2 .st-Running", timeout=SEEN)
    admin.click("button.action[data-action=cancel]")
    admin.wait_for_selector("h2 .st-Cancelled", timeout=SEEN)
    assert "cancel" in admin.locator("#notice").inner_text().lower()  # the API's answer, said
    admin.wait_for_selector("button.action[data-action=rerun]", timeout=SEEN)  # what an admin may do now
    assert secured.job("long")["status"]["outcome"] == "Cancelled"
    admin.context.close()

    _apply(secured, job_manifest("other", ["sleep", "300"]))
    viewer = browser.new_context().new_page()
    _sign_in(viewer, secured, "/ui/jobs/other", VIEWER)
    viewer.wait_for_selector("h2 .st-Running", timeout=SEEN)
    assert viewer.locator("button.action").count() == 0
    viewer.goto(secured.url + "/ui/jobs/long")  # the tab keeps its token: no second sign-in
    viewer.wait_for_selector("h2 .st-Cancelled", timeout=SEEN)
    assert viewer.locator("button.action").count() == 0 and viewer.locator("#login").is_hidden()
    viewer.context.close()


def test_a_wrong_token_is_refused_and_the_login_stays(browser, secured):
    page = browser.new_context().new_page()
    page.goto(secured.url + "/")
    page.wait_for_selector("#login", state="visible", timeout=SEEN)
    page.fill("#login input[name=token]", "not-a-token-at-all-0000")
    page.click("#login button[type=submit]")
    page.wait_for_selector("#login .said:text('that token was refused')", timeout=SEEN)
    assert page.locator("#main .fragment").count() == 0
    page.context.close()


def test_shells_hold_no_data_and_fragments_need_a_token(secured):
    _apply(secured, job_manifest("secret-job", ["true"]))
    for path in ("/", "/ui/jobs", "/ui/jobs/another", "/ui/pools", "/ui/nodes", "/ui/static/dashboard.js"):
        answer = httpx.get(secured.url + path)  # no token
        assert answer.status_code == 200 and "secret-job" not in answer.text, path
    shell = httpx.get(secured.url + "/")
    assert "script-src 'self'" in shell.headers["content-security-policy"]
    for path in ("/ui/fragments/graph", "/ui/fragments/jobs", "/ui/fragments/jobs/secret-job"):
        assert httpx.get(secured.url + path).status_code == 401, path
        viewer = httpx.get(secured.url + path, headers={"Authorization": f"Bearer {VIEWER}"})
        assert viewer.status_code == 200 and "secret-job" in viewer.text, path
    admin_page = httpx.get(secured.url + "/ui/fragments/jobs/secret-job", headers={"Authorization": f"Bearer {ADMIN}"})
    assert 'data-action="rerun"' in admin_page.text


def test_jobs_table_filters_and_pool_queues_in_admission_order(page, server, tmp_path):
    go = tmp_path / "go"
    pool = {"apiVersion": "reconciler.dev/v1alpha1", "kind": "Pool", "metadata": {"name": "batch"}}
    _apply(server, {**pool, "spec": {"slots": 1}}, _held("holder", go, pool="batch", labels={"team": "data"}))
    _apply(
        server,
        *(job_manifest(f"q{i}", ["true"], pool="batch", priority=10 - i, labels={"team": "data"}) for i in (1, 2, 3)),
        job_manifest("solo", ["true"], labels={"team": "web"}),
    )
    page.goto(server.url + "/ui/pools")
    page.wait_for_selector('section.queue[data-pool="batch"] tbody tr:nth-child(3)', timeout=SEEN)
    rows = page.locator('section.queue[data-pool="batch"] tbody tr')
    cells = [[rows.nth(i).locator("td").nth(c).inner_text() for c in (0, 1, 5)] for i in range(3)]
    full = "pool batch is full (1/1 slots in use, 1 needed)"
    assert cells == [
        ["1st", "q1", f"1st of 3 in pool batch; {full}"],
        ["2nd", "q2", f"2nd of 3 in pool batch; {full}"],
        ["3rd", "q3", f"3rd of 3 in pool batch; {full}"],
    ]
    # the same words as `describe`
    said = server.cli("describe", "job", "q2").stdout
    assert f"Why Waiting:         2nd of 3 in pool batch; {full}" in said

    page.goto(server.url + "/ui/jobs?labelSelector=team%3Ddata&phase=Queued")
    page.wait_for_selector("table.jobs", timeout=SEEN)
    names = page.locator("table.jobs tbody tr td:first-child").all_inner_texts()
    assert names == ["q1", "q2", "q3"]
    page.goto(server.url + "/ui/jobs?labelSelector=team%3Dweb")
    page.wait_for_selector("table.jobs", timeout=SEEN)
    assert page.locator("table.jobs tbody tr td:first-child").all_inner_texts() == ["solo"]
    page.goto(server.url + "/ui/jobs?labelSelector=team%3D%3D%3D")
    page.wait_for_selector(".problem", timeout=SEEN)  # a bad selector is said, not a blank page
    page.goto(server.url + "/ui/nodes")
    page.wait_for_selector("table.nodes .st-Ready", timeout=SEEN)
    assert page.locator("table.nodes tbody tr td").nth(4).inner_text() == "1"  # holder's slot
    go.touch()


def test_two_thousand_jobs_stay_usable(page, serve, sqlite_url):
    """2,000 jobs (suspended: the test is about the pages, not the runs): the graph is drawn
    as groups, the jobs table in pages of 100."""
    server = serve(sqlite_url, "--no-local-node")
    jobs = [
        job_manifest(
            f"step-{i:04d}",
            ["true"],
            suspend=True,
            labels={"wave": str(i // 500)},
            dependsOn=[{"job": f"step-{i - 100:04d}"}] if i >= 100 else [],
        )
        for i in range(2000)
    ]
    _apply(server, *jobs)
    page.goto(server.url + "/")
    page.wait_for_selector("svg.graph g[data-group]", timeout=SEEN)
    labels = page.locator("svg.graph g[data-group] title").all_text_contents()  # "Suspended × 100: Suspended"
    assert 20 <= len(labels) <= 40  # 20 depths, by state (jobs not reconciled yet are Waiting)
    assert sum(int(label.split("×")[1].split(":")[0]) for label in labels) == 2000
    assert "grouped by depth and state" in page.locator(".note").inner_text()
    page.goto(server.url + "/?labelSelector=wave%3D0")  # 500 jobs: still grouped
    page.wait_for_selector("svg.graph g[data-group]", timeout=SEEN)
    page.goto(server.url + "/ui/jobs")
    page.wait_for_selector("table.jobs", timeout=SEEN)
    assert page.locator("table.jobs tbody tr").count() == 100
    assert page.locator(".count").inner_text() == "2000 jobs, page 1 of 20"
    page.click("a.page:text('next')")
    page.wait_for_selector(".count:text('page 2 of 20')", timeout=SEEN)
    assert page.locator("table.jobs tbody tr td:first-child").first.inner_text() == "step-0100"


def test_markup_in_a_job_is_shown_as_text(page, server):
    markup = "<img src=x onerror=alert(1)><b>bold</b>"
    _apply(server, job_manifest("markup", ["sh", "-c", f"echo '{markup}'"]))
    page.goto(server.url + "/ui/jobs/markup")
    page.wait_for_selector("h2 .st-Succeeded", timeout=SEEN)
    assert markup in page.locator("table.pairs td").first.inner_text()
    page.click("#follow-logs")
    page.wait_for_selector("#logs .said:text('the run has ended')", timeout=SEEN)
    assert page.locator("pre.log").inner_text().strip() == markup
    assert page.locator("main img, main b").count() == 0  # text, never elements
