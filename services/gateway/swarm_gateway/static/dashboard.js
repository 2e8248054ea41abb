// The Swarm dashboard: polls the public /v1 API once a second and follows the selected job's
// events over SSE; its playground streams a model's or an adapter's answer. Plain browser JS on purpose (no framework, no build, no CDN). Everything
// from the API is put in the page with textContent, never innerHTML: job names and reasons
// are user input.
"use strict";

const POLL_MS = 1000;
const MAX_EVENTS = 400;
const KEY_STORE = "swarm.apiKey";
const FINAL_READS = 10; // reads after the end before a curve short of the last step is final

const state = {
  key: localStorage.getItem(KEY_STORE) || "",
  selected: null, // job id
  record: null, // the selected job's JobRecord
  metricsFinal: false, // the selected job ended and its complete metrics were read
  readsAfterEnd: 0, // metrics reads since the selected job ended
  events: null, // AbortController of the running events stream
  eventCount: 0,
  model: null, // the playground's model: a base model or an adapter id from /v1/models
  answer: null, // AbortController of the playground's running answer
  ticks: 0,
  // What job states mean, read once from the gateway (dashboard/lifecycle.json, made from
  // swarm_contracts.events), never listed here: { terminal: Set, groups: [[label, states]] }.
  lifecycle: null,
};
const MODELS_EVERY = 5; // /v1/models asks the registry twice: every 5th poll is enough

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
    h("td", {}, taskSummary(job)),
    h("td", { class: "mono" }, job.worker_id || ""),
    h("td", {}, clock(job.created_at)));
  if (job.job_id === state.selected) row.classList.add("selected");
  row.addEventListener("click", () => selectJob(job.job_id));
  return row;
}

async function loadLifecycle() {
  if (state.lifecycle) return;
  const life = await api("dashboard/lifecycle.json");
  const terminal = life.states.filter((s) => s.terminal).map((s) => s.name);
  // One group per state a job is still in, in the order a job goes through them, then one
  // for all that ended.
  const groups = life.states.filter((s) => !s.terminal).map((s) => [s.name, [s.name]]);
  groups.push(["finished", terminal]);
  state.lifecycle = { terminal: new Set(terminal), groups };
}

function renderJobs(jobs) {
  const rows = [];
  for (const [label, states] of state.lifecycle.groups) {
    const group = jobs.filter((j) => states.includes(j.state));
    rows.push(h("tr", { class: "group" }, h("td", { colspan: 8 }, `${label} (${group.length})`)));
    rows.push(...group.map(jobRow));
  }
  $("jobs").tBodies[0].replaceChildren(...rows);
  $("jobs-count").textContent = `(${jobs.length})`;
}

// Pages of JOBS_PAGE, newest first, by the API's cursor; the cursors of the pages before
// this one are kept so that "newer" goes back exactly.
const JOBS_PAGE = 50;
const jobsPages = { cursors: [null], next: null };

async function loadJobs() {
  await loadLifecycle();
  const cursor = jobsPages.cursors[jobsPages.cursors.length - 1];
  const query = `v1/jobs?limit=${JOBS_PAGE}` + (cursor ? `&cursor=${encodeURIComponent(cursor)}` : "");
  const page = await api(query);
  jobsPages.next = page.next_cursor || null;
  renderJobs(page.data);
  $("jobs-page").textContent = `page ${jobsPages.cursors.length}`;
  $("jobs-newer").disabled = jobsPages.cursors.length === 1;
  $("jobs-older").disabled = !jobsPages.next;
}

function pageJobs(older) {
  if (older && jobsPages.next) jobsPages.cursors.push(jobsPages.next);
  else if (!older && jobsPages.cursors.length > 1) jobsPages.cursors.pop();
  else return;
  loadJobs().catch(() => {});
}

// --- the selected job ---------------------------------------------------------------------

// The task evals' metric names: each grader's name, else its type.
function taskMetrics(job) {
  const evals = job.spec && job.spec.evals;
  return evals ? evals.graders.map((g) => g.name || g.type) : [];
}

// "exact_match 0.93  json_valid 1.00": the task metrics the record holds (the kept adapter's
// once the job ended), as `swarm jobs` shows them.
function taskSummary(job) {
  const m = job.metrics || {};
  return taskMetrics(job).filter((n) => typeof m[n] === "number").map((n) => `${n} ${m[n].toFixed(2)}`).join("  ");
}

