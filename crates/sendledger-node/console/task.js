"use strict";
// One task: its request, the remote ids seen, its whole timeline (GET /tasks/{id}, page by
// page), and while it is in manual review the form that resolves it (POST /reviews/{id}).

(() => {
  const { el, fill, call, reasonKind, identityText } = Console;
  const main = document.getElementById("main");
  // The task reference exactly as in the address (a task id, or an encoded identity).
  const ref = location.pathname.replace(/^\/console\/task\//, "");

  const view = el("div", { id: "task" });
  // Outside the view so that the outcome of a resolution stays shown after the refresh.
  const result = el("div", { id: "result", role: "status" });
  fill(main, result, view);

  /** The whole timeline: every page of GET /tasks/{ref}. */
  async function readTask() {
    let after = null;
    let task = null;
    for (;;) {
      const query = "?limit=5000" + (after === null ? "" : "&after=" + after);
      const { status, body } = await call("/tasks/" + ref + query);
      if (status !== 200) return { status, body };
      if (task === null) task = body;
      else task.events.push(...body.events);
      if (!body.more) return { status, body: task };
      after = body.next_after;
    }
  }

  async function load() {
    const { status, body } = await readTask();
    if (status !== 200) {
      fill(view, el("h1", {}, "Task"),
        el("p", { class: "error", id: "page-error" }, "Cannot read this task (" + status + "): " + (body.error || "")));
      return;
    }
    render(body, await Console.health);
  }

  function render(task, health) {
    const review = [...task.events].reverse().find((e) => e.event === "ManualReviewRequired");
    const request = task.request || {};
    fill(view,
      el("h1", {}, "Task ", el("span", { class: "mono", id: "task-id" }, task.task_id)),
      el("dl", { class: "summary" },
        el("dt", {}, "State"), el("dd", {}, el("span", { id: "task-state", class: "state state-" + task.state }, task.state)),
        el("dt", {}, "Identity"), el("dd", { id: "task-identity" }, identityText(request.identity)),
        el("dt", {}, "Target"), el("dd", { id: "task-target" }, request.target || "-",
          task.target && task.target !== request.target ? ", attempts moved to its fallback " + task.target : ""),
        el("dt", {}, "Attempts"), el("dd", {}, String(task.attempts)),
        el("dt", {}, "Remote id"), el("dd", { id: "task-remote-id" }, task.remote_id || "none"),
        el("dt", {}, "Lookup URL"), el("dd", { id: "task-lookup-url", class: "mono" }, task.lookup_url || "no lookup configured"),
        task.waiting ? [el("dt", {}, "Waiting"), el("dd", { id: "task-waiting" },
          task.waiting.reason + ", since " + task.waiting.since + "; looks again from " + task.waiting.until)] : null,
        task.state === "manual_review" && review ? [el("dt", {}, "Review reason"), el("dd", { id: "task-reason" }, review.detail)] : null),
      task.state === "manual_review" ? resolveForm(task, health) : el("p", { class: "hint", id: "not-in-review" },
        "This task is " + task.state + ": only tasks in manual review can be resolved."),
      task.saga ? [el("h2", {}, "Steps"), steps(task.saga)] : null,
      el("h2", {}, "Remote ids seen"),
      remoteIds(task),
      el("h2", {}, "Request"),
      el("p", { class: "hint" }, "The payload as accepted. Headers and secrets come from the target's configuration and are never shown here."),
      el("pre", { id: "payload", class: "payload" }, prettyPayload(request.payload)),
      metadata(request.metadata),
      el("h2", {}, "Timeline"),
      timeline(task.events));
  }

  function prettyPayload(payload) {
    if (payload === undefined || payload === null) return "(no request recorded)";
    try {
      return JSON.stringify(JSON.parse(payload), null, 2);
    } catch (_) {
      return payload;
    }
  }

  function metadata(meta) {
    const entries = Object.entries(meta || {});
    if (entries.length === 0) return null;
    return el("table", { class: "meta" }, el("tbody", {}, entries.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v)))));
  }

  /** A multi-step task's steps: each one's outcome and compensation, the current one marked. */
  function steps(saga) {
    const outcome = (o) => o.status + (o.remote_id ? " " + o.remote_id : "") +
      (o.http_status ? " (HTTP " + o.http_status + ": " + o.detail + ")" : "") + (o.reason ? " (" + o.reason + ")" : "");
    const current = (n) => saga.leg.kind === "step" && saga.leg.step === n ? "this step's call now" :
      saga.leg.kind === "compensation" && saga.leg.step === n ? "its compensation now" : "";
    return el("table", { id: "steps" },
      el("thead", {}, el("tr", {}, ["#", "Step", "Target", "Outcome", "Undone by", "Compensation", "Duplicates undone", ""].map((h) => el("th", {}, h)))),
      el("tbody", {}, saga.steps.map((s, n) => el("tr", { "data-step": s.name },
        el("td", {}, String(n)),
        el("td", {}, s.name),
        el("td", {}, s.target),
        el("td", { class: "mono" }, outcome(s.outcome), s.answer ? el("div", { class: "answer" },
          "kept: " + Object.entries(s.answer).map(([k, v]) => k + "=" + v).join(", ")) : null),
        el("td", {}, s.compensate || "not undone"),
        el("td", { class: "mono" }, s.compensation ? undoing(s.compensation) : ""),
        el("td", { class: "mono duplicates" }, (s.duplicates || []).map(undoing).join("; ")),
        el("td", {}, current(n))))));
    function undoing(c) {
      return outcome(c.outcome) + ", undoing " + c.undoes + " (by " + c.by + ")";
    }
  }

  function remoteIds(task) {
    const seen = task.remote_ids_seen || [];
    if (seen.length === 0) return el("p", { id: "remote-ids" }, "No remote record has been seen for this task.");
    return el("ul", { id: "remote-ids" }, seen.map((s) =>
      el("li", {}, el("span", { class: "mono" }, s.remote_id), " — " + s.seen.join(", "))));
  }

  function timeline(events) {
    return el("table", { id: "timeline" },
      el("thead", {}, el("tr", {}, ["#", "Time", "Event", "Attempt", "Detail", "Evidence"].map((h) => el("th", {}, h)))),
      el("tbody", {}, events.map((e) => el("tr", { "data-event": e.event },
        el("td", {}, String(e.seq)),
        el("td", { class: "mono" }, e.at),
        el("td", {}, e.event),
        el("td", {}, e.attempt === null || e.attempt === undefined ? "" : String(e.attempt)),
        el("td", { class: "detail" }, e.detail),
        el("td", {}, evidence(e))))));
  }

  /** The event's recorded fields, folded away (the payload is shown above). */
  function evidence(e) {
    const data = Object.assign({}, e.data || {});
    delete data.request;
    if (Object.keys(data).length === 0) return "";
    return el("details", {}, el("summary", {}, "fields"), el("pre", {}, JSON.stringify(data, null, 2)));
  }

  /** The resolve form: choose, fill, see what will be recorded, then send. */
  function resolveForm(task, health) {
    const section = el("section", { id: "resolve", class: "resolve" }, el("h2", {}, "Resolve this review"));
    if (!health.token_configured) {
      section.append(el("p", { class: "readonly", id: "read-only" },
        "Read-only: this service has no operators or admin.token configured, so the endpoint refuses resolutions. " +
        "Configure [admin.operators] and restart, or resolve on a stopped ledger with `sendledger review resolve --data`."));
      return section;
    }
    if (!health.who) {
      section.append(el("p", { class: "readonly", id: "sign-in-first" },
        "Sign in (top right) with your operator token to resolve this review."));
      return section;
    }
    // An operator's token names them; the shared admin.token names no one.
    const named = health.who.operator;
    const choice = (value, label) => el("label", {}, el("input", { type: "radio", name: "as", value, id: "as-" + value }), " " + label);
    const seen = (task.remote_ids_seen || []).map((s) => s.remote_id);
    // A multi-step task in review at a step: its records can be ordered undone.
    const atStep = task.saga && task.saga.leg.kind === "step";
    const form = el("form", { id: "resolve-form" },
      el("fieldset", {}, el("legend", {}, atStep ? "This step is now" : "The task is now"),
        choice("succeeded", atStep ? "succeeded: this remote record is the step's, and the task goes on" : "succeeded: this remote record is the task's"),
        choice("failed", atStep ? "failed: nothing was done remotely (the steps before it are undone)" : "failed: nothing was or will be done remotely"),
        atStep ? choice("compensated", "undo the whole task: every step that succeeded, last first (give this step's remote id if it did happen)") : null,
        choice("resend", "not done: authorize one new attempt (check the remote holds no record first)")),
      el("label", {}, atStep ? "Remote id (the step's record) " : "Remote id (succeeded) ",
        el("input", { id: "remote-id", list: "seen-ids", autocomplete: "off" }),
        el("datalist", { id: "seen-ids" }, seen.map((id) => el("option", { value: id })))),
      atStep ? el("label", {}, "Duplicates to undo (remote ids the lookup found besides the step's record, comma-separated) ",
        el("input", { id: "undo", autocomplete: "off" })) : null,
      named ? el("p", { id: "by-operator" }, "Recorded as decided by " + named + ".")
        : el("label", {}, "Your name ", el("input", { id: "by", autocomplete: "name" })),
      el("label", {}, "Reason ", el("textarea", { id: "reason", rows: 2 })),
      el("p", { id: "form-error", class: "error" }),
      el("button", { type: "submit", id: "review" }, "Review what will be recorded"));
    const preview = el("div", { id: "preview", hidden: true });
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      showPreview(task, form, preview, named);
    });
    section.append(form, preview);
    return section;
  }

  /** The body to send, or an error message. */
  function bodyOf(task, named) {
    const picked = document.querySelector("input[name=as]:checked");
    const by = named || document.getElementById("by").value.trim();
    const reason = document.getElementById("reason").value.trim();
    const remoteId = document.getElementById("remote-id").value.trim();
    if (!picked) return { error: "Choose what the task is now." };
    if (!by) return { error: "Give your name: it is recorded with the resolution." };
    if (!reason) return { error: "Give a reason: it is recorded with the resolution." };
    const undoField = document.getElementById("undo");
    const undo = undoField ? undoField.value.split(/[\s,]+/).filter(Boolean) : [];
    const undoing = undo.length === 0 ? "" : " The duplicates " + undo.join(", ") +
      " are undone first, each by the step's compensating target.";
    if (undo.length > 0 && (picked.value === "failed" || picked.value === "resend")) {
      return { error: "Duplicates are undone only with succeeded or with undoing the whole task." };
    }
    if (picked.value === "succeeded") {
      if (!remoteId) return { error: "Give the remote id of the record that is the task's." };
      if (undo.length > 0) {
        return { body: { as: "succeeded", remote_id: remoteId, undo, by, reason },
          says: "The step's record is " + remoteId + ", by operator " + by + " (" + reason + ")." + undoing + " Then the task goes on." };
      }
      return { body: { as: "succeeded", remote_id: remoteId, by, reason },
        says: "Confirmed with remote id " + remoteId + ", evidence: operator " + by + " (" + reason + "). The task becomes succeeded." };
    }
    if (picked.value === "compensated") {
      if (undo.length > 0 && !remoteId) return { error: "Give the step's own record: the duplicates are undone next to it." };
      const body = { as: "compensated", by, reason };
      if (remoteId) body.remote_id = remoteId;
      if (undo.length > 0) body.undo = undo;
      return { body,
        says: "The whole task is undone, ordered by operator " + by + " (" + reason + ")." + undoing +
          (remoteId ? " This step's record " + remoteId + " and every step before it that succeeded are undone, last first."
            : " This step did not happen; the steps before it that succeeded are undone, last first.") +
          " The task becomes compensated." };
    }
    if (picked.value === "failed") {
      return { body: { as: "failed", by, reason },
        says: "Failed, by operator " + by + " (" + reason + ")." + (task.saga
          ? " The steps before it that succeeded are undone, last first; with none, the task becomes failed."
          : " The task becomes failed.") };
    }
    return { body: { resend: true, by, reason },
      says: "Resend authorized by " + by + " (" + reason + "). The service sends one new attempt." };
  }

  function showPreview(task, form, preview, named) {
    const error = document.getElementById("form-error");
    const { body, says, error: problem } = bodyOf(task, named);
    fill(error, problem || "");
    if (problem) return;
    form.hidden = true;
    preview.hidden = false;
    fill(preview,
      el("h3", {}, "This will be recorded in the ledger"),
      el("p", { id: "preview-says" }, says),
      el("pre", { id: "preview-body" }, "POST /reviews/" + task.task_id + "\n" + JSON.stringify(body, null, 2)),
      el("button", { id: "send", onclick: () => send(task, body, preview) }, "Record this resolution"),
      " ",
      el("button", { id: "edit", onclick: () => { preview.hidden = true; form.hidden = false; } }, "Change"));
  }

  async function send(task, body, preview) {
    for (const button of preview.querySelectorAll("button")) button.disabled = true;
    const { status, body: answer } = await call("/reviews/" + encodeURIComponent(task.task_id), {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    result.className = status === 200 ? "result ok" : "result error";
    if (status === 200) {
      fill(result, "Recorded: " + (answer.recorded || []).join(", ") + ". The task is now " + answer.state + ".");
    } else if (status === 401) {
      fill(result, "Refused (401): " + answer.error + " Nothing was recorded. Sign in again.");
    } else if (status === 403) {
      fill(result, "Refused (403): " + answer.error);
    } else if (status === 409) {
      fill(result, "Refused (409): " + answer.error + ". Someone resolved it already; the page below shows what the ledger holds.");
    } else {
      fill(result, "Not recorded (" + status + "): " + (answer.error || ""));
    }
    result.dataset.status = String(status);
    if (status === 401 || status === 403) {
      // Nothing changed: let the operator sign in again or change the form.
      for (const button of preview.querySelectorAll("button")) button.disabled = false;
      return;
    }
    await load();
  }

  load();
})();
