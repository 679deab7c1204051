// The runs page: filters, paging, live status, paused runs' reasons, bulk resume/cancel.
import { get, poll, post, seg, query } from "./api.js";
import { h, clear, ago, statusBadge, confirmDialog } from "./dom.js";

const STATUSES = ["", "pending", "running", "waiting", "paused", "completed", "failed", "cancelled"];
const PAGE = 50;
const POLL_MS = 1500;

export async function runsPage(ctx) {
  const p = ctx.params;
  const filters = {
    workflow: p.get("workflow") || "",
    status: p.get("status") || "",
    id_prefix: p.get("id_prefix") || "",
    since: p.get("since") || "",
  };
  const cursors = [null]; // the cursor of each page seen, for "Previous"
  let at = 0;
  const selected = new Set();

  const field = (id, label, input) => h("div", { class: "field inline" }, h("label", { for: id, text: label }), input);
  const wf = h("input", { id: "f-workflow", name: "workflow", value: filters.workflow, autocomplete: "off" });
  const idp = h("input", { id: "f-id", name: "id_prefix", value: filters.id_prefix, autocomplete: "off" });
  const st = h("select", { id: "f-status", name: "status" }, STATUSES.map((s) => h("option", { value: s, text: s || "any", selected: s === filters.status })));
  const since = h(
    "select",
    { id: "f-since", name: "since" },
    [["", "any time"], ["1h", "last hour"], ["24h", "last day"], ["168h", "last week"]].map(([v, t]) => h("option", { value: v, text: t, selected: v === filters.since })),
  );
  const form = h(
    "form",
    { class: "filters", role: "search", "aria-label": "Filter runs" },
    field("f-workflow", "Workflow", wf),
    field("f-status", "Status", st),
    field("f-id", "ID starts with", idp),
    field("f-since", "Started", since),
    h("button", { type: "submit", text: "Filter" }),
  );
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    location.hash = `#/runs${query({ workflow: wf.value.trim(), status: st.value, id_prefix: idp.value.trim(), since: since.value })}`;
  });

  const note = h("p", { class: "note", role: "status", id: "runs-note" });
  const resumeBtn = h("button", { type: "button", id: "bulk-resume", disabled: true, text: "Resume selected" });
  const cancelBtn = h("button", { type: "button", id: "bulk-cancel", class: "danger", disabled: true, text: "Cancel selected" });
  // Every run the filters match (the admin routes /v1/runs/bulk/...), not only this page's.
  const session = ctx.session ? ctx.session() : null;
  const admin = !session || !session.auth || session.scope === "admin";
  const resumeAll = h("button", { type: "button", id: "bulk-resume-all", hidden: !admin, text: "Resume all matching…" });
  const cancelAll = h("button", { type: "button", id: "bulk-cancel-all", class: "danger", hidden: !admin, text: "Cancel all matching…" });
  resumeAll.disabled = Boolean(filters.status && filters.status !== "paused");
  cancelAll.disabled = ["completed", "failed", "cancelled"].includes(filters.status);
  const bulkBar = h("div", { class: "bulk", role: "group", "aria-label": "Bulk actions" }, resumeBtn, cancelBtn, resumeAll, cancelAll);
  const all = h("input", { type: "checkbox", id: "select-all", "aria-label": "Select every run on this page" });
  const tbody = h("tbody");
  const table = h(
    "div",
    { class: "table-wrap" },
    h(
      "table",
      { class: "runs", "aria-label": "Runs" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, all), ["Run", "Workflow", "Status", "Steps", "Started", "Updated", "Reason"].map((t) => h("th", { scope: "col", text: t })))),
      tbody,
    ),
  );
  const prev = h("button", { type: "button", id: "prev", text: "← Previous" });
  const next = h("button", { type: "button", id: "next", text: "Next →" });
  const pager = h("nav", { class: "pager", "aria-label": "Pages" }, prev, h("span", { id: "page-no" }), next);
  ctx.root.append(h("h1", { text: "Runs" }), form, bulkBar, note, table, pager);

  const rows = new Map(); // run ID -> its row's cells, updated in place by the poll
  let nextCursor = null;
  let runsShown = [];

  function syncButtons() {
    const chosen = runsShown.filter((r) => selected.has(r.run_id));
    resumeBtn.disabled = !chosen.some((r) => r.status === "paused");
    cancelBtn.disabled = !chosen.some((r) => !["completed", "failed", "cancelled"].includes(r.status));
    all.checked = runsShown.length > 0 && chosen.length === runsShown.length;
  }

  function row(run) {
    const box = h("input", { type: "checkbox", "aria-label": `Select run ${run.run_id}`, "data-run": run.run_id });
    box.checked = selected.has(run.run_id);
    box.addEventListener("change", () => {
      if (box.checked) selected.add(run.run_id);
      else selected.delete(run.run_id);
      syncButtons();
    });
    const cells = {
      status: h("td", { class: "status" }),
      steps: h("td", { class: "num", "data-label": "steps" }),
      updated: h("td", { "data-label": "updated" }),
      reason: h("td", { class: "reason" }),
    };
    const tr = h(
      "tr",
      { "data-run": run.run_id },
      h("td", {}, box),
      h("td", {}, h("a", { href: `#/runs/${seg(run.run_id)}`, text: run.run_id })),
      h("td", { text: run.workflow, "data-label": "workflow" }),
      cells.status,
      cells.steps,
      h("td", { text: ago(run.created_at), title: new Date(run.created_at * 1000).toISOString(), "data-label": "started" }),
      cells.updated,
      cells.reason,
    );
    return { tr, cells, status: null, box };
  }

  function fill(r, run) {
    if (r.status !== run.status) {
      clear(r.cells.status).append(statusBadge(run.status));
      r.status = run.status;
      r.tr.dataset.status = run.status;
    }
    r.cells.steps.textContent = run.steps ?? 0;
    r.cells.updated.textContent = ago(run.updated_at);
    const why = run.reason || (run.message ? `${run.error_type || "error"}: ${run.message}` : "");
    r.cells.reason.textContent = run.status === "paused" && run.step ? `${why} (step ${run.step})` : why;
  }

  async function load() {
    // The API's pages read one part of the index each (not ended, paused, then each
    // ended status) and may hold few runs, even none: a page of the UI follows them
    // until it has PAGE runs or the index is read.
    const page = { runs: [], next_cursor: cursors[at] };
    for (let reads = 0; reads < 16; reads++) {
      const part = await get(`/v1/runs${query({ ...filters, limit: PAGE - page.runs.length, cursor: page.next_cursor })}`, { signal: ctx.signal });
      page.runs.push(...part.runs);
      page.next_cursor = part.next_cursor;
      if (!part.next_cursor || page.runs.length >= PAGE) break;
    }
    nextCursor = page.next_cursor;
    runsShown = page.runs;
    const seen = new Set();
    const frag = document.createDocumentFragment();
    for (const run of page.runs) {
      seen.add(run.run_id);
      let r = rows.get(run.run_id);
      if (!r) rows.set(run.run_id, (r = row(run)));
      fill(r, run);
      frag.append(r.tr);
    }
    for (const id of [...rows.keys()]) if (!seen.has(id)) rows.delete(id);
    clear(tbody).append(frag);
    if (!page.runs.length) tbody.append(h("tr", {}, h("td", { colspan: 8, class: "empty", text: "No runs match." })));
    prev.disabled = at === 0;
    next.disabled = !nextCursor;
    document.getElementById("page-no").textContent = `Page ${at + 1}`;
    syncButtons();
  }

  prev.addEventListener("click", async () => {
    if (at > 0) at -= 1;
    await load();
  });
  next.addEventListener("click", async () => {
    if (!nextCursor) return;
    cursors[at + 1] = nextCursor;
    at += 1;
    await load();
  });
  all.addEventListener("change", () => {
    for (const r of runsShown) {
      if (all.checked) selected.add(r.run_id);
      else selected.delete(r.run_id);
      const entry = rows.get(r.run_id);
      if (entry) entry.box.checked = all.checked;
    }
    syncButtons();
  });

  async function bulk(action) {
    const chosen = runsShown.filter((r) => selected.has(r.run_id));
    const targets = action === "resume" ? chosen.filter((r) => r.status === "paused") : chosen.filter((r) => !["completed", "failed", "cancelled"].includes(r.status));
    const list = h("ul", { class: "targets" }, targets.slice(0, 20).map((r) => h("li", { text: r.run_id })));
    if (targets.length > 20) list.append(h("li", { text: `… and ${targets.length - 20} more` }));
    const ok = await confirmDialog(`${action === "resume" ? "Resume" : "Cancel"} ${targets.length} run${targets.length === 1 ? "" : "s"}?`, action === "cancel" ? "Cancelled runs stop at their next step and run their compensations." : "Paused runs go on from their journal.", list);
    if (!ok) return;
    const body = action === "cancel" ? { reason: "cancelled from the web UI" } : {};
    const results = await Promise.allSettled(targets.map((r) => post(`/v1/runs/${seg(r.run_id)}/${action}`, body)));
    const failed = results.filter((r) => r.status === "rejected");
    note.textContent = `${action === "resume" ? "Resumed" : "Cancelled"} ${targets.length - failed.length} of ${targets.length}${failed.length ? `: ${failed[0].reason.message}` : ""}`;
    selected.clear();
    await load();
  }
  async function bulkAll(action) {
    const body = {};
    for (const k of ["workflow", "status", "id_prefix", "since"]) if (filters[k]) body[k] = filters[k];
    if (action === "cancel") body.reason = "cancelled in bulk from the web UI";
    note.textContent = "";
    try {
      const dry = await post(`/v1/runs/bulk/${action}`, { ...body, dry_run: true });
      const shown = Object.entries(body).filter(([k]) => k !== "reason").map(([k, v]) => `${k}=${v}`).join(", ") || "no filter: every run";
      const verb = action === "resume" ? "Resume" : "Cancel";
      const ok = await confirmDialog(`${verb} ${dry.done} run${dry.done === 1 ? "" : "s"}?`, `Every ${action === "resume" ? "paused run" : "run not ended"} matching ${shown}, on every page.`);
      if (!ok) return;
      const done = await post(`/v1/runs/bulk/${action}`, body);
      const failed = Object.keys(done.failed || {}).length;
      note.textContent = `${verb === "Resume" ? "Resumed" : "Cancelled"} ${done.done} (skipped ${done.skipped}${failed ? `, failed ${failed}` : ""}).`;
    } catch (e) {
      note.textContent = e.message;
    }
    await load();
  }
  resumeAll.addEventListener("click", () => bulkAll("resume"));
  cancelAll.addEventListener("click", () => bulkAll("cancel"));
  resumeBtn.addEventListener("click", () => bulk("resume"));
  cancelBtn.addEventListener("click", () => bulk("cancel"));

  await load();
  poll(ctx, load, POLL_MS);
}