// The latest task evaluation's sample: prompt, expected, got, and a mark per metric.
function renderSamples(job) {
  const table = $("eval-samples");
  const evals = job.evals;
  table.hidden = !evals || !evals.samples.length;
  if (table.hidden) { table.replaceChildren(); return; }
  const names = taskMetrics(job);
  const head = h("tr", {}, ...["prompt", "expected", "got", ...names].map((n) => h("th", {}, n)));
  const rows = evals.samples.map((s) => h("tr", {},
    h("td", {}, s.prompt), h("td", {}, s.expected), h("td", {}, s.got),
    ...names.map((n) => h("td", { title: (s.errors && s.errors[n]) || "" }, s.scores[n] ? "✓" : "✗"))));
  table.replaceChildren(
    h("caption", {}, `task evals at step ${evals.step} (${evals.examples} held-out rows)`), head, ...rows);
}

function renderSummary(job) {
  const items = [
    ["state", job.state], ["attempt", job.attempt], ["worker", job.worker_id || "—"],
    ["base model", job.spec.base_model], ["dataset", job.spec.dataset],
  ];
  if (job.metrics && job.metrics.eval_loss !== undefined) items.push(["eval loss", num(job.metrics.eval_loss)]);
  for (const name of taskMetrics(job)) {
    if (job.metrics && job.metrics[name] !== undefined) items.push([name, num(job.metrics[name])]);
  }
  if (job.adapter) items.push(["adapter", `${job.adapter.name} v${job.adapter.version}`]);
  if (job.reason) items.push(["reason", job.reason]);
  const spans = items.map(([k, v]) => h("span", {}, `${k}: `, h("b", {}, v)));
  if (job.adapter) {
    // Straight to the playground with this version.
    const ref = `${job.adapter.name}@${job.adapter.version}`;
    const tryIt = h("button", { type: "button", class: "try", id: "try-adapter" }, "try it");
    tryIt.addEventListener("click", () => selectModel(ref));
    spans.push(tryIt);
  }
  $("job-summary").replaceChildren(...spans);
  $("job-title").textContent = `${job.job_id} (${job.spec.name})`;
}

async function loadSelected() {
  const id = state.selected;
  if (!id) return;
  const job = await api(`v1/jobs/${encodeURIComponent(id)}`);
  if (id !== state.selected) return; // another job was picked meanwhile
  state.record = job;
  renderSummary(job);
  renderSamples(job);
  // A finished job's curves no longer change: read them until they are complete, then stop.
  if (state.metricsFinal) return;
  const ended = state.lifecycle !== null && state.lifecycle.terminal.has(job.state);
  const metrics = await api(`v1/jobs/${encodeURIComponent(id)}/metrics?max_points=500`);
  if (id !== state.selected) return;
  window.drawLossChart($("loss-chart"), metrics);
  window.drawMetricChart($("metric-chart"), metrics);
  // Telemetry may still be taking in the last progress events when the record already says
  // the job ended: the curve is final once it reaches the record's last step (or after a few
  // more reads, for a job whose telemetry never comes).
  const train = metrics.train || [];
  const drawn = train.length ? train[train.length - 1].step : 0;
  const last = (job.metrics && job.metrics.step) || 0;
  if (ended) state.readsAfterEnd += 1;
  state.metricsFinal = ended && (drawn >= last || state.readsAfterEnd > FINAL_READS);
}

