"use strict";
// The review queue: every task in manual review (GET /reviews), filterable by target, tenant
// and reason, sortable by any column.

(() => {
  const { el, fill, call, duration, secondsSince, reasonKind, identityText } = Console;
  const main = document.getElementById("main");

  /** The columns: heading, the value sorted by, and the cell's content. */
  const columns = [
    ["Task", (r) => identityText(r.identity), (r) =>
      el("a", { href: "/console/task/" + encodeURIComponent(r.task_id), class: "task-link" }, identityText(r.identity))],
    ["Target", (r) => r.target || "", (r) => r.target || "-"],
    ["Tenant", (r) => (r.identity && r.identity.tenant) || "", (r) => (r.identity && r.identity.tenant) || "-"],
    ["Reason", (r) => r.reason || "", (r) => [el("span", { class: "tag", text: reasonKind(r.review_reason) }), " ", r.reason || "-"]],
    ["In review for", (r) => -Date.parse(r.since), (r) =>
      el("span", { title: r.since, text: duration(secondsSince(r.since)) })],
    ["Attempts", (r) => r.evidence.attempts, (r) => String(r.evidence.attempts)],
    ["Lookups", (r) => r.evidence.lookups, (r) => String(r.evidence.lookups)],
    ["Last matches", (r) => r.evidence.last_matches.length, (r) =>
      r.evidence.last_matches.length ? r.evidence.last_matches.join(", ") : "none"],
  ];

  const state = { items: [], sortBy: 4, descending: false, filters: { target: "", tenant: "", reason: "" } };

  const filterValues = {
    target: (r) => r.target || "",
    tenant: (r) => (r.identity && r.identity.tenant) || "",
    reason: (r) => reasonKind(r.review_reason),
  };

  const count = el("p", { id: "queue-count" });
  const filters = el("div", { class: "filters", id: "filters" });
  const table = el("table", { id: "queue" });
  const status = el("p", { id: "queue-status", class: "status" });
  fill(main,
    el("h1", {}, "Review queue"),
    el("p", { class: "hint" }, "Tasks whose outcome needs a person. Open one to see its evidence and resolve it."),
    filters, count, table, status,
    el("button", { id: "refresh", onclick: load }, "Refresh"));

  function renderFilters() {
    fill(filters, Object.keys(filterValues).map((name) => {
      const values = [...new Set(state.items.map(filterValues[name]))].sort();
      const select = el("select", { id: "filter-" + name, onchange: (e) => { state.filters[name] = e.target.value; renderTable(); } },
        el("option", { value: "" }, "all"),
        values.map((v) => el("option", { value: v, selected: v === state.filters[name] }, v)));
      return el("label", {}, name + " ", select);
    }));
  }

  function visibleRows() {
    const rows = state.items.filter((r) =>
      Object.entries(state.filters).every(([name, want]) => !want || filterValues[name](r) === want));
    const key = columns[state.sortBy][1];
    rows.sort((a, b) => {
      const [x, y] = [key(a), key(b)];
      const order = x < y ? -1 : x > y ? 1 : 0;
      return state.descending ? -order : order;
    });
    return rows;
  }

  function renderTable() {
    const rows = visibleRows();
    fill(count, rows.length + " of " + state.items.length + " task(s) in manual review");
    const head = el("tr", {}, columns.map(([title], i) =>
      el("th", {
        class: "sortable",
        "aria-sort": i === state.sortBy ? (state.descending ? "descending" : "ascending") : null,
        onclick: () => {
          state.descending = state.sortBy === i ? !state.descending : false;
          state.sortBy = i;
          renderTable();
        },
      }, title + (i === state.sortBy ? (state.descending ? " ▼" : " ▲") : ""))));
    const body = rows.map((r) =>
      el("tr", { "data-task": r.task_id }, columns.map(([, , cell]) => el("td", {}, cell(r)))));
    fill(table, el("thead", {}, head), el("tbody", {}, body));
  }

  async function load() {
    fill(status, "Loading…");
    const { status: code, body } = await call("/reviews");
    if (code !== 200) {
      fill(status, "Cannot read the review queue (" + code + "): " + (body.error || ""));
      status.className = "status error";
      return;
    }
    state.items = body;
    fill(status, "Read at " + new Date().toLocaleTimeString());
    status.className = "status";
    renderFilters();
    renderTable();
  }

  load();
})();
