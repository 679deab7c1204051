// A run's page: header, journal timeline, live token streams, and its actions.
import { api, get, post, poll, seg, query } from "./api.js";
import { h, append, clear, when, span, pretty, statusBadge, jsonField, confirmDialog } from "./dom.js";
import { timeline } from "./timeline.js";

const ENDED = ["completed", "failed", "cancelled"];
const POLL_MS = 1000;

async function readJournal(runId, after, signal) {
  const out = [];
  for (;;) {
    const page = await get(`/v1/runs/${seg(runId)}/journal${query({ after, limit: 1000 })}`, { signal });
    out.push(...page.records);
    if (page.next_after === null || page.next_after === undefined) break;
    after = page.next_after;
  }
  return out;
}

export async function runPage(ctx, runId) {
  const t0 = performance.now();
  const base = `/v1/runs/${seg(runId)}`;
  const listStreams = () =>
    get(`${base}/streams`, { signal: ctx.signal }).then(
      (r) => r.streams,
      (e) => {
        if (e.name === "AbortError") throw e;
        return [];
      },
    );
  const [info, records, firstStreams] = await Promise.all([get(base, { signal: ctx.signal }), readJournal(runId, 0, ctx.signal), listStreams()]);
  const fetched = performance.now() - t0;
  let lastSeq = records.length ? records[records.length - 1].seq : 0;

  const head = h("section", { class: "card run-head", "aria-labelledby": "run-title" });
  const actions = h("section", { class: "card actions-card", "aria-labelledby": "actions-title" });
  const streams = h("section", { class: "card", "aria-labelledby": "streams-title" });
  const tl = timeline(runId);
  const journalBox = h("section", { class: "card", "aria-labelledby": "journal-title" }, h("h2", { id: "journal-title", text: "Journal" }), tl.el);
  ctx.root.append(h("p", {}, h("a", { href: "#/runs", text: "← Runs" })), head, streams, actions, journalBox);

  let state = { info, outcome: null };
  async function outcome() {
    if (!ENDED.includes(state.info.status)) return null;
    const { data } = await api("GET", `${base}/result${query({ timeout: 0 })}`, undefined, { signal: ctx.signal });
    return data;
  }
  state.outcome = await outcome();

  function drawHead() {
    const i = state.info;
    const started = tl.started;
    const out = state.outcome;
    const rows = [
      ["Workflow", i.workflow],
      ["Status", statusBadge(i.status)],
      ["Started", when(i.created_at)],
      ["Updated", when(i.updated_at)],
      ["Duration", span((ENDED.includes(i.status) ? i.updated_at : Date.now() / 1000) - i.created_at)],
      ["Steps", String(i.steps ?? 0)],
    ];
    if (i.generation > 1) rows.push(["Generation", String(i.generation)]);
    if (i.reason) rows.push([i.status === "paused" ? "Paused because" : "Reason", i.reason]);
    if (i.step) rows.push(["Step", i.step]);
    if (i.error_type || i.message) rows.push(["Error", `${i.error_type || ""}: ${i.message || ""}`]);
    if (started && started.parent) rows.push(["Parent", h("a", { href: `#/runs/${seg(started.parent)}`, text: started.parent })]);
    append(clear(head), [
      h("h1", { id: "run-title" }, "Run ", h("code", { text: runId })),
      h("dl", { class: "facts", "data-status": i.status }, rows.map(([k, v]) => [h("dt", { text: k }), h("dd", {}, v)])),
      started ? h("details", { class: "value", open: true }, h("summary", { text: "Input" }), h("pre", { id: "run-input", text: pretty(started.input) })) : null,
      out && out.status === "completed" ? h("details", { class: "value", open: true }, h("summary", { text: "Result" }), h("pre", { id: "run-result", text: pretty(out.result) })) : null,
      out && out.error ? h("details", { class: "value", open: true }, h("summary", { text: "Error" }), h("pre", { id: "run-error", class: "error", text: `${out.error.type}: ${out.error.message}` })) : null,
    ]);
  }

  // ---- actions: cancel, resume, signal, approve
  const note = h("p", { class: "note", role: "status", id: "action-note" });
  const cancelBtn = h("button", { type: "button", id: "cancel-run", class: "danger", text: "Cancel run" });
  const resumeBtn = h("button", { type: "button", id: "resume-run", text: "Resume run" });
  const sigName = h("input", { id: "signal-name", autocomplete: "off", required: true });
  const sigValue = jsonField("Payload (JSON)", "signal-payload", "null");
  const sigForm = h(
    "form",
    { class: "signal", "aria-label": "Send a signal" },
    h("div", { class: "field" }, h("label", { for: "signal-name", text: "Signal name" }), sigName),
    sigValue.wrap,
    h("button", { type: "submit", id: "send-signal", text: "Send signal" }),
  );
  const approvals = h("div", { id: "approvals" });
  actions.append(h("h2", { id: "actions-title", text: "Actions" }), h("div", { class: "buttons" }, cancelBtn, resumeBtn), approvals, sigForm, note);

  const act = async (what, fn) => {
    note.textContent = "";
    try {
      await fn();
      note.textContent = what;
      await refresh();
    } catch (e) {
      note.textContent = `${e.message}`;
      note.classList.add("error");
    }
  };
  cancelBtn.addEventListener("click", async () => {
    const reason = h("input", { id: "cancel-reason", value: "cancelled from the web UI" });
    const extra = h("div", { class: "field" }, h("label", { for: "cancel-reason", text: "Reason" }), reason);
    if (!(await confirmDialog(`Cancel run ${runId}?`, "It stops at its next step and runs its compensations.", extra))) return;
    await act("Cancel sent.", () => post(`${base}/cancel`, { reason: reason.value || "cancelled" }));
  });
  resumeBtn.addEventListener("click", async () => {
    if (!(await confirmDialog(`Resume run ${runId}?`, "It goes on from its journal; a step that paused gets a fresh retry budget."))) return;
    await act("Resume sent.", () => post(`${base}/resume`, {}));
  });
  sigForm.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const parsed = sigValue.read();
    if (!parsed.ok) {
      sigValue.area.focus();
      return;
    }
    const name = sigName.value.trim();
    if (!name) {
      sigName.setAttribute("aria-invalid", "true");
      sigName.focus();
      return;
    }
    await act(`Signal ${name} sent.`, () => post(`${base}/signals/${seg(name)}`, parsed.value));
  });

  function drawApprovals() {
    clear(approvals);
    for (const w of tl.pendingCompletions()) {
      const reason = h("input", { id: `reject-reason-${w.pos}`, autocomplete: "off" });
      const approve = h("button", { type: "button", class: "primary", "data-approve": w.pos, text: `Approve ${w.name}` });
      const reject = h("button", { type: "button", class: "danger", "data-reject": w.pos, text: "Reject" });
      approve.addEventListener("click", () => act(`${w.name}: approved.`, () => post(`${base}/waits/${w.pos}/complete`, true)));
      reject.addEventListener("click", () =>
        act(`${w.name}: rejected.`, () => post(`${base}/waits/${w.pos}/complete`, reason.value ? { approved: false, reason: reason.value } : false)),
      );
      approvals.append(
        h(
          "div",
          { class: "approval", role: "group", "aria-label": `Approval ${w.name}` },
          h("p", {}, "Waiting for approval: ", h("strong", { text: w.name }), w.until ? ` (until ${when(w.until)})` : ""),
          h("div", { class: "field inline" }, h("label", { for: `reject-reason-${w.pos}`, text: "Reason (if rejected)" }), reason),
          approve,
          reject,
        ),
      );
    }
  }

  function drawButtons() {
    const s = state.info.status;
    cancelBtn.disabled = ENDED.includes(s);
    resumeBtn.disabled = s !== "paused";
    sigForm.querySelector("button").disabled = ENDED.includes(s);
  }

  // ---- streams
  streams.append(h("h2", { id: "streams-title", text: "Token streams" }));
  const streamName = h("input", { id: "stream-name", autocomplete: "off", list: "stream-names" });
  const names = h("datalist", { id: "stream-names" });
  const streamForm = h(
    "form",
    { class: "stream-form", "aria-label": "Follow a token stream" },
    h("div", { class: "field inline" }, h("label", { for: "stream-name", text: "Stream (a model_call's step name)" }), streamName, names),
    h("button", { type: "submit", id: "follow-stream", text: "Follow" }),
  );
  const viewers = h("div", { class: "viewers" });
  const listed = h("div", { class: "buttons", id: "stream-list", role: "group", "aria-label": "The run's streams" });
  streams.append(listed, streamForm, viewers);
  const open = new Map();
  const offered = new Set(); // streams followed by themselves once (closing one keeps it closed)
  const followName = (name) => {
    if (!open.has(name)) open.set(name, follow(ctx, base, name, viewers, () => open.delete(name)));
  };
  // The run's streams, as buttons; while it runs, a stream whose step has not ended
  // (it is being written) is followed at once, three at most.
  async function drawStreams(given) {
    const list = given || (await listStreams());
    clear(listed);
    for (const s of list) {
      const b = h("button", { type: "button", class: "small", "data-follow": s.name, text: `Follow ${s.name} (${s.messages})` });
      b.addEventListener("click", () => followName(s.name));
      listed.append(b);
      if (!ENDED.includes(state.info.status) && !tl.completed(s.name) && !offered.has(s.name) && offered.size < 3) {
        offered.add(s.name);
        followName(s.name);
      }
    }
  }
  streamForm.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const name = streamName.value.trim();
    if (name) followName(name);
  });
  for (const name of ctx.params.getAll("stream")) {
    offered.add(name);
    followName(name);
  }

  function drawNames() {
    clear(names).append(tl.stepNames().map((n) => h("option", { value: n })));
  }

  tl.add(records);
  drawHead();
  drawButtons();
  drawApprovals();
  drawNames();
  await drawStreams(firstStreams);
  const ms = performance.now() - t0;
  head.dataset.renderMs = ms.toFixed(1);
  head.dataset.fetchMs = fetched.toFixed(1);

  // one refresh at a time (the poll's and an action's): each reads the journal from
  // the seq the one before it reached, so no record is drawn twice
  let refreshing = Promise.resolve();
  function refresh() {
    refreshing = refreshing.then(refreshOnce, refreshOnce);
    return refreshing;
  }

  async function refreshOnce() {
    const after = lastSeq;
    const [i, read] = await Promise.all([get(base, { signal: ctx.signal }), readJournal(runId, after, ctx.signal)]);
    const more = read.filter((r) => r.seq > after);
    if (more.length) {
      lastSeq = more[more.length - 1].seq;
      tl.add(more);
      drawApprovals();
      drawNames();
    }
    const changed = i.status !== state.info.status || i.updated_at !== state.info.updated_at;
    state.info = i;
    if (!ENDED.includes(i.status) || changed) await drawStreams();
    if (changed) {
      state.outcome = await outcome();
      drawHead();
      drawButtons();
    }
  }
  poll(ctx, refresh, POLL_MS);
}