function describe(name, data) {
  switch (name) {
    case "progress": return `step ${data.step}/${data.max_steps} loss ${num(data.loss)} lr ${num(data.lr, 2)} ${num(data.tokens_per_s, 3)} tok/s`;
    case "validated": {
      const task = data.evals ? Object.entries(data.evals.metrics).map(([k, v]) => ` ${k} ${num(v)}`).join("") : "";
      return `step ${data.step} eval loss ${num(data.eval_loss)} ppl ${num(data.perplexity)}${task}`;
    }
    case "checkpoint": return `step ${data.step} → ${data.store_key}`;
    case "assigned": case "started": return `worker ${data.worker_id}`;
    case "succeeded": return `adapter ${data.adapter.name} v${data.adapter.version}`;
    case "queued": return data.reason || "";
    case "paused": return data.last_checkpoint_step ? `at step ${data.last_checkpoint_step}: ${data.reason}` : data.reason || "";
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
  state.readsAfterEnd = 0;
  state.eventCount = 0;
  $("events").replaceChildren();
  $("events-count").textContent = "";
  window.drawLossChart($("loss-chart"), null);
  window.drawMetricChart($("metric-chart"), null);
  $("eval-samples").replaceChildren();
  $("eval-samples").hidden = true;
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

// --- models, adapters and the playground -------------------------------------------------

function renderModels(entries) {
  const body = $("models").tBodies[0];
  body.replaceChildren(
    ...entries.map((m) => {
      const row = h("tr", { dataset: { modelId: m.id, kind: m.kind } },
        h("td", { class: "mono" }, m.id),
        h("td", {}, m.kind === "adapter" ? "adapter" : "base model"),
        h("td", { class: "mono" }, m.kind === "adapter" ? m.base_model : `${m.name}@${m.version}`),
        h("td", {}, m.served ? badge("served") : h("span", { class: "badge" }, "no worker")),
        h("td", {}, clock(new Date(m.created * 1000).toISOString())));
      if (m.id === state.model) row.classList.add("selected");
      row.addEventListener("click", () => selectModel(m.id));
      return row;
    }));
  $("models-count").textContent = `(${entries.length})`;
}

async function loadModels() {
  renderModels((await api("v1/models")).data);
}

function selectModel(id) {
  state.model = id;
  $("playground-model").textContent = id;
  for (const row of document.querySelectorAll("#models tbody tr")) {
    row.classList.toggle("selected", row.dataset.modelId === id);
  }
}

// The answer streams in as OpenAI-format SSE ("data: {chunk}" lines, "data: [DONE]" at the
// end, "data: {error}" if a worker fails mid-answer); read with fetch, like the job events.
async function ask(ev) {
  ev.preventDefault();
  const out = $("playground-output");
  const usage = $("playground-usage");
  if (!state.model) {
    out.dataset.state = "error";
    out.textContent = "Select a model or an adapter first.";
    return;
  }
  if (state.answer) state.answer.abort();
  const controller = new AbortController();
  state.answer = controller;
  out.textContent = "";
  usage.textContent = "";
  out.dataset.state = "streaming";
  const body = {
    model: state.model,
    messages: [{ role: "user", content: $("playground-prompt").value }],
    max_tokens: Number($("playground-max-tokens").value) || 64,
    temperature: Number($("playground-temperature").value) || 0,
    stream: true,
    stream_options: { include_usage: true },
  };
  try {
    const resp = await fetch("v1/chat/completions", {
      method: "POST",
      headers: { ...headers(), "Content-Type": "application/json", Accept: "text/event-stream" },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!resp.ok || !resp.body) {
      let detail = resp.statusText;
      try { detail = (await resp.json()).error.message; } catch (_) { /* keep the status */ }
      throw new ApiError(resp.status, detail);
    }
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let nl;
      while ((nl = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, nl).replace(/\r$/, "");
        buffer = buffer.slice(nl + 1);
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") {
          out.dataset.state = "done";
          continue;
        }
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        for (const choice of chunk.choices || []) {
          out.textContent += (choice.delta && choice.delta.content) || "";
        }
        if (chunk.usage) {
          usage.textContent = `${chunk.model} · ${chunk.usage.prompt_tokens} prompt + ` +
            `${chunk.usage.completion_tokens} completion tokens`;
        }
      }
    }
    if (out.dataset.state !== "done") throw new Error("the answer ended early");
  } catch (err) {
    if (err.name === "AbortError") {
      out.dataset.state = "stopped";
      return;
    }
    out.dataset.state = "error";
    out.textContent += (out.textContent ? "\n" : "") + `error: ${err.message}`;
  }
}

function setupPlayground() {
  $("playground").addEventListener("submit", ask);
  $("playground-stop").addEventListener("click", () => {
    if (state.answer) state.answer.abort();
  });
}

// --- the loop -------------------------------------------------------------------------------

async function tick() {
  const loads = [
    loadJobs(), loadWorkers(), loadSelected(), loadSweeps(), loadSelectedSweep(), loadTinker(),
  ];
  if (state.ticks++ % MODELS_EVERY === 0) loads.push(loadModels());
  const results = await Promise.allSettled(loads);
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
  setupPlayground();
  $("jobs-newer").addEventListener("click", () => pageJobs(false));
  $("jobs-older").addEventListener("click", () => pageJobs(true));
  const match = location.hash.match(/^#job=(.+)$/);
  if (match) selectJob(decodeURIComponent(match[1]));
  else window.drawLossChart($("loss-chart"), null);
  const sweep = location.hash.match(/^#sweep=(.+)$/);
  if (sweep) selectSweep(decodeURIComponent(sweep[1]));
  tick();
});
