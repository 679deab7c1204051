// The UI's only backend: the HTTP API under /v1, with the session's cookie.

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

let onUnauthorized = () => {};
export function setUnauthorizedHandler(fn) {
  onUnauthorized = fn;
}

export async function api(method, path, body, { signal } = {}) {
  const headers = { Accept: "application/json", "X-Fusee-UI": "1" };
  const init = { method, headers, credentials: "same-origin", signal };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  const text = await res.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = text;
    }
  }
  if (!res.ok) {
    const e = (data && data.error) || {};
    if (res.status === 401) onUnauthorized();
    throw new ApiError(res.status, e.code || "error", e.message || `${res.status} ${res.statusText}`);
  }
  return { status: res.status, data };
}

export const get = (path, opts) => api("GET", path, undefined, opts).then((r) => r.data);
export const post = (path, body, opts) => api("POST", path, body, opts).then((r) => r.data);

export function seg(id) {
  return encodeURIComponent(id);
}

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") q.set(k, v);
  const s = q.toString();
  return s ? `?${s}` : "";
}

// Call fn every ms until the page goes (ctx.signal); one call at a time.
export function poll(ctx, fn, ms) {
  const tick = async () => {
    if (ctx.signal.aborted) return;
    try {
      await fn();
    } catch (e) {
      if (e.name === "AbortError") return;
    }
    if (!ctx.signal.aborted) setTimeout(tick, ms);
  };
  setTimeout(tick, ms);
}
