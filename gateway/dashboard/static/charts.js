// llmgw dashboard charts: time series drawn with uPlot (uPlot.iife.min.js, vendored: see
// VENDORED.md), with operator intervals (circuit open, bench, key cooling and mutes, degraded
// mode) shaded on the same time axis. Loaded before dashboard.js on the pages that chart.
// Every chart has its numbers as a table too (a canvas says nothing to a screen reader).
"use strict";

const PALETTE = ["#2450b2", "#b00020", "#17803d", "#a05a00", "#7b2cbf", "#00838f", "#5d6677", "#c2185b"];
const BANDS = {
  circuit: "rgba(176, 0, 32, 0.18)",
  bench: "rgba(160, 90, 0, 0.18)",
  cooling: "rgba(230, 180, 0, 0.25)",
  muted: "rgba(123, 44, 191, 0.16)",
  degraded: "rgba(60, 60, 60, 0.16)",
};
const MAX_INTERVALS = 2000;  // the oldest are dropped past this

// Intervals from operator events, fed in time order: {kind, what, start, end} (end null:
// still on). A planned end (a bench's or cooldown's ``until``) is cut short by an earlier
// lift.
class Intervals {
  constructor() { this.list = []; this.open = new Map(); }

  add(ev) {
    const ts = ev.ts || Date.now() / 1000;
    switch (ev.kind) {
      case "circuit":
        if (ev.new === "open" && !this.open.has(`circuit ${ev.endpoint}`)) {
          this._begin(`circuit ${ev.endpoint}`, "circuit", ev.endpoint, ts, null);
        } else if (ev.new === "closed") this._end(`circuit ${ev.endpoint}`, ts);
        break;
      case "bench":
        if (!ev.endpoint) break;
        this._end(`bench ${ev.endpoint}`, ts);
        if (ev.benched) this._begin(`bench ${ev.endpoint}`, "bench", ev.endpoint, ts, ev.until || null);
        break;
      case "mode":
        if (ev.mode === "degraded") {
          if (!this.open.has("mode")) this._begin("mode", "degraded", "degraded mode", ev.since || ts, null);
        } else this._end("mode", ev.since || ts);
        break;
      case "keypool":
        if (ev.type === "KeyCooling" || ev.type === "KeyMuted") {
          const kind = ev.type === "KeyCooling" ? "cooling" : "muted";
          const what = `${ev.pool}${ev.credential_id ? " " + ev.credential_id : ""}`;
          this._push({kind, what, start: ev.until - ev.seconds, end: ev.until});
        }
        break;
      default:
    }
  }

  _begin(key, kind, what, start, end) {
    const iv = {kind, what, start, end};
    this.open.set(key, iv);
    this._push(iv);
  }

  _end(key, ts) {
    const iv = this.open.get(key);
    if (!iv) return;
    this.open.delete(key);
    iv.end = iv.end === null ? ts : Math.min(iv.end, ts);
  }

  _push(iv) {
    this.list.push(iv);
    if (this.list.length > MAX_INTERVALS) this.list.shift();
  }

  // Those overlapping [from, to], an end still to come drawn up to now.
  within(from, to) {
    const now = Math.min(to, Date.now() / 1000);
    return this.list
      .map((iv) => ({...iv, end: Math.min(iv.end === null ? now : iv.end, now)}))
      .filter((iv) => iv.end > from && iv.start < to);
  }
}

// One time chart in ``figure``: uPlot on a canvas, the intervals shaded behind the lines,
// and a table of its non-empty points under it. ``figure.chart`` is the uPlot instance.
class TimeChart {
  constructor(figure, unit, intervals) {
    this.figure = figure;
    this.unit = unit;
    this.intervals = intervals;
    this.names = null;
    this.plot = el("div", {class: "plot"});
    figure.querySelector("figcaption").after(this.plot);
    this.table = figure.querySelector("table.points");
  }

  // ``lines``: [{name, values, dash?}] over the bucket starts ``xs`` (unix seconds) of
  // buckets ``width`` seconds wide; the axis runs to the last bucket's end.
  show(xs, width, lines) {
    const names = lines.map((l) => l.name).join("\u0000");
    const end = xs[xs.length - 1] + width;
    const data = [[...xs, end], ...lines.map((l) => [...l.values, null])];
    const range = [xs[0], end];
    if (this.figure.chart && names === this.names) {
      this.figure.chart.setData(data);
    } else {
      if (this.figure.chart) this.figure.chart.destroy();
      this.names = names;
      this.figure.chart = new uPlot(this._options(lines), data, this.plot);
    }
    this.figure.dataset.from = String(range[0]);
    this.figure.dataset.to = String(range[1]);
    this._tabulate(xs, lines);
  }

  // Redraw (the intervals changed).
  redraw() { if (this.figure.chart) this.figure.chart.redraw(false, false); }

  _options(lines) {
    const unit = this.unit;
    return {
      width: Math.max(320, this.figure.clientWidth - 16),
      height: 180,
      series: [{}, ...lines.map((l, i) => ({
        label: l.name,
        stroke: PALETTE[i % PALETTE.length],
        width: 1.5,
        dash: l.dash,
        spanGaps: false,
        points: {show: true, size: 4},
        value: (u, v) => v === null || v === undefined ? "–" : `${v} ${unit}`,
      }))],
      axes: [{}, {values: (u, ticks) => ticks.map((t) => `${t}`)}],
      scales: {y: {range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1]}},
      hooks: {drawClear: [(u) => this._bands(u)]},
    };
  }

  _bands(u) {
    const from = u.scales.x.min, to = u.scales.x.max;
    const ctx = u.ctx;
    ctx.save();
    for (const iv of this.intervals.within(from, to)) {
      const x0 = u.valToPos(Math.max(iv.start, from), "x", true);
      const x1 = u.valToPos(Math.min(iv.end, to), "x", true);
      ctx.fillStyle = BANDS[iv.kind];
      ctx.fillRect(x0, u.bbox.top, Math.max(2, x1 - x0), u.bbox.height);
    }
    ctx.restore();
  }

  _tabulate(xs, lines) {
    if (!this.table) return;
    const rows = [];
    xs.forEach((x, i) => {
      for (const l of lines) {
        const v = l.values[i];
        if (v) rows.push(el("tr", {dataset: {ts: String(x), series: l.name}},
          el("td", {text: new Date(x * 1000).toLocaleTimeString()}), el("td", {text: l.name}),
          el("td", {class: "value", text: String(v)})));
      }
    });
    this.table.tBodies[0].replaceChildren(...rows);
  }
}

// The intervals as a list (what each band is, when).
function listIntervals(ol, intervals, from, to) {
  ol.replaceChildren(...intervals.within(from, to).map((iv) => el("li", {
    dataset: {kind: iv.kind, start: String(iv.start), end: String(iv.end)},
    text: `${iv.kind}: ${iv.what} ${new Date(iv.start * 1000).toLocaleTimeString()}–${new Date(iv.end * 1000).toLocaleTimeString()}`,
  })));
}
