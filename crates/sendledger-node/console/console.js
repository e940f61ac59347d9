"use strict";
// Shared by every console page. Data from the endpoint is only ever inserted as text
// (textContent, text nodes, attribute values), never parsed as HTML.

const Console = (() => {
  /** An element with attributes and children; strings become text nodes. */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  /** An SVG element (the dashboard's charts). */
  function svg(tag, attrs, ...children) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  function setAttrs(node, attrs) {
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "text") node.textContent = String(value);
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
  }

  function append(node, children) {
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      if (Array.isArray(child)) append(node, child);
      else node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
  }

  /** Replaces a node's children. */
  function fill(node, ...children) {
    node.replaceChildren();
    append(node, children);
    return node;
  }

  // The operator's token, for this browser tab only (sessionStorage): sent with every call.
  const TOKEN_KEY = "sendledger-token";
  const token = () => sessionStorage.getItem(TOKEN_KEY) || "";

  /** The options of a fetch, with the signed-in operator's token unless they carry one. */
  function withToken(options) {
    const opts = Object.assign({ cache: "no-store" }, options || {});
    if (token()) opts.headers = Object.assign({ "Authorization": "Bearer " + token() }, opts.headers || {});
    return opts;
  }

  /** A request to the admin endpoint: its status and its JSON body (or {error} with the text). */
  async function call(path, options) {
    let response;
    try {
      response = await fetch(path, withToken(options));
    } catch (e) {
      return { status: 0, body: { error: "the admin endpoint did not answer: " + e.message } };
    }
    const text = await response.text();
    let body;
    try {
      body = JSON.parse(text);
    } catch (_) {
      body = { error: text };
    }
    return { status: response.status, body };
  }

  /** A duration in seconds as "3d 4h", "2h 5m", "4m 10s" or "12s". */
  function duration(seconds) {
    const s = Math.max(0, Math.floor(seconds));
    const units = [["d", 86400], ["h", 3600], ["m", 60], ["s", 1]];
    const parts = [];
    let rest = s;
    for (const [name, size] of units) {
      const n = Math.floor(rest / size);
      rest -= n * size;
      if (n > 0 || (parts.length === 0 && size === 1)) parts.push(n + name);
      if (parts.length === 2) break;
    }
    return parts.join(" ");
  }

  /** Seconds since an RFC 3339 time. */
  function secondsSince(time) {
    const at = Date.parse(time);
    return Number.isNaN(at) ? NaN : (Date.now() - at) / 1000;
  }

  /** The variant of a review reason: "DeadlinePassed", "NoLookup", ... */
  function reasonKind(reviewReason) {
    if (!reviewReason) return "unknown";
    if (typeof reviewReason === "string") return reviewReason;
    return Object.keys(reviewReason)[0] || "unknown";
  }

  /** The identity as text, tenant/operation/request_key. */
  function identityText(identity) {
    if (!identity) return "-";
    return [identity.tenant, identity.operation, identity.request_key].join("/");
  }

  /**
   * Who is signed in (`/whoami` with the tab's token): `{operator, credential, roles, tenants}`,
   * `{operator: null, shared_token: true}` for the shared admin.token, or null.
   */
  const whoami = (token() ? call("/whoami") : Promise.resolve({ status: 0 })).then(({ status, body }) => {
    if (status === 200) return body;
    if (status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      signinError = "Signed out (401): " + (body.error || "");
    }
    return null;
  });
  let signinError = "";

  /** The sign-in corner of the header: the token field, or who is signed in. */
  async function renderSignin(who) {
    const corner = document.getElementById("signin");
    if (who) {
      const scope = who.operator === null ? "shared admin token"
        : who.roles.join(", ") + (who.tenants ? " · tenants " + who.tenants.join(", ") : " · every tenant");
      const out = el("button", { id: "signout", type: "button" }, "Sign out");
      out.addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); location.reload(); });
      return fill(corner, el("span", { id: "signed-in" }, (who.operator || "signed in") + " (" + scope + ")"), " ", out);
    }
    const field = el("input", { id: "signin-token", type: "password", autocomplete: "off", placeholder: "operator token" });
    const error = el("span", { id: "signin-error", class: "error" }, signinError);
    const form = el("form", { id: "signin-form" }, field, " ", el("button", { id: "signin-button", type: "submit" }, "Sign in"), " ", error);
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      fill(error);
      const { status, body } = await call("/whoami", { headers: { "Authorization": "Bearer " + field.value } });
      if (status !== 200) return fill(error, "Refused (" + status + "): " + (body.error || ""));
      sessionStorage.setItem(TOKEN_KEY, field.value);
      location.reload();
    });
    fill(corner, form);
  }

  /** `/healthz`, once per page: whether changes are possible (credentials are configured). */
  const health = Promise.all([call("/healthz"), whoami]).then(([{ status, body }, who]) => {
    const mode = document.getElementById("mode");
    renderSignin(who);
    if (status === 0) {
      fill(mode, "endpoint unreachable");
      mode.className = "mode error";
    } else if (!body.token_configured) {
      fill(mode, "read-only: no operators or admin.token configured");
      mode.className = "mode readonly";
    } else if (!who && body.reads_need_credential) {
      fill(mode, "sign in to read and to change");
      mode.className = "mode";
    } else if (!who) {
      fill(mode, "changes need a signed-in operator");
      mode.className = "mode";
    } else {
      fill(mode, "");
      mode.className = "mode";
    }
    body.who = who;
    return body;
  });

  return { el, svg, fill, call, withToken, duration, secondsSince, reasonKind, identityText, health };
})();
