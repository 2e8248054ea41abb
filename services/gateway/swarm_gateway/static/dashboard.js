// The Swarm dashboard: polls the public /v1 API once a second and follows the selected job's
// events over SSE. Plain browser JS on purpose (no framework, no build, no CDN). Everything
// from the API is put in the page with textContent, never innerHTML: job names and reasons
// are user input.
"use strict";

const POLL_MS = 1000;
const MAX_EVENTS = 400;
const KEY_STORE = "swarm.apiKey";
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
const GROUPS = [
  ["queue", ["queued", "assigned"]],
  ["running", ["running"]],
  ["finished", ["succeeded", "failed", "cancelled"]],
];

const state = {
  key: localStorage.getItem(KEY_STORE) || "",
  selected: null, // job id
  record: null, // the selected job's JobRecord
  metricsFinal: false, // the selected job ended and its metrics were read after that
  events: null, // AbortController of the running events stream
  eventCount: 0,
};

const $ = (id) => document.getElementById(id);

function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "dataset") Object.assign(node.dataset, v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : String(c ?? ""));
  return node;
}

function headers() {
  // Only sent when a key is set: with auth off the gateway ignores it anyway.
  return state.key ? { Authorization: `Bearer ${state.key}` } : {};
}

class ApiError extends Error {
  constructor(status, detail) {
    super(`${status}: ${detail}`);
    this.status = status;
  }
}

// Relative URLs ("v1/…"): the page is served at "/" and "/dashboard", and a reverse proxy may
// add a path prefix; resolving against the page keeps the calls on the same gateway.
async function api(path) {
  const resp = await fetch(path, { headers: headers(), cache: "no-store" });
  if (!resp.ok) {
    let detail = resp.statusText;
    try {
      const body = await resp.json();
      detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
    } catch (_) { /* not JSON: keep the status text */ }
    if (resp.status === 401) showAuthBanner(detail);
    throw new ApiError(resp.status, detail);
  }
  return resp.json();
}

function setStatus(kind, text) {
  const s = $("status");
  s.dataset.state = kind;
  s.textContent = text;
}

function showAuthBanner(detail) {
  const banner = $("auth-banner");
  banner.textContent = state.key
    ? `The gateway refused this API key (${detail}). Enter another one above.`
    : "This gateway needs an API key: enter it above (it is kept in this browser only).";
  banner.hidden = false;
}

function ago(iso) {
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  return s < 90 ? `${s.toFixed(0)} s ago` : `${(s / 60).toFixed(0)} min ago`;
}

function clock(iso) {
  return new Date(iso).toLocaleTimeString([], { hour12: false });
}

function num(v, digits = 4) {
  return typeof v === "number" && Number.isFinite(v) ? String(Number(v.toPrecision(digits))) : "";
}

function badge(text) {
  return h("span", { class: `badge ${text}` }, text);
}

function bar(used, total) {
  const pct = total > 0 ? Math.round((100 * used) / total) : 0;
  const fill = h("i");
  fill.style.width = `${pct}%`;
  return h("span", {}, h("span", { class: "bar", title: `${pct}%` }, fill), `${used} / ${total}`);
}

// --- workers ----------------------------------------------------------------------------

function renderWorkers(workers) {
  const body = $("workers").tBodies[0];
  body.replaceChildren(
    ...workers.map((w) => {
      const gpus = w.resources.gpus.length;
      // Short ids keep the table narrow; the full ones are in the tooltip.
      const running = w.running.map((r) => `${r.job_id.slice(0, 10)}… @${r.step}`).join(", ");
      const runningIds = w.running.map((r) => r.job_id).join("\n");
      return h("tr", { dataset: { workerId: w.worker_id } },
        h("td", { class: "mono" }, w.worker_id),
        h("td", {}, badge(w.state)),
        h("td", {}, bar(w.resources.cpus - w.free.cpus, w.resources.cpus)),
        h("td", {}, gpus ? bar(gpus - w.free.gpus.length, gpus) : "none"),
        h("td", { class: "mono", title: runningIds }, running || "idle"),
        h("td", {}, ago(w.last_heartbeat)));
    }));
  $("workers-count").textContent = `(${workers.length})`;
}

