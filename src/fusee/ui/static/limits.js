// Limits: each limit's rate, concurrency, holders and waiters per fairness key.
import { get, poll } from "./api.js";
import { h, clear } from "./dom.js";

export async function limitsPage(ctx) {
  const tbody = h("tbody");
  ctx.root.append(
    h("h1", { text: "Limits" }),
    h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { "aria-label": "Limits", id: "limits" },
        h("thead", {}, h("tr", {}, ["Limit", "Rate (per s)", "Burst", "Concurrent", "Holders", "Waiters by fairness key"].map((t) => h("th", { scope: "col", text: t })))),
        tbody,
      ),
    ),
  );
  async function load() {
    const { limits } = await get("/v1/limits", { signal: ctx.signal });
    clear(tbody);
    for (const l of limits) {
      const waiters = Object.entries(l.waiters || {});
      tbody.append(
        h(
          "tr",
          { "data-limit": l.name },
          h("th", { scope: "row", text: l.name }),
          h("td", { class: "num", text: l.per_second ?? "–" }),
          h("td", { class: "num", text: l.burst ?? "–" }),
          h("td", { class: "num", text: l.concurrent ?? "–" }),
          h("td", { class: "num", text: l.holders }),
          h("td", {}, waiters.length ? h("ul", { class: "waiters" }, waiters.map(([k, n]) => h("li", {}, h("code", { text: k || "(none)" }), `: ${n}`))) : "none"),
        ),
      );
    }
    if (!limits.length) tbody.append(h("tr", {}, h("td", { colspan: 6, class: "empty", text: "No limit is set (fusee limits set)." })));
  }
  await load();
  poll(ctx, load, 2000);
}
