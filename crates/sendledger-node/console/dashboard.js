"use strict";
// The dashboard: the numbers of GET /metrics (the Prometheus text, parsed here) drawn as
// small bar charts, read again every few seconds.

(() => {
  const { el, svg, fill, duration } = Console;
  const main = document.getElementById("main");
  const REFRESH_MS = 5000;

  const tiles = el("div", { class: "tiles", id: "tiles" });
  const charts = el("div", { class: "charts", id: "charts" });
  const status = el("p", { class: "status", id: "dashboard-status" });
  fill(main, el("h1", {}, "Dashboard"), tiles, charts, status);

  /** The samples of Prometheus text: [{name, labels, value}]. Comments are skipped. */
  function parse(text) {
    const samples = [];
    const line = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
    const label = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
    for (const row of text.split("\n")) {
      if (row.startsWith("#")) continue;
      const m = line.exec(row);
      if (!m) continue;
      const labels = {};
      for (const [, key, value] of (m[2] || "").matchAll(label)) {
        labels[key] = value.replace(/\\n/g, "\n").replace(/\\(.)/g, "$1");
      }
      samples.push({ name: m[1], labels, value: Number(m[3]) });
    }
    return samples;
  }

  /** [label, value] of one metric by one label, in label order (numeric when they are). */
  function byLabel(samples, name, key) {
    const rows = samples.filter((s) => s.name === name && key in s.labels).map((s) => [s.labels[key], s.value]);
    const numeric = rows.every(([l]) => /^\d+$/.test(l));
    return rows.sort(([a], [b]) => (numeric ? Number(a) - Number(b) : a < b ? -1 : a > b ? 1 : 0));
  }

  /** Consumer lag by partition; by topic/partition when several requests topics are read. */
  function lagRows(samples) {
    const lag = samples.filter((s) => s.name === "sendledger_consumer_lag_messages" && "partition" in s.labels);
    const topics = new Set(lag.map((s) => s.labels.topic));
    if (topics.size <= 1) return byLabel(lag, "sendledger_consumer_lag_messages", "partition");
    return lag.map((s) => [s.labels.topic + "/" + s.labels.partition, s.value]).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  }

  function single(samples, name) {
    const s = samples.find((x) => x.name === name && Object.keys(x.labels).length === 0);
    return s ? s.value : 0;
  }

  /** A horizontal bar chart, drawn as SVG; an empty note when there is nothing to draw. */
  function barChart(id, title, rows, empty) {
    const figure = el("figure", { class: "chart", id });
    figure.append(el("figcaption", {}, title));
    if (rows.length === 0) {
      figure.append(el("p", { class: "hint" }, empty));
      return figure;
    }
    const [labelWidth, barWidth, rowHeight] = [120, 220, 22];
    const max = Math.max(1, ...rows.map(([, v]) => v));
    const chart = svg("svg", {
      width: labelWidth + barWidth + 60, height: rows.length * rowHeight + 4,
      role: "img", "aria-label": title,
    });
    rows.forEach(([label, value], i) => {
      const y = i * rowHeight + 2;
      const width = value > 0 ? Math.max(2, (value / max) * barWidth) : 0;
      chart.append(
        svg("text", { x: labelWidth - 6, y: y + 15, "text-anchor": "end", class: "label" }, label),
        svg("rect", { x: labelWidth, y: y + 3, width, height: rowHeight - 8, class: "bar" }),
        svg("text", { x: labelWidth + width + 6, y: y + 15, class: "value", "data-label": label }, formatNumber(value)));
    });
    figure.append(chart);
    return figure;
  }

  function formatNumber(v) {
    return Number.isInteger(v) ? String(v) : v.toFixed(2);
  }

  function tile(id, label, value) {
    return el("div", { class: "tile", id }, el("div", { class: "tile-value" }, value), el("div", { class: "tile-label" }, label));
  }

  async function load() {
    let text;
    try {
      const response = await fetch("/metrics", Console.withToken());
      if (!response.ok) throw new Error("status " + response.status);
      text = await response.text();
    } catch (e) {
      fill(status, "Cannot read /metrics: " + e.message);
      status.className = "status error";
      return;
    }
    const samples = parse(text);
    const unknowns = single(samples, "sendledger_unknowns_open");
    const oldest = single(samples, "sendledger_unknown_oldest_age_seconds");
    const reviews = samples.find((s) => s.name === "sendledger_tasks" && s.labels.state === "manual_review");
    // Each target's circuit breaker: 0 closed, 1 open (its tasks wait), 2 half-open.
    const breakers = byLabel(samples, "sendledger_target_state", "target").map(([target, value]) =>
      tile("tile-target-" + target, "target " + target, ["closed", "open", "half-open"][value] || "unknown"));
    fill(tiles,
      tile("tile-review", "in manual review", String(reviews ? reviews.value : 0)),
      tile("tile-unknowns", "open unknowns", String(unknowns)),
      tile("tile-oldest", "oldest unknown", unknowns > 0 ? duration(oldest) : "none"),
      ...breakers);
    fill(charts,
      barChart("chart-tasks", "Tasks by state", byLabel(samples, "sendledger_tasks", "state"), "No tasks counted yet."),
      barChart("chart-attempts", "Attempts by class", byLabel(samples, "sendledger_attempts_total", "class"), "No attempt since the service started."),
      barChart("chart-lookups", "Lookups by outcome", byLabel(samples, "sendledger_lookups_total", "outcome"), "No lookup since the service started."),
      barChart("chart-lag", "Consumer lag per partition (messages)", lagRows(samples), "No consumer lag reported (no Kafka consumer running, or no statistics yet)."));
    fill(status, "Read at " + new Date().toLocaleTimeString() + "; counters since the service started, tasks from the ledger.");
    status.className = "status";
  }

  load();
  setInterval(load, REFRESH_MS);
})();