async function loadWorkers() {
  const note = $("workers-note");
  try {
    renderWorkers((await api("v1/workers")).data);
    note.hidden = true;
  } catch (err) {
    // Only admins may read the worker table: a tenant key still gets its jobs.
    note.textContent = err.status === 403
      ? "The worker table needs an admin API key."
      : `Workers unavailable: ${err.message}`;
    note.hidden = false;
    if (err.status !== 403) throw err;
  }
}

// --- jobs -------------------------------------------------------------------------------

function jobRow(job) {
  const m = job.metrics || {};
  const max = job.spec.training ? job.spec.training.max_steps : undefined;
  const step = m.step !== undefined ? `${m.step}${max ? ` / ${max}` : ""}` : "";
  const row = h("tr", { class: "job", dataset: { jobId: job.job_id, state: job.state } },
    h("td", { class: "mono" }, job.job_id),
    h("td", {}, job.spec.name),
    h("td", {}, badge(job.state)),
    h("td", {}, step),
    h("td", {}, num(m.loss)),
    h("td", { class: "mono" }, job.worker_id || ""),
    h("td", {}, clock(job.created_at)));
  if (job.job_id === state.selected) row.classList.add("selected");
  row.addEventListener("click", () => selectJob(job.job_id));
  return row;
}

function renderJobs(jobs) {
  const rows = [];
  for (const [label, states] of GROUPS) {
    const group = jobs.filter((j) => states.includes(j.state));
    rows.push(h("tr", { class: "group" }, h("td", { colspan: 7 }, `${label} (${group.length})`)));
    rows.push(...group.map(jobRow));
  }
  $("jobs").tBodies[0].replaceChildren(...rows);
  $("jobs-count").textContent = `(${jobs.length})`;
}

async function loadJobs() {
  renderJobs((await api("v1/jobs?limit=100")).data);
}

// --- the selected job ---------------------------------------------------------------------

function renderSummary(job) {
  const items = [
    ["state", job.state], ["attempt", job.attempt], ["worker", job.worker_id || "—"],
    ["base model", job.spec.base_model], ["dataset", job.spec.dataset],
  ];
  if (job.metrics && job.metrics.eval_loss !== undefined) items.push(["eval loss", num(job.metrics.eval_loss)]);
  if (job.adapter) items.push(["adapter", `${job.adapter.name} v${job.adapter.version}`]);
  if (job.reason) items.push(["reason", job.reason]);
  $("job-summary").replaceChildren(...items.map(([k, v]) => h("span", {}, `${k}: `, h("b", {}, v))));
  $("job-title").textContent = `${job.job_id} (${job.spec.name})`;
}

async function loadSelected() {
  const id = state.selected;
  if (!id) return;
  const job = await api(`v1/jobs/${encodeURIComponent(id)}`);
  if (id !== state.selected) return; // another job was picked meanwhile
  state.record = job;
  renderSummary(job);
  // A finished job's curves no longer change: read them once more after the end, then stop.
  if (state.metricsFinal) return;
  const ended = TERMINAL.has(job.state);
  const metrics = await api(`v1/jobs/${encodeURIComponent(id)}/metrics?max_points=500`);
  if (id !== state.selected) return;
  window.drawLossChart($("loss-chart"), metrics);
  state.metricsFinal = ended;
}

function describe(name, data) {
  switch (name) {
    case "progress": return `step ${data.step}/${data.max_steps} loss ${num(data.loss)} lr ${num(data.lr, 2)} ${num(data.tokens_per_s, 3)} tok/s`;
    case "validated": return `step ${data.step} eval loss ${num(data.eval_loss)} ppl ${num(data.perplexity)}`;
    case "checkpoint": return `step ${data.step} → ${data.store_key}`;
    case "assigned": case "started": return `worker ${data.worker_id}`;
    case "succeeded": return `adapter ${data.adapter.name} v${data.adapter.version}`;
    case "queued": return data.reason || "";
    default: return data.reason || "";
  }
}

