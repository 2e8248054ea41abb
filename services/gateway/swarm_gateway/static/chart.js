// Small SVG charts: no library, so nothing to fetch or build.
// drawLossChart(svg, metrics) redraws a job's loss curves from a JobMetrics ({train: [{step,
// loss}], eval: [{step, eval_loss}]}); drawScatter(svg, points, options) draws a sweep's metric
// against one parameter. Both record their point counts on the <svg> as data attributes, which
// tests (and curious people) can read without parsing the drawing.
"use strict";

(function () {
  const NS = "http://www.w3.org/2000/svg";
  const W = 640, H = 280, PAD = { left: 52, right: 16, top: 14, bottom: 34 };

  function el(name, attrs, text) {
    const node = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // About `count` round tick values covering [lo, hi] (1, 2 or 5 times a power of ten apart).
  function ticks(lo, hi, count) {
    const span = hi - lo || 1;
    const raw = span / count;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
    return out;
  }

  function fmt(v) {
    if (v === 0) return "0";
    const a = Math.abs(v);
    return a >= 1000 || a < 0.01 ? v.toExponential(1) : String(Number(v.toPrecision(3)));
  }

  function drawLossChart(svg, metrics) {
    const train = (metrics && metrics.train) || [];
    const evals = (metrics && metrics.eval) || [];
    svg.replaceChildren();
    svg.setAttribute("data-train-points", train.length);
    svg.setAttribute("data-eval-points", evals.length);
    if (!train.length && !evals.length) {
      svg.appendChild(el("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" },
        "no metrics yet"));
      return;
    }
    const steps = train.map((p) => p.step).concat(evals.map((p) => p.step));
    const values = train.map((p) => p.loss).concat(evals.map((p) => p.eval_loss))
      .filter((v) => Number.isFinite(v));
    let x0 = Math.min(...steps), x1 = Math.max(...steps);
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    let y0 = Math.min(...values), y1 = Math.max(...values);
    const margin = (y1 - y0) * 0.08 || Math.abs(y1) * 0.1 || 1;
    y0 -= margin; y1 += margin;
    const sx = (s) => PAD.left + ((s - x0) / (x1 - x0)) * (W - PAD.left - PAD.right);
    const sy = (v) => H - PAD.bottom - ((v - y0) / (y1 - y0)) * (H - PAD.top - PAD.bottom);

    for (const v of ticks(y0, y1, 5)) {
      svg.appendChild(el("line", { x1: PAD.left, x2: W - PAD.right, y1: sy(v), y2: sy(v), class: "grid" }));
      svg.appendChild(el("text", { x: PAD.left - 6, y: sy(v) + 4, "text-anchor": "end", class: "tick" }, fmt(v)));
    }
    for (const s of ticks(x0, x1, 6).filter((s) => Number.isInteger(s))) {
      svg.appendChild(el("text", { x: sx(s), y: H - PAD.bottom + 16, "text-anchor": "middle", class: "tick" }, String(s)));
    }
    svg.appendChild(el("text", { x: W - PAD.right, y: H - 4, "text-anchor": "end", class: "tick" }, "step"));
    svg.appendChild(el("line", { x1: PAD.left, x2: PAD.left, y1: PAD.top, y2: H - PAD.bottom, class: "axis" }));
    svg.appendChild(el("line", { x1: PAD.left, x2: W - PAD.right, y1: H - PAD.bottom, y2: H - PAD.bottom, class: "axis" }));

    const finite = (v) => Number.isFinite(v);
    const trainPts = train.filter((p) => finite(p.loss)).map((p) => `${sx(p.step).toFixed(1)},${sy(p.loss).toFixed(1)}`);
    if (trainPts.length) svg.appendChild(el("polyline", { points: trainPts.join(" "), class: "train" }));
    const evalOk = evals.filter((p) => finite(p.eval_loss));
    if (evalOk.length) {
      const pts = evalOk.map((p) => `${sx(p.step).toFixed(1)},${sy(p.eval_loss).toFixed(1)}`);
      svg.appendChild(el("polyline", { points: pts.join(" "), class: "eval" }));
      for (const p of evalOk) {
        const dot = el("circle", { cx: sx(p.step), cy: sy(p.eval_loss), r: 3.5, class: "eval-dot" });
        dot.appendChild(el("title", {}, `step ${p.step}: eval loss ${fmt(p.eval_loss)}`));
        svg.appendChild(dot);
      }
    }
  }

  // points: [{x, y, kind: "final" | "partial" | "best", title}]; options: {log: bool,
  // categories: [labels] (x is then the category's index), xlabel, ylabel}.
  function drawScatter(svg, points, options) {
    const SW = 320, SH = 220, P = { left: 46, right: 10, top: 10, bottom: 40 };
    const opts = options || {};
    const cats = opts.categories || null;
    const usable = points.filter((p) => Number.isFinite(p.y) && Number.isFinite(p.x) && (!opts.log || p.x > 0));
    svg.replaceChildren();
    svg.setAttribute("viewBox", `0 0 ${SW} ${SH}`);
    svg.setAttribute("data-points", usable.length);
    const fx = (x) => (opts.log ? Math.log10(x) : x);
    let x0, x1;
    if (cats) { x0 = -0.5; x1 = cats.length - 0.5; }
    else if (usable.length) {
      x0 = Math.min(...usable.map((p) => fx(p.x))); x1 = Math.max(...usable.map((p) => fx(p.x)));
      const pad = (x1 - x0) * 0.08 || 0.5; x0 -= pad; x1 += pad;
    } else { x0 = 0; x1 = 1; }
    const ys = usable.map((p) => p.y);
    let y0 = ys.length ? Math.min(...ys) : 0, y1 = ys.length ? Math.max(...ys) : 1;
    const margin = (y1 - y0) * 0.1 || Math.abs(y1) * 0.1 || 1;
    y0 -= margin; y1 += margin;
    const sx = (x) => P.left + ((fx(x) - x0) / (x1 - x0)) * (SW - P.left - P.right);
    const sxc = (i) => P.left + ((i - x0) / (x1 - x0)) * (SW - P.left - P.right);
    const sy = (v) => SH - P.bottom - ((v - y0) / (y1 - y0)) * (SH - P.top - P.bottom);

    for (const v of ticks(y0, y1, 4)) {
      svg.appendChild(el("line", { x1: P.left, x2: SW - P.right, y1: sy(v), y2: sy(v), class: "grid" }));
      svg.appendChild(el("text", { x: P.left - 5, y: sy(v) + 4, "text-anchor": "end", class: "tick" }, fmt(v)));
    }
    if (cats) {
      cats.forEach((label, i) => svg.appendChild(el("text", { x: sxc(i), y: SH - P.bottom + 14, "text-anchor": "middle", class: "tick" }, label)));
    } else {
      for (const t of ticks(x0, x1, 4)) {
        const label = opts.log ? fmt(Math.pow(10, t)) : fmt(t);
        svg.appendChild(el("text", { x: P.left + ((t - x0) / (x1 - x0)) * (SW - P.left - P.right), y: SH - P.bottom + 14, "text-anchor": "middle", class: "tick" }, label));
      }
    }
    svg.appendChild(el("text", { x: (P.left + SW - P.right) / 2, y: SH - 6, "text-anchor": "middle", class: "axis-label" }, opts.xlabel || ""));
    svg.appendChild(el("line", { x1: P.left, x2: P.left, y1: P.top, y2: SH - P.bottom, class: "axis" }));
    svg.appendChild(el("line", { x1: P.left, x2: SW - P.right, y1: SH - P.bottom, y2: SH - P.bottom, class: "axis" }));
    if (!usable.length) {
      svg.appendChild(el("text", { x: SW / 2, y: SH / 2, "text-anchor": "middle", class: "empty" }, "no evaluated trial yet"));
      return;
    }
    for (const p of usable) {
      const cx = cats ? sxc(p.x) : sx(p.x);
      const dot = el("circle", { cx, cy: sy(p.y), r: p.kind === "best" ? 6 : 4, class: `pt ${p.kind}` });
      dot.appendChild(el("title", {}, p.title || `${fmt(p.x)}: ${fmt(p.y)}`));
      svg.appendChild(dot);
    }
  }

  // The task evals' metrics (pass rates, 0 to 1) by step, one line per metric, from a
  // JobMetrics' eval points ({step, task: {exact_match: 0.9, ...}}). Records on the <svg> how
  // many metrics and points it drew; hides the <svg> for a job without task evals.
  const SERIES = ["#2a9d8f", "#e76f51", "#8e44ad", "#f4a261", "#264653", "#e9c46a"];
  function drawMetricChart(svg, metrics) {
    const points = ((metrics && metrics.eval) || []).filter((p) => p.task && Object.keys(p.task).length);
    const names = [...new Set(points.flatMap((p) => Object.keys(p.task)))];
    svg.replaceChildren();
    svg.setAttribute("data-metrics", names.join(","));
    svg.setAttribute("data-metric-points", points.length);
    svg.hidden = !names.length;
    if (!names.length) return;
    let x0 = Math.min(...points.map((p) => p.step)), x1 = Math.max(...points.map((p) => p.step));
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    const sx = (s) => PAD.left + ((s - x0) / (x1 - x0)) * (W - PAD.left - PAD.right);
    const sy = (v) => H - PAD.bottom - (v + 0.02) / 1.04 * (H - PAD.top - PAD.bottom);
    for (const v of [0, 0.25, 0.5, 0.75, 1]) {
      svg.appendChild(el("line", { x1: PAD.left, x2: W - PAD.right, y1: sy(v), y2: sy(v), class: "grid" }));
      svg.appendChild(el("text", { x: PAD.left - 6, y: sy(v) + 4, "text-anchor": "end", class: "tick" }, fmt(v)));
    }
    for (const s of ticks(x0, x1, 6).filter((s) => Number.isInteger(s))) {
      svg.appendChild(el("text", { x: sx(s), y: H - PAD.bottom + 16, "text-anchor": "middle", class: "tick" }, String(s)));
    }
    svg.appendChild(el("text", { x: W - PAD.right, y: H - 4, "text-anchor": "end", class: "tick" }, "step"));
    svg.appendChild(el("line", { x1: PAD.left, x2: PAD.left, y1: PAD.top, y2: H - PAD.bottom, class: "axis" }));
    svg.appendChild(el("line", { x1: PAD.left, x2: W - PAD.right, y1: H - PAD.bottom, y2: H - PAD.bottom, class: "axis" }));
    names.forEach((name, i) => {
      const color = SERIES[i % SERIES.length];
      const own = points.filter((p) => Number.isFinite(p.task[name]));
      const pts = own.map((p) => `${sx(p.step).toFixed(1)},${sy(p.task[name]).toFixed(1)}`);
      svg.appendChild(el("polyline", { points: pts.join(" "), class: "metric", stroke: color }));
      for (const p of own) {
        const dot = el("circle", { cx: sx(p.step), cy: sy(p.task[name]), r: 3.5, fill: color });
        dot.appendChild(el("title", {}, `step ${p.step}: ${name} ${fmt(p.task[name])}`));
        svg.appendChild(dot);
      }
      svg.appendChild(el("text", { x: PAD.left + 8, y: PAD.top + 14 + 14 * i, class: "tick", fill: color }, name));
    });
  }

  window.drawLossChart = drawLossChart;
  window.drawMetricChart = drawMetricChart;
  window.drawScatter = drawScatter;
})();
