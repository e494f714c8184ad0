// The dashboard's one script: fetch the view's HTML fragment (rendered by the server) with
// the tab's bearer token, keep it current from the watch stream, follow logs, and send the
// admin's cancel / suspend / resume / rerun. No framework, no build step.
(function () {
  "use strict";
  const KEY = "reconciler.token"; // sessionStorage: this tab only, gone when it closes
  const API = "/apis/reconciler.dev/v1alpha1";
  const view = document.body.dataset.view;
  const main = document.getElementById("main");
  const live = document.getElementById("live");
  const login = document.getElementById("login");
  const signout = document.getElementById("signout");
  let rv = null; // the resourceVersion the page shows: the watch goes on from it
  let timer = null;
  let loading = null;
  let again = false;

  function headers() {
    const token = sessionStorage.getItem(KEY);
    return token ? { Authorization: "Bearer " + token } : {};
  }

  function fragmentUrl() {
    const path = location.pathname === "/" ? "/graph" : location.pathname.slice(3);
    return "/ui/fragments" + path + location.search;
  }

  function say(element, text) {
    if (element) element.textContent = text;
  }

  function showLogin(message) {
    login.hidden = false;
    main.replaceChildren();
    say(login.querySelector(".said"), message);
    say(live, "signed out");
  }

  // Fetch the view again and swap it in; the logs panel (and its running follow) survives.
  async function load() {
    const response = await fetch(fragmentUrl(), { headers: headers(), cache: "no-store" });
    if (response.status === 401) {
      showLogin(sessionStorage.getItem(KEY) ? "that token was refused" : "");
      return false;
    }
    if (!response.ok) {
      const problem = document.createElement("p");
      problem.className = "problem";
      problem.textContent = "the server answered " + response.status;
      main.replaceChildren(problem);
      return false;
    }
    const holder = document.createElement("div");
    holder.innerHTML = await response.text(); // escaped by the server, from this origin
    const fresh = holder.firstElementChild;
    const oldLogs = main.querySelector("#logs");
    const newLogs = fresh.querySelector("#logs");
    if (oldLogs && newLogs && oldLogs.dataset.ready) newLogs.replaceWith(oldLogs);
    main.replaceChildren(fresh);
    rv = fresh.dataset.rv;
    signout.hidden = !sessionStorage.getItem(KEY);
    bind(fresh);
    return true;
  }

  // At most one fetch at a time; changes arriving meanwhile ask for one more afterwards.
  function refresh(delay) {
    if (timer !== null) return;
    timer = setTimeout(async function () {
      timer = null;
      if (loading) {
        again = true;
        return;
      }
      loading = load().catch(function () {});
      await loading;
      loading = null;
      if (again) {
        again = false;
        refresh(delay);
      }
    }, delay);
  }

  function stateOf(job) {
    const status = job.status || {};
    if (job.metadata.deletionTimestamp) return "Terminating";
    const phase = status.phase || "Waiting";
    return phase === "Completed" ? status.outcome || phase : phase;
  }

  // One change from the watch stream: recolour the graph's box in place, or fetch the view.
  function changed(event) {
    if (event.type === "BOOKMARK") {
      rv = event.object.metadata.resourceVersion;
      return;
    }
    const obj = event.object;
    rv = obj.metadata.resourceVersion;
    const fragment = main.querySelector(".fragment");
    if (!fragment) return;
    if (view === "graph" && fragment.dataset.grouped === "0" && event.type === "MODIFIED") {
      const box = fragment.querySelector('g[data-job="' + CSS.escape(obj.metadata.name) + '"]');
      if (box) {
        const state = stateOf(obj);
        box.setAttribute("class", "job st-" + state);
        say(box.querySelector("title"), obj.metadata.name + ": " + state);
        refresh(1500); // the legend's counts
        return;
      }
    }
    if (view === "job" && fragment.dataset.job !== obj.metadata.name) return;
    refresh(view === "graph" ? 1000 : 300);
  }

  async function follow(path, onLine) {
    const response = await fetch(path, { headers: headers(), cache: "no-store" });
    if (!response.ok) throw new Error("the server answered " + response.status);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      onLine(decoder.decode(value, { stream: true }));
    }
  }

  // The watch stream of API.md section 4, from the page's resourceVersion; after a gap
  // (server restarted, or too far behind: 410) the view is fetched again and watched anew.
  async function watch() {
    const kind = view === "nodes" ? "nodes" : "jobs";
    for (;;) {
      let buffer = "";
      let gone = false;
      const url = API + "/" + kind + "?watch=true&allowWatchBookmarks=true&resourceVersion=" + rv;
      say(live, "live");
      live.className = "live on";
      try {
        await follow(url, function (text) {
          buffer += text;
          let end;
          while ((end = buffer.indexOf("\n")) >= 0) {
            const line = buffer.slice(0, end);
            buffer = buffer.slice(end + 1);
            if (!line.trim()) continue;
            const event = JSON.parse(line);
            if (event.type === "ERROR") gone = true;
            else changed(event);
          }
        });
      } catch (error) {
        gone = true;
      }
      say(live, "reconnecting");
      live.className = "live off";
      await new Promise(function (resolve) {
        setTimeout(resolve, gone ? 1000 : 200);
      });
      if (!(await load().catch(function () { return false; }))) {
        if (!login.hidden) return;
      }
    }
  }

  async function act(button) {
    const said = document.getElementById("notice"); // outside the view: it outlives the refresh
    const url = API + "/jobs/" + encodeURIComponent(button.dataset.job) + "/" + button.dataset.action + "?requestedBy=dashboard";
    button.disabled = true;
    try {
      const response = await fetch(url, { method: "POST", headers: headers() });
      const answer = await response.json().catch(function () { return {}; });
      say(said, answer.message || "the server answered " + response.status);
    } finally {
      button.disabled = false;
      refresh(0);
    }
  }

  function logsPanel(panel, job) {
    panel.dataset.ready = "1";
    const title = document.createElement("h3");
    title.textContent = "Logs";
    const button = document.createElement("button");
    button.type = "button";
    button.id = "follow-logs";
    button.textContent = "follow logs of the latest run";
    const state = document.createElement("span");
    state.className = "said";
    const pre = document.createElement("pre");
    pre.className = "log";
    button.addEventListener("click", async function () {
      pre.textContent = "";
      button.disabled = true;
      say(state, "following");
      try {
        await follow(API + "/jobs/" + encodeURIComponent(job) + "/log?follow=true", function (text) {
          const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
          pre.append(text);
          if (atEnd) pre.scrollTop = pre.scrollHeight;
        });
        say(state, "the run has ended");
      } catch (error) {
        say(state, String(error.message || error));
      } finally {
        button.disabled = false;
      }
    });
    panel.append(title, button, state, pre);
  }

  function bind(fragment) {
    fragment.querySelectorAll("button.action").forEach(function (button) {
      button.addEventListener("click", function () {
        act(button);
      });
    });
    const panel = fragment.querySelector("#logs");
    if (panel && !panel.dataset.ready) logsPanel(panel, fragment.dataset.job);
  }

  login.addEventListener("submit", function (event) {
    event.preventDefault();
    sessionStorage.setItem(KEY, login.elements.token.value.trim());
    login.reset();
    login.hidden = true;
    start();
  });
  signout.addEventListener("click", function () {
    sessionStorage.removeItem(KEY);
    location.reload();
  });

  async function start() {
    if (await load().catch(function () { return false; })) watch();
  }
  // a node's allocation changes with the jobs placed on it, and its heartbeat's age with the
  // clock: the nodes view (watching nodes) is also fetched again every few seconds
  if (view === "nodes") {
    setInterval(function () {
      if (login.hidden) refresh(0);
    }, 5000);
  }
  start();
})();
