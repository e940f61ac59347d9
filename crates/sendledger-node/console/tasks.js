"use strict";
// Tasks by phase, target, failure kind and time (GET /tasks, the ledger's task index), each
// target's circuit breaker beside them (GET /healthz), and, for failed tasks, the form that
// retries every task the filters select (POST /tasks/retry, page by page).

(() => {
  const { el, fill, call, health } = Console;
  const main = document.getElementById("main");
  const phases = ["failed", "retry_wait", "unknown", "manual_review", "sending", "accepted", "succeeded", "rejected"];
  const failures = ["", "connect", "throttled", "server_error", "local_resources", "operator"];
  const params = new URLSearchParams(location.search);

  const breakers = el("div", { id: "breakers", class: "tiles" });
  const phase = el("select", { id: "filter-phase" }, phases.map((p) => el("option", { value: p, selected: p === (params.get("phase") || "failed") }, p)));
  const target = el("select", { id: "filter-target" }, el("option", { value: "" }, "all"));
  const failure = el("select", { id: "filter-failure" }, failures.map((f) => el("option", { value: f, selected: f === (params.get("failure") || "") }, f || "any")));
  const from = el("input", { id: "filter-from", type: "datetime-local" });
  const to = el("input", { id: "filter-to", type: "datetime-local" });
  const table = el("table", { id: "tasks" });
  const count = el("p", { id: "tasks-count" });
  const status = el("p", { id: "tasks-status", class: "status" });
  const more = el("button", { id: "more", hidden: true, onclick: () => load(false) }, "More");
  const retry = el("section", { id: "retry", class: "resolve" });
  // Outside the form's section: the list read again after a retry may have no form to show.
  const result = el("p", { id: "retry-result" });
  const state = { rows: [], next: null };

  fill(main,
    el("h1", {}, "Tasks"),
    el("p", { class: "hint" }, "Tasks from the ledger's index. A failed task none of whose attempts reached the remote can be retried: its next result supersedes the failed one."),
    el("h2", {}, "Targets"), breakers,
    el("div", { class: "filters", id: "filters" },
      el("label", {}, "phase ", phase), el("label", {}, "target ", target), el("label", {}, "failure ", failure),
      el("label", {}, "entered from ", from), el("label", {}, "to ", to),
      el("button", { id: "apply", onclick: () => load(true) }, "Show")),
    count, table, more, status, retry, result);

  /** The selectors of GET /tasks (and of a bulk retry) the filters say. */
  function selectors() {
    const s = {};
    if (target.value) s.target = target.value;
    if (failure.value) s.failure = failure.value;
    if (from.value) s.from = new Date(from.value).toISOString();
    if (to.value) s.to = new Date(to.value).toISOString();
    return s;
  }

  async function load(fresh) {
    if (fresh) {
      state.rows = [];
      state.next = null;
    }
    const query = new URLSearchParams(Object.assign({ phase: phase.value, limit: "200" }, selectors()));
    if (state.next) query.set("after", state.next);
    fill(status, "Loading…");
    const { status: code, body } = await call("/tasks?" + query);
    if (code !== 200) {
      fill(status, "Cannot read the tasks (" + code + "): " + (body.error || ""));
      status.className = "status error";
      return;
    }
    state.rows.push(...body.tasks);
    state.next = body.next;
    more.hidden = !body.next;
    fill(count, state.rows.length + " task(s)" + (body.next ? " so far" : ""));
    fill(status, "Read at " + new Date().toLocaleTimeString());
    status.className = "status";
    const head = el("tr", {}, ["Task", "State", "Target", "Since", "Failure"].map((t) => el("th", {}, t)));
    const rows = state.rows.map((t) => el("tr", { "data-task": t.task_id },
      el("td", {}, el("a", { href: "/console/task/" + encodeURIComponent(t.task_id), class: "task-link" }, t.task_id)),
      el("td", {}, t.state), el("td", {}, t.target), el("td", { title: t.since }, new Date(t.since).toLocaleString()),
      el("td", {}, t.failure || "-")));
    fill(table, el("thead", {}, head), el("tbody", {}, rows));
    renderRetry();
  }

  /** The bulk retry form, for failed tasks when changes are possible. */
  async function renderRetry() {
    const h = await health;
    if (phase.value !== "failed" || !state.rows.length) return fill(retry);
    if (!h.token_configured) {
      return fill(retry, el("p", { class: "hint", id: "retry-readonly" },
        "Read-only: this service has no operators or admin.token configured. Retry with `sendledger tasks retry --data` on a stopped ledger."));
    }
    if (!h.who) {
      return fill(retry, el("p", { class: "hint", id: "retry-sign-in" },
        "Sign in (top right) with your operator token to retry the failed tasks these filters select."));
    }
    const form = el("form", { id: "retry-form" },
      el("h2", {}, "Retry the failed tasks these filters select"),
      h.who.operator ? el("p", { id: "by-operator" }, "Recorded as retried by " + h.who.operator + ".")
        : el("label", {}, "Your name ", el("input", { id: "by", autocomplete: "name" })),
      el("label", {}, "Reason ", el("input", { id: "reason" })),
      el("button", { id: "send-retry", type: "submit" }, "Retry"));
    form.addEventListener("submit", (e) => { e.preventDefault(); send(); });
    fill(retry, form);
  }

  async function send() {
    const who = (await health).who;
    const by = who.operator || document.getElementById("by").value;
    const reason = document.getElementById("reason").value;
    if (!by.trim() || !reason.trim()) return fill(result, "Give your name and a reason.");
    const body = Object.assign({ by, reason }, selectors());
    const totals = { selected: 0, retried: 0, refused: 0 };
    for (;;) {
      const { status: code, body: answer } = await call("/tasks/retry", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
      });
      if (code !== 200) {
        result.dataset.status = code;
        return fill(result, "Refused (" + code + "): " + (answer.error || ""));
      }
      for (const k of Object.keys(totals)) totals[k] += answer[k];
      if (!answer.next) break;
      body.after = answer.next;
    }
    result.dataset.status = 200;
    fill(result, "Retried " + totals.retried + " of " + totals.selected + " selected task(s)" + (totals.refused ? "; " + totals.refused + " refused" : "") + ".");
    load(true);
  }

  health.then((h) => {
    const targets = h.targets || {};
    for (const name of Object.keys(targets).sort()) target.append(el("option", { value: name, selected: name === params.get("target") }, name));
    fill(breakers, Object.keys(targets).sort().map((name) =>
      el("div", { class: "tile", "data-target": name },
        el("div", { class: "tile-label" }, name),
        el("div", { class: "tile-value breaker-" + targets[name].breaker }, "breaker " + targets[name].breaker))));
    load(true);
  });
})();