// One stream's live view: an EventSource on the API's SSE route. The browser reconnects
// by itself after a drop and sends Last-Event-ID (the last token's index), so the
// stream goes on from there with no gap and no duplicate.
function follow(ctx, base, name, into, closed) {
  const text = document.createTextNode("");
  const status = h("span", { class: "stream-status", role: "status", text: "connecting…" });
  const counter = h("span", { class: "num", text: "0 tokens" });
  const closeBtn = h("button", { type: "button", class: "small", text: "Close", "aria-label": `Close stream ${name}` });
  const pre = h("pre", { class: "stream", "data-stream": name, tabindex: 0, "aria-label": `Tokens of ${name}` }, text);
  const box = h("article", { class: "viewer", "data-stream": name }, h("header", {}, h("h3", { text: name }), status, counter, closeBtn), pre);
  into.append(box);
  box.scrollIntoView({ block: "nearest" });
  const es = new EventSource(`${base}/streams/${seg(name)}`);
  let count = 0;
  let pending = "";
  let scheduled = false;
  const flush = () => {
    scheduled = false;
    const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    text.appendData(pending);
    pending = "";
    counter.textContent = `${count} tokens`;
    if (stick) pre.scrollTop = pre.scrollHeight;
  };
  es.addEventListener("open", () => (status.textContent = "live"));
  es.addEventListener("token", (ev) => {
    const t = JSON.parse(ev.data);
    count += 1;
    pending += t.text;
    if (!scheduled) {
      scheduled = true;
      requestAnimationFrame(flush);
    }
  });
  es.addEventListener("restart", () => {
    // an attempt started over: its text so far stays, marked, and the new one follows
    flush();
    text.appendData("\n── attempt restarted ──\n");
  });
  es.addEventListener("end", () => {
    flush();
    status.textContent = "ended";
    box.dataset.ended = "true";
    es.close();
  });
  es.addEventListener("error", (ev) => {
    if (ev.data) {
      // the API's own error event: the error shape, then the response closes
      let msg = ev.data;
      try {
        msg = JSON.parse(ev.data).error.message;
      } catch {}
      status.textContent = `error: ${msg}`;
      es.close();
    } else if (es.readyState === EventSource.CONNECTING) {
      status.textContent = "reconnecting…";
    } else {
      status.textContent = "closed";
    }
  });
  const stop = () => es.close();
  closeBtn.addEventListener("click", () => {
    stop();
    box.remove();
    closed();
  });
  ctx.signal.addEventListener("abort", stop);
  return stop;
}
