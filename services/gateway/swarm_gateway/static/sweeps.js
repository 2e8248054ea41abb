// The dashboard's sweeps: the list of sweeps and the selected one's trials table with a
// scatter plot of the metric against each searched parameter. Uses dashboard.js's helpers
// (api, h, badge, num, clock, selectJob), loaded before it; everything from the API goes in
// with textContent (through h), never innerHTML.
"use strict";

const sweepView = { selected: null };

function sweepRow(sweep) {
  const best = sweep.best ? `${num(sweep.best.value)} (trial ${sweep.best.trial})` : "";
  const row = h("tr", { class: "sweep", dataset: { sweepId: sweep.sweep_id, state: sweep.state } },
    h("td", { class: "mono" }, sweep.sweep_id),
    h("td", {}, sweep.spec.name),
    h("td", {}, badge(sweep.state)),
    h("td", {}, sweep.spec.algorithm),
    h("td", {}, String(sweep.spec.budget)),
    h("td", {}, best),
    h("td", {}, clock(sweep.created_at)));
  if (sweep.sweep_id === sweepView.selected) row.classList.add("selected");
  row.addEventListener("click", () => selectSweep(sweep.sweep_id));
  return row;
}

async function loadSweeps() {
  const sweeps = (await api("v1/sweeps?limit=50")).data;
  $("sweeps").tBodies[0].replaceChildren(...sweeps.map(sweepRow));
  $("sweeps-count").textContent = `(${sweeps.length})`;
}

// JSON equality, for choice values that are lists (target modules).
function same(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

function label(value) {
  const text = Array.isArray(value) ? value.join(",") : String(value);
  return text.length > 16 ? `${text.slice(0, 15)}…` : text;
}

function lastEval(trial) {
  const steps = Object.keys(trial.evals || {}).map(Number);
  if (!steps.length) return null;
  const step = Math.max(...steps);
  return { step, value: trial.evals[step] };
}

function trialPoint(trial, path, param, bestTrial) {
  const last = lastEval(trial);
  const final = typeof trial.value === "number";
  const y = final ? trial.value : last ? last.value : NaN;
  const value = trial.params[path];
  const x = param.type === "choice" ? param.values.findIndex((v) => same(v, value)) : value;
  const kind = trial.trial === bestTrial ? "best" : final ? "final" : "partial";
  return { x, y, kind, title: `trial ${trial.trial}: ${label(value)} → ${num(y)}` };
}

function renderSweepCharts(sweep) {
  const bestTrial = sweep.best ? sweep.best.trial : null;
  const figures = Object.entries(sweep.spec.search).map(([path, param]) => {
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("class", "scatter");
    svg.setAttribute("role", "img");
    svg.dataset.param = path;
    svg.setAttribute("aria-label", `${sweep.spec.metric} against ${path}`);
    window.drawScatter(svg, sweep.trials.map((t) => trialPoint(t, path, param, bestTrial)), {
      log: param.type === "log_uniform" || (param.type === "int" && param.log),
      categories: param.type === "choice" ? param.values.map(label) : null,
      xlabel: path,
    });
    return h("figure", { class: "scatter-box" }, svg);
  });
  $("sweep-charts").replaceChildren(...figures);
}

function renderTrials(sweep) {
  const paths = Object.keys(sweep.spec.search);
  const head = h("tr", {}, h("th", {}, "#"), h("th", {}, "state"),
    ...paths.map((p) => h("th", {}, p)),
    h("th", {}, `last ${sweep.spec.metric}`), h("th", {}, sweep.spec.metric), h("th", {}, "job"));
  $("trials").tHead.replaceChildren(head);
  const bestTrial = sweep.best ? sweep.best.trial : null;
  $("trials").tBodies[0].replaceChildren(...sweep.trials.map((t) => {
    const last = lastEval(t);
    const state = t.pruned_at_step !== null && t.pruned_at_step !== undefined
      ? h("span", {}, badge(t.state), ` @${t.pruned_at_step}`) : badge(t.state);
    const job = h("td", { class: "mono link" }, t.job_id);
    job.addEventListener("click", () => selectJob(t.job_id));
    return h("tr", { dataset: { trial: String(t.trial), state: t.state } },
      h("td", {}, `${t.trial}${t.trial === bestTrial ? " ★" : ""}`),
      h("td", {}, state),
      ...paths.map((p) => h("td", {}, label(t.params[p]))),
      h("td", {}, last ? `${num(last.value)} @${last.step}` : ""),
      h("td", {}, num(t.value)),
      job);
  }));
}

function renderSweep(sweep) {
  const done = sweep.trials.filter((t) => !["pending", "queued", "running"].includes(t.state)).length;
  const items = [
    ["state", sweep.state], ["algorithm", sweep.spec.algorithm],
    ["metric", `${sweep.spec.metric} (${sweep.spec.mode})`],
    ["trials", `${done} / ${sweep.spec.budget} ended`],
    ["at once", String(sweep.spec.max_concurrent)],
  ];
  if (sweep.spec.early_stopping) items.push(["early stopping", sweep.spec.early_stopping.type]);
  if (sweep.best) {
    const a = sweep.best.adapter;
    items.push(["best", `trial ${sweep.best.trial}: ${num(sweep.best.value)}${a ? ` (${a.name} v${a.version})` : ""}`]);
  }
  if (sweep.reason) items.push(["reason", sweep.reason]);
  $("sweep-summary").replaceChildren(...items.map(([k, v]) => h("span", {}, `${k}: `, h("b", {}, v))));
  $("sweep-title").textContent = `${sweep.sweep_id} (${sweep.spec.name})`;
  renderSweepCharts(sweep);
  renderTrials(sweep);
  $("sweep-view").hidden = false;
}

async function loadSelectedSweep() {
  const id = sweepView.selected;
  if (!id) return;
  const sweep = await api(`v1/sweeps/${encodeURIComponent(id)}`);
  if (id === sweepView.selected) renderSweep(sweep);
}

function selectSweep(id) {
  sweepView.selected = id;
  for (const row of document.querySelectorAll("#sweeps tr.sweep")) {
    row.classList.toggle("selected", row.dataset.sweepId === id);
  }
  history.replaceState(null, "", `#sweep=${encodeURIComponent(id)}`);
  loadSelectedSweep().catch(() => {});
}