function addEvent(name, cloudEvent) {
  const data = cloudEvent.data || {};
  const item = h("li", { dataset: { event: name } },
    h("span", { class: "mono" }, cloudEvent.time ? clock(cloudEvent.time) : ""), " ",
    h("span", { class: "ev" }, name), " ",
    data.attempt ? `#${data.attempt} ` : "", describe(name, data));
  const list = $("events");
  list.prepend(item); // newest first
  while (list.children.length > MAX_EVENTS) list.lastChild.remove();
  state.eventCount += 1;
  $("events-count").textContent = `(${state.eventCount})`;
}

// EventSource cannot send an Authorization header, so the SSE stream is read with fetch and
// parsed here (the format is small: "field: value" lines, a blank line ends an event).
async function followEvents(id, signal) {
  const resp = await fetch(`v1/jobs/${encodeURIComponent(id)}/events`, {
    headers: { ...headers(), Accept: "text/event-stream" }, signal,
  });
  if (!resp.ok || !resp.body) throw new ApiError(resp.status, "events stream refused");
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "", name = "message", data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let nl;
    while ((nl = buffer.search(/\r?\n/)) >= 0) {
      const line = buffer.slice(0, nl);
      buffer = buffer.slice(nl + (buffer[nl] === "\r" ? 2 : 1));
      if (line === "") {
        if (data.length && id === state.selected) {
          try { addEvent(name, JSON.parse(data.join("\n"))); } catch (_) { /* a ping or junk */ }
        }
        name = "message"; data = [];
      } else if (line.startsWith("event:")) name = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    }
  }
}

function selectJob(id) {
  if (state.events) state.events.abort();
  state.selected = id;
  state.record = null;
  state.metricsFinal = false;
  state.eventCount = 0;
  $("events").replaceChildren();
  $("events-count").textContent = "";
  window.drawLossChart($("loss-chart"), null);
  for (const row of document.querySelectorAll("#jobs tr.job")) {
    row.classList.toggle("selected", row.dataset.jobId === id);
  }
  history.replaceState(null, "", `#job=${encodeURIComponent(id)}`);
  const controller = new AbortController();
  state.events = controller;
  followEvents(id, controller.signal).catch((err) => {
    if (err.name !== "AbortError") console.warn("events stream ended:", err);
  });
  loadSelected().catch(() => {});
}

// --- the loop -------------------------------------------------------------------------------

async function tick() {
  const results = await Promise.allSettled([loadJobs(), loadWorkers(), loadSelected()]);
  const failed = results.find((r) => r.status === "rejected");
  if (!failed) {
    setStatus("ok", `live · ${new Date().toLocaleTimeString([], { hour12: false })}`);
    $("auth-banner").hidden = true;
  } else {
    setStatus("error", failed.reason.status === 401 ? "API key needed" : `error: ${failed.reason.message}`);
  }
  // The next poll is scheduled after this one finishes, so a slow gateway is never flooded.
  setTimeout(tick, POLL_MS);
}

function setupKeyForm() {
  const input = $("api-key");
  input.value = state.key;
  $("key-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.key = input.value.trim();
    if (state.key) localStorage.setItem(KEY_STORE, state.key);
    else localStorage.removeItem(KEY_STORE);
    if (state.selected) selectJob(state.selected); // reopen the stream with the new key
  });
  $("key-forget").addEventListener("click", () => {
    state.key = "";
    input.value = "";
    localStorage.removeItem(KEY_STORE);
  });
}

document.addEventListener("DOMContentLoaded", () => {
  setupKeyForm();
  const match = location.hash.match(/^#job=(.+)$/);
  if (match) selectJob(decodeURIComponent(match[1]));
  else window.drawLossChart($("loss-chart"), null);
  tick();
});
