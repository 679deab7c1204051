// Objects: a type's keys, a key's state (pretty JSON) with edit, its queue with cancel.
import { api, get, poll, post, seg } from "./api.js";
import { h, clear, when, pretty, jsonField, confirmDialog } from "./dom.js";

const KNOWN = "fusee.ui.object_types"; // types looked at before, offered again

function remembered() {
  try {
    return JSON.parse(localStorage.getItem(KNOWN) || "[]");
  } catch {
    return [];
  }
}

export async function objectsPage(ctx, type) {
  const input = h("input", { id: "object-type", value: type || "", autocomplete: "off", list: "object-types", required: true });
  const form = h(
    "form",
    { class: "filters", role: "search", "aria-label": "Choose an object type" },
    h("div", { class: "field inline" }, h("label", { for: "object-type", text: "Object type" }), input, h("datalist", { id: "object-types" }, remembered().map((t) => h("option", { value: t })))),
    h("button", { type: "submit", text: "Show keys" }),
  );
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (input.value.trim()) location.hash = `#/objects/${seg(input.value.trim())}`;
  });
  ctx.root.append(h("h1", { text: "Objects" }), form);
  if (!type) {
    const { types } = await get("/v1/objects", { signal: ctx.signal });
    ctx.root.append(
      h("h2", { text: "Types" }),
      types.length
        ? h("ul", { class: "types", "aria-label": "Object types" }, types.map((t) => h("li", {}, h("a", { href: `#/objects/${seg(t)}`, text: t }))))
        : h("p", { class: "note", text: "No object has state yet (fusee.object(\"<type>\", ...))." }),
    );
    return;
  }
  localStorage.setItem(KNOWN, JSON.stringify([type, ...remembered().filter((t) => t !== type)].slice(0, 20)));
  const page = await get(`/v1/objects/${seg(type)}`, { signal: ctx.signal });
  const tbody = h("tbody");
  for (const k of page.keys) {
    const preview = JSON.stringify(k.state);
    tbody.append(
      h("tr", {}, h("td", {}, h("a", { href: `#/objects/${seg(type)}/${seg(k.key)}`, text: k.key })), h("td", {}, h("code", { class: "preview", text: preview.length > 120 ? `${preview.slice(0, 117)}…` : preview }))),
    );
  }
  if (!page.keys.length) tbody.append(h("tr", {}, h("td", { colspan: 2, class: "empty", text: "No key of this type has state." })));
  ctx.root.append(
    h("h2", {}, "Keys of ", h("code", { text: type })),
    h("div", { class: "table-wrap" }, h("table", { "aria-label": `Keys of ${type}` }, h("thead", {}, h("tr", {}, h("th", { scope: "col", text: "Key" }), h("th", { scope: "col", text: "State" }))), tbody)),
  );
}

export async function objectPage(ctx, type, key) {
  const base = `/v1/objects/${seg(type)}/${seg(key)}`;
  const stateBox = h("pre", { id: "object-state", tabindex: 0, "aria-label": "State" });
  const queue = h("div", { id: "object-queue" });
  const note = h("p", { class: "note", role: "status", id: "object-note" });
  const editor = jsonField("New state (a JSON object)", "state-editor", "{}", { object: true });
  const editBtn = h("button", { type: "button", id: "edit-state", text: "Edit state" });
  const saveBtn = h("button", { type: "submit", id: "save-state", class: "primary", text: "Apply" });
  const backBtn = h("button", { type: "button", id: "cancel-edit", text: "Discard" });
  const editForm = h("form", { class: "editor", hidden: true, "aria-label": "Edit the state" }, editor.wrap, h("div", { class: "buttons" }, saveBtn, backBtn));
  ctx.root.append(
    h("p", {}, h("a", { href: `#/objects/${seg(type)}`, text: `← ${type}` })),
    h("h1", {}, h("code", { text: type }), " / ", h("code", { text: key })),
    h("section", { class: "card", "aria-labelledby": "state-title" }, h("h2", { id: "state-title", text: "State" }), stateBox, editBtn, editForm, note),
    h("section", { class: "card", "aria-labelledby": "queue-title" }, h("h2", { id: "queue-title", text: "Invocations" }), queue),
  );
  let info = null;
  let editing = false;

  function drawQueue() {
    const items = [...(info.running ? [{ ...info.running, running: true }] : []), ...info.waiting];
    clear(queue);
    if (!items.length) queue.append(h("p", { class: "note", text: "Nothing running or waiting." }));
    const ul = h("ul", { class: "queue" });
    for (const inv of items) {
      const btn = h("button", { type: "button", class: "small danger", text: "Cancel", "aria-label": `Cancel invocation ${inv.seq} (${inv.handler})`, disabled: inv.cancelling });
      btn.addEventListener("click", async () => {
        if (!(await confirmDialog(`Cancel invocation ${inv.seq}?`, `${inv.handler} on ${type}/${key}`))) return;
        try {
          await post(`${base}/cancel`, { seq: inv.seq, reason: "cancelled from the web UI" });
          note.textContent = `Invocation ${inv.seq} cancelled.`;
        } catch (e) {
          note.textContent = e.message;
        }
        await load();
      });
      ul.append(h("li", {}, h("code", { text: `#${inv.seq}` }), ` ${inv.handler} `, inv.running ? `running since ${when(inv.running_since)}` : `queued ${when(inv.queued_at)}`, inv.cancelling ? " (cancelling)" : "", " ", btn));
    }
    queue.append(ul);
    if (info.last) queue.append(h("details", { class: "value" }, h("summary", { text: "Last invocation" }), h("pre", { text: pretty(info.last) })));
    if (info.unserved) queue.append(h("p", { class: "error", text: `Not served: ${info.unserved}` }));
    if (info.crashed) queue.append(h("p", { class: "error", text: `Crashed: ${pretty(info.crashed)}` }));
  }

  async function load() {
    info = await get(base, { signal: ctx.signal });
    stateBox.textContent = pretty(info.state);
    drawQueue();
  }
  editBtn.addEventListener("click", () => {
    editing = true;
    editor.area.value = pretty(info.state);
    editForm.hidden = false;
    editBtn.hidden = true;
    editor.area.focus();
  });
  backBtn.addEventListener("click", () => {
    editing = false;
    editForm.hidden = true;
    editBtn.hidden = false;
    editBtn.focus();
  });
  editForm.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const parsed = editor.read();
    if (!parsed.ok) {
      editor.area.focus();
      return;
    }
    saveBtn.disabled = true;
    try {
      // one exclusive invocation, in its turn, as `fusee objects edit` applies it
      const { data } = await api("PATCH", `${base}/state`, { state: parsed.value });
      stateBox.textContent = pretty(data);
      note.textContent = "State applied.";
      editing = false;
      editForm.hidden = true;
      editBtn.hidden = false;
      await load();
    } catch (e) {
      note.textContent = e.message;
    } finally {
      saveBtn.disabled = false;
    }
  });
  await load();
  poll(ctx, async () => {
    if (!editing) await load();
  }, 2000);
}
