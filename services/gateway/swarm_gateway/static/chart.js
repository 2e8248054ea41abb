// A small SVG line chart for a job's loss curves: no library, so nothing to fetch or build.
// drawLossChart(svg, metrics) redraws from a JobMetrics ({train: [{step, loss}], eval:
// [{step, eval_loss}]}) and records the point counts on the <svg> as data attributes, which
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

  window.drawLossChart = drawLossChart;
})();
