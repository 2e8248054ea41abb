// The dashboard's "Training sessions" panel: the Tinker API's calls per op (settled, and their
// queue and compute time) and the models a worker holds, from /v1/tinker/overview. Uses
// dashboard.js's helpers (api, h, badge, num, clock), loaded before it; everything from the API
// goes in with textContent (through h), never innerHTML.
"use strict";

// "0.21 s · p50 ≤ 0.25 · p90 ≤ 0.5": the mean is exact, the quantiles are the upper bound of
// the histogram bucket they fall in (the gateway keeps no more than its buckets).
function timing(t) {
  if (!t) return "";
  const le = (v) => (v === null ? "> max" : `≤ ${num(v, 3)}`);
  return `${num(t.mean_s, 3)} s · p50 ${le(t.p50_le_s)} · p90 ${le(t.p90_le_s)}`;
}

function renderTinkerCalls(body) {
  // The columns are the states and parts the gateway names, in its order.
  const head = h("tr", {}, h("th", {}, "op"), ...body.states.map((s) => h("th", {}, s)),
    ...body.parts.map((p) => h("th", { title: `mean and quantile buckets of the ${p} time` }, p)));
  $("tinker-calls").tHead.replaceChildren(head);
  $("tinker-calls").tBodies[0].replaceChildren(...body.ops.map((o) => {
    const counts = Object.fromEntries(body.states.map((s) => [s, String(o.calls[s] ?? 0)]));
    return h("tr", { dataset: { op: o.op, ...counts } },
      h("td", { class: "mono" }, o.op),
      ...body.states.map((s) => h("td", {}, counts[s])),
      ...body.parts.map((p) => h("td", { dataset: { part: p } }, timing(o.timing[p]))));
  }));
  $("tinker-note").textContent = body.ops.length
    ? `Calls this gateway settled since ${clock(body.since)}.`
    : `No Tinker calls since this gateway started (${clock(body.since)}).`;
}

function renderTinkerModels(models) {
  $("tinker-models").tBodies[0].replaceChildren(...models.map((m) => {
    const save = m.last_save ? `${m.last_save.split("/").pop()} (step ${m.last_save_step})` : "";
    return h("tr", { dataset: { modelId: m.model_id } },
      h("td", { class: "mono", title: m.restored || "" }, m.model_id),
      h("td", {}, m.tenant),
      h("td", { class: "mono" }, m.base_model),
      h("td", {}, String(m.rank)),
      h("td", {}, badge(m.state)),
      h("td", { class: "mono" }, m.worker_id),
      h("td", { title: m.last_save || "" }, save),
      h("td", {}, clock(m.created_at)));
  }));
}

async function loadTinker() {
  const body = await api("v1/tinker/overview");
  renderTinkerCalls(body);
  renderTinkerModels(body.models);
  $("tinker-count").textContent = `(${body.sessions} open, ${body.models.length} models)`;
}
