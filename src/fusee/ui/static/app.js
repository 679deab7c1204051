// The web UI: a hash router over its pages, the login and the confirmation dialog.
import { api, get, setUnauthorizedHandler } from "./api.js";
import { h, clear } from "./dom.js";
import { runsPage } from "./runs.js";
import { runPage } from "./run.js";
import { objectsPage, objectPage } from "./objects.js";
import { limitsPage } from "./limits.js";

const main = document.getElementById("main");
let session = null;
let routed = false; // a page was shown before this one
let current = null; // the page shown: its AbortController stops its polls and streams

export function navigate(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

function parse() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, q] = raw.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { parts, params: new URLSearchParams(q || "") };
}

function loginPage(ctx) {
  const input = h("input", { id: "token", type: "password", autocomplete: "current-password", required: true });
  const err = h("p", { class: "field-error", role: "alert", id: "login-err" });
  const form = h(
    "form",
    { class: "login card", "aria-labelledby": "login-title" },
    h("h1", { id: "login-title", text: "Log in to fusee" }),
    h("p", { text: "Paste an API token (fusee tokens create --scope write)." }),
    h("div", { class: "field" }, h("label", { for: "token", text: "API token" }), input, err),
    h("button", { type: "submit", class: "primary", text: "Log in" }),
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    err.textContent = "";
    try {
      const { data } = await api("POST", "/ui/login", { token: input.value });
      session = data;
      showWho();
      const after = sessionStorage.getItem("fusee.after");
      sessionStorage.removeItem("fusee.after");
      navigate(after && !after.startsWith("#/login") ? after : "#/runs");
    } catch (e) {
      err.textContent = e.message;
      input.setAttribute("aria-invalid", "true");
      input.focus();
    }
  });
  ctx.root.append(form);
  input.focus();
}

function showWho() {
  const who = document.getElementById("who");
  const out = document.getElementById("logout");
  if (session && session.auth && session.logged_in) {
    who.textContent = `${session.token_id} (${session.scope})`;
    out.hidden = false;
  } else {
    who.textContent = session && !session.auth ? "auth off" : "";
    out.hidden = true;
  }
}

async function route() {
  if (current) current.abort();
  current = new AbortController();
  const ctx = { root: clear(main), signal: current.signal };
  let parsed;
  try {
    parsed = parse();
  } catch (e) {
    parsed = { parts: [], params: new URLSearchParams() }; // a malformed hash: the runs page
  }
  const { parts, params } = parsed;
  ctx.params = params;
  ctx.session = () => session;
  main.setAttribute("aria-busy", "true");
  for (const a of document.querySelectorAll("[data-nav]")) {
    if (a.dataset.nav === (parts[0] || "runs")) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  try {
    if (!session || (session.auth && !session.logged_in)) session = await get("/ui/session");
    showWho();
    if (session.auth && !session.logged_in) {
      if (parts[0] !== "login") sessionStorage.setItem("fusee.after", location.hash);
      loginPage(ctx);
    } else if (parts[0] === "runs" && parts[1]) await runPage(ctx, parts[1]);
    else if (parts[0] === "objects" && parts[2]) await objectPage(ctx, parts[1], parts[2]);
    else if (parts[0] === "objects") await objectsPage(ctx, parts[1]);
    else if (parts[0] === "limits") await limitsPage(ctx);
    else await runsPage(ctx);
  } catch (e) {
    if (e.name === "AbortError") return;
    ctx.root.append(h("p", { class: "error", role: "alert", text: `Error: ${e.message}` }));
  } finally {
    main.setAttribute("aria-busy", "false");
  }
  // after a navigation inside the app, focus goes to the new page (not on the first
  // load: the skip link comes first there), unless the page put it somewhere itself
  if (routed && (document.activeElement === document.body || !document.activeElement)) {
    main.focus({ preventScroll: true });
  }
  routed = true;
}

setUnauthorizedHandler(() => {
  if (session && session.auth && session.logged_in) {
    session = { ...session, logged_in: false };
    navigate("#/login");
  }
});

document.getElementById("logout").addEventListener("click", async () => {
  const { data } = await api("POST", "/ui/logout");
  session = data;
  navigate("#/login");
});

// the skip link moves focus to the page's content, without going through the router
// (its #main is not a page: the hash stays the page's)
document.getElementById("skip").addEventListener("click", (e) => {
  e.preventDefault();
  main.focus();
});

window.addEventListener("hashchange", () => {
  if (location.hash.startsWith("#/") || location.hash === "") route();
});
route();
