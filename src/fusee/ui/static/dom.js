// Small DOM helpers: elements from a tag, attributes and children; formatting.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

export function when(seconds) {
  if (!seconds) return "–";
  return new Date(seconds * 1000).toLocaleString();
}

export function ago(seconds) {
  if (!seconds) return "–";
  const d = Date.now() / 1000 - seconds;
  if (d < 60) return `${Math.max(0, Math.round(d))} s ago`;
  if (d < 3600) return `${Math.round(d / 60)} min ago`;
  if (d < 86400) return `${Math.round(d / 3600)} h ago`;
  return `${Math.round(d / 86400)} d ago`;
}

export function span(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 120) return `${seconds.toFixed(1)} s`;
  return `${Math.round(seconds / 60)} min`;
}

export function pretty(value) {
  return JSON.stringify(value, null, 2);
}

export function statusBadge(status) {
  return h("span", { class: `badge s-${status}`, text: status });
}

// A JSON field that says what is wrong next to it, for the textareas that take JSON.
export function jsonField(label, id, initial, { object = false } = {}) {
  const area = h("textarea", { id, rows: 6, spellcheck: "false", "aria-describedby": `${id}-err` });
  area.value = initial;
  const err = h("p", { id: `${id}-err`, class: "field-error", role: "alert" });
  const wrap = h("div", { class: "field" }, h("label", { for: id, text: label }), area, err);
  const read = () => {
    const text = area.value.trim();
    let value;
    try {
      value = text === "" ? null : JSON.parse(text);
    } catch (e) {
      return fail(`Not valid JSON: ${e.message}`);
    }
    if (object && (value === null || typeof value !== "object" || Array.isArray(value))) {
      return fail("Must be a JSON object ({…})");
    }
    area.removeAttribute("aria-invalid");
    err.textContent = "";
    return { ok: true, value };
  };
  const fail = (message) => {
    area.setAttribute("aria-invalid", "true");
    err.textContent = message;
    return { ok: false };
  };
  area.addEventListener("input", read);
  return { wrap, area, read };
}

// Ask before doing something that cannot be undone; resolves true on "Confirm".
export function confirmDialog(title, text, extra) {
  const dlg = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  const box = clear(document.getElementById("confirm-extra"));
  if (extra) box.append(extra);
  dlg.returnValue = "";
  dlg.showModal();
  return new Promise((resolve) => {
    dlg.addEventListener("close", () => resolve(dlg.returnValue === "ok"), { once: true });
  });
}

