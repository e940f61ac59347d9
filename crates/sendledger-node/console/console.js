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

  /** A request to the admin endpoint: its status and its JSON body (or {error} with the text). */
  async function call(path, options) {
    let response;
    try {
      response = await fetch(path, Object.assign({ cache: "no-store" }, options || {}));
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

  /** `/healthz`, once per page: whether changes are possible (a token is configured). */
  const health = call("/healthz").then(({ status, body }) => {
    const mode = document.getElementById("mode");
    if (status === 0) {
      fill(mode, "endpoint unreachable");
      mode.className = "mode error";
    } else if (body.token_configured) {
      fill(mode, "changes need the admin token");
      mode.className = "mode";
    } else {
      fill(mode, "read-only: no admin.token configured");
      mode.className = "mode readonly";
    }
    return body;
  });

  return { el, svg, fill, call, duration, secondsSince, reasonKind, identityText, health };
})();
