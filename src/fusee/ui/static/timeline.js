// A run's journal as a timeline: one entry per call (step, wait, child), its attempts
// and errors folded in, and the run's own events (started, paused, resumed, ended).
import { seg } from "./api.js";
import { h, clear, when, span, pretty, statusBadge } from "./dom.js";

const WAIT_LABEL = { signal: "signal", sleep: "sleep", completion: "approval", child: "child run" };

// A value shown on demand: most of a long conversation's results are never opened, and
// pretty-printing 500 of them up front is most of a page's render time.
function lazyValue(label, value) {
  const pre = h("pre");
  const d = h("details", { class: "value" }, h("summary", { text: label }), pre);
  d.addEventListener("toggle", () => {
    if (d.open && !pre.firstChild) pre.textContent = pretty(value);
  });
  return d;
}

export function timeline(runId) {
  const list = h("ol", { class: "timeline", id: "timeline", "aria-label": "Journal timeline" });
  const el = h("div", {}, list);
  const calls = new Map(); // "<generation>:<pos>" -> entry
  const names = new Set();
  let generation = 1;
  const done = new Set(); // the steps completed: their streams are over
  const api = { el, started: null, add, pendingCompletions, stepNames: () => [...names], completed: (n) => done.has(n) };

  function entry(pos, kind) {
    const key = `${generation}:${pos}`;
    let e = calls.get(key);
    if (!e) {
      e = { pos, kind, attempts: [], li: h("li", { class: `item k-${kind}`, "data-pos": pos }) };
      calls.set(key, e);
      list.append(e.li);
    }
    return e;
  }

  function event(text, cls, extra) {
    list.append(h("li", { class: `item event ${cls}` }, h("div", { class: "line" }, text), extra));
  }

  function draw(e) {
    const li = clear(e.li);
    li.dataset.name = e.name;
    li.dataset.state = e.state;
    // a compensation is a step named "compensate:<name>" (fusee.actors.steps.COMPENSATE)
    const label = e.kind === "step" ? (e.name.startsWith("compensate:") ? "compensation" : "step") : WAIT_LABEL[e.wait] || e.wait;
    const name =
      e.wait === "child"
        ? h("a", { class: "name", href: `#/runs/${seg(e.name)}`, text: e.name })
        : h("strong", { class: "name", text: e.name });
    const meta = [];
    if (e.attempt > 1) meta.push(`attempt ${e.attempt}`);
    if (e.duration_ms) meta.push(span(e.duration_ms / 1000));
    if (e.until && e.state === "waiting") meta.push(`until ${when(e.until)}`);
    li.append(
      h("div", { class: "line" }, h("span", { class: "pos", text: `#${e.pos}` }), h("span", { class: "kind", text: label }), name, statusBadge(e.state), meta.length ? h("span", { class: "meta", text: meta.join(" · ") }) : null),
    );
    if (e.attempts.length) {
      li.append(
        h(
          "ol",
          { class: "attempts", "aria-label": `Failed attempts of ${e.name}` },
          e.attempts.map((a) => h("li", {}, `attempt ${a.attempt}: `, h("code", { text: `${a.error_type}: ${a.message}` }), a.retry_in !== undefined ? ` (retried in ${span(a.retry_in)})` : "")),
        ),
      );
    }
    if (e.error) li.append(h("p", { class: "error" }, h("code", { text: e.error })));
    if (e.state === "completed" && e.kind === "step") li.append(lazyValue("Result", e.result));
    if (e.kind === "wait" && e.state === "done" && e.value !== undefined && e.value !== null) li.append(lazyValue("Value", e.value));
  }

  function add(records) {
    const touched = new Set();
    for (const { seq, record: r } of records) {
      switch (r.kind) {
        case "run.started":
          if (!api.started) api.started = r;
          event(`started ${when(r.started_at)}`, "started");
          break;
        case "run.continued":
          generation = r.generation;
          event(`continued as new: generation ${r.generation}`, "continued", lazyValue("Input", r.input));
          break;
        case "step.retrying": {
          const e = entry(r.pos, "step");
          Object.assign(e, { name: r.name, state: "retrying", attempt: r.attempt + 1 });
          e.attempts.push(r);
          names.add(r.name);
          touched.add(e);
          break;
        }
        case "step.completed": {
          const e = entry(r.pos, "step");
          Object.assign(e, { name: r.name, state: "completed", attempt: r.attempt, duration_ms: r.duration_ms, result: r.result });
          names.add(r.name);
          done.add(r.name);
          touched.add(e);
          break;
        }
        case "step.failed": {
          const e = entry(r.pos, "step");
          Object.assign(e, { name: r.name, state: "failed", attempt: r.attempt, error: `${r.error_type}: ${r.message}` });
          touched.add(e);
          break;
        }
        case "wait.started": {
          const e = entry(r.pos, "wait");
          Object.assign(e, { name: r.name, wait: r.wait, state: "waiting", until: r.until });
          touched.add(e);
          break;
        }
        case "wait.done": {
          const e = entry(r.pos, "wait");
          Object.assign(e, { name: r.name, wait: r.wait, state: r.timed_out ? "timed out" : "done", value: r.value });
          touched.add(e);
          break;
        }
        case "call.cancelled": {
          const e = entry(r.pos, r.call === "step" ? "step" : "wait");
          Object.assign(e, { name: r.name, state: "cancelled", error: r.reason ? `cancelled: ${r.reason}` : "" });
          if (r.call !== "step") e.wait = e.wait || r.call;
          touched.add(e);
          break;
        }
        case "run.paused":
          event(h("span", {}, statusBadge("paused"), ` ${r.reason}`), "paused");
          break;
        case "run.resumed":
          event(h("span", {}, statusBadge("resumed"), r.force ? " (forced)" : ""), "resumed");
          break;
        case "run.completed":
          event(h("span", {}, statusBadge("completed")), "ended", lazyValue("Result", r.result));
          break;
        case "run.failed":
          event(h("span", {}, statusBadge("failed"), ` ${r.error_type}: ${r.message}`), "ended");
          break;
        case "run.cancelled":
          event(h("span", {}, statusBadge("cancelled"), ` ${r.reason}`), "ended");
          break;
        default:
          event(`${r.kind} (seq ${seq})`, "other");
      }
    }
    for (const e of touched) draw(e);
  }

  function pendingCompletions() {
    const out = [];
    for (const [key, e] of calls) {
      if (key.startsWith(`${generation}:`) && e.wait === "completion" && e.state === "waiting") out.push(e);
    }
    return out;
  }

  return api;
}
