// llmgw dashboard: fills the server-rendered pages from the admin API (/dashboard/api/...,
// the admin HTTP API under the session) and keeps them live from ONE event stream per page.
// No framework, no build step. Text goes into the DOM as text (never innerHTML).
"use strict";

const CSRF = document.querySelector('meta[name="csrf-token"]').content;
// How this operator's own admin commands are audited: those events are no news to this page.
const ME = document.querySelector('meta[name="audit-as"]').content;
const MAX_ROWS = 500;        // rows a live table keeps; older ones are dropped
const MAX_PAUSED = 1000;     // events held while paused; older ones are dropped
const HISTORY_S = 86400;     // how far back the overview's operator events reach at load
const LIVE_MS = 30000;       // the last hour's charts are re-read this often while shown
const USAGE_MS = 10000;      // the limits' usage is re-read this often while shown

class ApiError extends Error {
  constructor(status, error) {
    super((error && error.message) || `HTTP ${status}`);
    this.status = status;
    this.param = error && error.param;
  }
}

// The session is over (expired, signed out in another tab, its admin key revoked): go sign
// in again and come back to this page, rather than leave it stale with an error.
function signInAgain() {
  location.assign("/dashboard/signin?next=" + encodeURIComponent(document.body.dataset.page));
}

async function api(method, path, body) {
  const init = {method, credentials: "same-origin", headers: {"x-csrf-token": CSRF}};
  if (body !== undefined) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch("/dashboard/api" + path, init);
  const data = await resp.json().catch(() => ({}));
  // Only the dashboard's own "no session" 401, not one an admin call answers (an explain as
  // a caller whose key is bad).
  if (resp.status === 401 && resp.headers.get("x-llmgw-dashboard-session") === "none") signInAgain();
  if (!resp.ok) throw new ApiError(resp.status, data.error);
  return data;
}

const admin = (area, verb, args) => api("POST", `/admin/${area}/${verb}`, args || {});

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "text") node.textContent = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k in node && typeof v !== "string") node[k] = v;
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

function flash(text, error) {
  const box = document.getElementById("flash");
  box.textContent = text;
  box.className = error ? "error" : "ok";
}

// Run an action; show its error (with the field it names) instead of throwing.
async function attempt(fn, done) {
  try {
    const out = await fn();
    if (done) flash(done, false);
    return out;
  } catch (err) {
    flash(err.param ? `${err.param}: ${err.message}` : err.message, true);
    return undefined;
  }
}

// The number a numeric field holds, or an error naming the field. Number("") is 0, so an
// emptied field (or one whose text is no number: its value is then "") would otherwise send
// 0: a route's weight, a guardrail or the exploration zeroed by a slip of the keyboard.
function numberIn(input, name) {
  const value = input.value.trim() === "" ? NaN : Number(input.value);
  if (!Number.isFinite(value)) {
    input.setAttribute("aria-invalid", "true");
    throw new ApiError(0, {message: "enter a number (the field is empty or holds no number)", param: name});
  }
  input.removeAttribute("aria-invalid");
  return value;
}

// ``rows``, or, when there are none, one row saying so (``text``): an empty table reads as
// "still loading" or "broken" to an operator on a first day with no traffic.
function rowsOr(rows, columns, text) {
  return rows.length ? rows : [el("tr", {class: "empty"}, el("td", {colspan: String(columns), text}))];
}

const time = (ts) => ts ? new Date(ts * 1000).toLocaleTimeString() : "";
const stamp = (ts) => ts ? new Date(ts * 1000).toLocaleString() : "";
const ms = (v) => v === null || v === undefined ? "–" : `${Math.round(v)} ms`;

// The page's one event stream. ``onEvent`` gets each event as its JSON object. With
// ``since`` (unix seconds), the events the gateway kept from then on come first; a gateway
// that keeps none refuses ``since``, and the stream is then opened live only. ``onOpen``
// runs each time the stream (re)connects: what changed before it was connected came as no
// event, so a page that shows state reloads it then.
function stream(kinds, onEvent, since, onOpen) {
  const params = new URLSearchParams();
  if (kinds && kinds.length) params.set("kind", kinds.join(","));
  if (since !== undefined) params.set("since", String(since));
  const query = params.size ? "?" + params : "";
  const source = new EventSource("/dashboard/api/events" + query);
  let opened = false;
  const handle = (msg) => onEvent(JSON.parse(msg.data));
  // Every kind there is (the server's list, on the body): a named event no listener asks
  // for is never delivered.
  for (const kind of kinds && kinds.length ? kinds : document.body.dataset.eventKinds.split(" ")) {
    source.addEventListener(kind, handle);
  }
  source.addEventListener("open", () => {
    opened = true;
    document.body.dataset.live = "1";
    if (onOpen) onOpen();
  });
  source.addEventListener("error", () => {
    if (source.readyState !== EventSource.CLOSED) return;  // the browser reconnects itself
    if (since !== undefined && !opened) {
      stream(kinds, onEvent, undefined, onOpen);
      return;
    }
    // Refused (a 401 once the session is over): no more live updates. Ask why; a 401
    // sends the operator to sign in, anything else is said.
    delete document.body.dataset.live;
    api("GET", "/health/deep").then(
      () => flash("live updates stopped: reload the page", true),
      (err) => { if (err.status !== 401) flash(`live updates stopped: ${err.message}`, true); });
  });
  window.addEventListener("pagehide", () => source.close());
  return source;
}

// ``fn`` at most once at a time; calls while it runs collapse into one more run.
function coalesced(fn) {
  let running = null, again = false;
  const run = async () => {
    if (running) { again = true; return running; }
    running = (async () => {
      do { again = false; await fn(); } while (again);
    })();
    try { await running; } finally { running = null; }
  };
  return run;
}

// Reload when an admin command of ``areas`` succeeded anywhere (another dashboard, the CLI).
function followAdmin(areas, reload) {
  return (ev) => {
    if (ev.kind === "admin" && ev.ok && areas.includes(ev.area)) reload();
  };
}

function ready() { document.body.dataset.ready = "1"; }
/** Whether the operator is in ``form`` (its field or button has the focus). */
function editing(form) { return form.contains(document.activeElement); }

// -- Overview -----------------------------------------------------------------------------

async function overview() {
  const tbody = document.querySelector("#endpoints tbody");
  const recent = document.getElementById("recent");
  const cell = (endpoint, col) => {
    const row = tbody.querySelector(`tr[data-endpoint="${CSS.escape(endpoint)}"]`);
    return row && row.querySelector(`[data-col="${col}"]`);
  };
  const setCircuit = (td, state) => { td.textContent = state; td.className = `circuit ${state}`; };
  const controls = document.getElementById("chart-controls");
  const intervals = new Intervals();
  const charts = ["requests", "errors", "ttft"].map((name) =>
    new TimeChart(document.getElementById(`chart-${name}`), name === "ttft" ? "ms" : "", intervals));
  let shown = null;  // the series drawn, for the intervals list's range
  const drawCharts = (series) => {
    shown = series;
    const xs = series.all.map((p) => p[0]);
    const named = [["all", series.all], ...Object.entries(series.groups)];
    const lines = (i, suffix, dash) => named.map(([name, points]) =>
      ({name: name + suffix, values: points.map((p) => p[i]), dash}));
    charts[0].show(xs, series.bucket_seconds, lines(1, ""));
    charts[1].show(xs, series.bucket_seconds, lines(2, ""));
    charts[2].show(xs, series.bucket_seconds, [...lines(3, " p50"), ...lines(4, " p95", [6, 4])]);
    showIntervals();
  };
  const showIntervals = () => {
    if (!shown) return;
    const xs = shown.all;
    listIntervals(document.getElementById("intervals"), intervals, xs[0][0],
      xs[xs.length - 1][0] + shown.bucket_seconds);
  };
  let bandsFrame = 0;  // one redraw per animation frame, however many events arrive
  const bandsSoon = () => {
    if (!bandsFrame) bandsFrame = requestAnimationFrame(() => {
      bandsFrame = 0;
      for (const c of charts) c.redraw();
      showIntervals();
    });
  };
  const rates = coalesced(async () => {
    const f = controls.elements;
    const agg = await admin("log", "aggregate", {range: f.range.value, by: f.by.value});
    drawCharts(agg.series);
    const all = agg.requests;
    document.getElementById("rpm").textContent = all.requests_per_minute;
    document.getElementById("epm").textContent = all.errors_per_minute;
    document.getElementById("p50").textContent = ms(all.ttft_p50_ms);
    document.getElementById("p95").textContent = ms(all.ttft_p95_ms);
    for (const row of tbody.rows) {
      const e = agg.endpoints[row.dataset.endpoint];
      row.querySelector('[data-col="rpm"]').textContent = e ? e.requests_per_minute : 0;
      row.querySelector('[data-col="epm"]').textContent = e ? e.errors_per_minute : 0;
      row.querySelector('[data-col="p50"]').textContent = ms(e && e.ttft_p50_ms);
      row.querySelector('[data-col="p95"]').textContent = ms(e && e.ttft_p95_ms);
    }
  });
  // After a transition, the rates and last errors again: at most once per 5 s, and once
  // more at the end of a burst (driven by events only, never a polling loop).
  let lastRates = 0, trailing = 0;
  const ratesSoon = () => {
    const wait = lastRates + 5000 - Date.now();
    if (wait <= 0) { lastRates = Date.now(); rates(); lastErrors(); availability(); return; }
    if (!trailing) trailing = setTimeout(() => { trailing = 0; ratesSoon(); }, wait);
  };
  const [health, errors] = await Promise.all([
    api("GET", "/health/deep"),
    admin("log", "query", {kind: "attempt", outcome: "failure", limit: 10}),
  ]);
  const showMode = (mode, since) => {
    const m = document.getElementById("mode-value");
    m.textContent = mode;
    m.className = mode;
    document.getElementById("mode-since").textContent = since ? `since ${stamp(since)}` : "";
  };
  showMode(health.mode, health.mode_since);
  for (const [endpoint, st] of Object.entries(health.endpoints)) {
    const muted = (st.credentials || []).filter((k) => k.muted_until);
    tbody.append(el("tr", {dataset: {endpoint}},
      el("td", {text: endpoint}), el("td", {text: st.model}),
      el("td", {"data-col": "availability", text: `${(st.availability * 100).toFixed(1)}%`}),
      el("td", {"data-col": "circuit", class: `circuit ${st.circuit_state}`, text: st.circuit_state}),
      el("td", {"data-col": "bench", text: st.benched_until ? `until ${time(st.benched_until)}${st.bench_reason ? ` (${st.bench_reason})` : ""}` : "–"}),
      el("td", {"data-col": "mutes", text: muted.map((k) => `${k.credential_id} until ${time(k.muted_until)}`).join(", ") || "–"}),
      el("td", {"data-col": "rpm", text: "…"}), el("td", {"data-col": "epm", text: "…"}),
      el("td", {"data-col": "p50", text: "…"}), el("td", {"data-col": "p95", text: "…"})));
  }
  // Availability moves with every observation; it is re-read with the rates, not per event.
  const availability = coalesced(async () => {
    const now = await api("GET", "/health/deep");
    for (const [endpoint, st] of Object.entries(now.endpoints)) {
      const td = cell(endpoint, "availability");
      if (td) td.textContent = `${(st.availability * 100).toFixed(1)}%`;
    }
  });
  const errBody = document.querySelector("#errors tbody");
  const showErrors = (rows) => errBody.replaceChildren(...rows.reverse().map((r) => el("tr", {},
    el("td", {text: stamp(r.ts)}), el("td", {text: r.endpoint}), el("td", {text: r.status ?? ""}),
    el("td", {text: r.error_kind}), el("td", {text: r.request_id}))));
  const lastErrors = coalesced(async () => showErrors(
    (await admin("log", "query", {kind: "attempt", outcome: "failure", limit: 10})).rows));
  showErrors(errors.rows);
  await rates();
  lastRates = Date.now();
  controls.addEventListener("change", () => rates());
  setInterval(() => {
    if (controls.elements.range.value === "hour" && !document.hidden) rates();
  }, LIVE_MS);
  // The last day's operator events the gateway kept, then live ones: the list is not empty
  // until something happens, and the charts' intervals reach back as far as they do.
  stream(["circuit", "bench", "mode", "keypool", "auth_rejected"], (ev) => {
    intervals.add(ev);
    bandsSoon();
    recent.prepend(el("li", {text: `${time(ev.ts) || new Date().toLocaleTimeString()} ${ev.kind}: ${summary(ev)}`}));
    while (recent.children.length > 50) recent.lastChild.remove();
    if (ev.kind === "circuit") {
      const td = cell(ev.endpoint, "circuit");
      if (td) setCircuit(td, ev.new);
      ratesSoon();
    } else if (ev.kind === "bench" && ev.endpoint) {
      const td = cell(ev.endpoint, "bench");
      if (td) td.textContent = ev.benched ? `until ${time(ev.until)} (${ev.reason})` : "–";
      ratesSoon();
    } else if (ev.kind === "mode") {
      showMode(ev.mode, ev.since);
    } else if (ev.kind === "keypool" && ev.pool) {
      const td = cell(ev.pool, "mutes");
      if (td) td.textContent = ev.type === "KeyMuted" ? `${ev.credential_id} until ${time(ev.until)}` : "–";
    }
  }, Math.floor(Date.now() / 1000) - HISTORY_S);
  ready();
}

function summary(ev) {
  switch (ev.kind) {
    case "decision":
      return `${ev.requested_model || ev.model} → ${ev.served || "nothing"} (${ev.status})`;
    case "circuit": return `${ev.endpoint} ${ev.old} → ${ev.new}`;
    case "bench": return `${ev.endpoint || ev.model} ${ev.benched ? "benched" : "back"}`;
    case "mode": return `mode ${ev.mode}`;
    case "keypool": return `${ev.pool} ${ev.credential_id} ${ev.type === "KeyMuted" ? "muted" : "back"}`;
    case "admin": return `${ev.area} ${ev.verb} by ${ev.by} ${ev.ok ? "ok" : "refused"}`;
    case "config": {
      const told = [["+", ev.added], ["~", ev.changed], ["-", ev.removed]]
        .filter(([, ids]) => ids && ids.length).map(([sign, ids]) => sign + ids.join(", "));
      return `reload to ${ev.version}${told.length ? ": " + told.join(" ") : ""}${ev.by ? " by " + ev.by : ""}`;
    }
    case "chains": return `chain ${ev.chain} lost ${ev.models.join(", ")} (was ${ev.before.join(", ")})`;
    case "capacity": return `${ev.endpoint} limit ${num(ev.limit, 1)}, ${ev.in_flight} in flight`;
    default: return ev.type || "";
  }
}

function reason(ev) {
  if (ev.kind !== "decision") return ev.reason || ev.message || "";
  const parts = [ev.reason];
  if (ev.rule) parts.push(`rule ${ev.rule}`);
  if (ev.chain) parts.push(`chain ${ev.chain}`);
  if (ev.axis) parts.push(`axis ${ev.axis}`);
  if (ev.chosen) parts.push(`chose ${ev.chosen}${ev.score != null ? ` (${ev.score.toFixed(3)})` : ""}`);
  if (ev.explored) parts.push("exploration");
  if (ev.fallback) parts.push("fallback");
  return parts.filter(Boolean).join(" · ");
}

// -- Live events --------------------------------------------------------------------------

function events() {
  const tbody = document.querySelector("#events tbody");
  const kindSel = document.getElementById("kind-filter");
  const modelIn = document.getElementById("model-filter");
  const pauseBtn = document.getElementById("pause");
  const kept = [];     // the newest MAX_ROWS events, filters applied at display
  let held = [], dropped = 0, paused = false, frame = 0, unseen = [];
  const modelOf = (ev) => ev.model || ev.requested_model || ev.endpoint || ev.pool || "";
  const shows = (ev) => (!kindSel.value || ev.kind === kindSel.value)
    && (!modelIn.value || modelOf(ev).includes(modelIn.value));
  const row = (ev) => el("tr", {dataset: {kind: ev.kind}},
    el("td", {text: time(ev.ts) || new Date().toLocaleTimeString()}), el("td", {text: ev.kind}),
    el("td", {text: modelOf(ev)}), el("td", {text: summary(ev)}), el("td", {class: "reason", text: reason(ev)}));
  const count = () => {
    document.getElementById("event-count").textContent = `${tbody.rows.length} shown`;
    document.getElementById("dropped").textContent = `${dropped} dropped while paused`;
  };
  const paint = () => {  // one DOM update per animation frame, however fast events come
    frame = 0;
    const rows = unseen.filter(shows).slice(-MAX_ROWS).map(row);
    unseen = [];
    tbody.prepend(...rows.reverse());
    while (tbody.rows.length > MAX_ROWS) tbody.lastChild.remove();
    count();
  };
  const redraw = () => {
    tbody.replaceChildren(...kept.filter(shows).reverse().map(row));
    count();
  };
  const take = (ev) => {
    kept.push(ev);
    if (kept.length > MAX_ROWS) kept.shift();
    unseen.push(ev);
    if (!frame) frame = requestAnimationFrame(paint);
  };
  kindSel.addEventListener("change", redraw);
  modelIn.addEventListener("input", redraw);
  pauseBtn.addEventListener("click", () => {
    paused = !paused;
    pauseBtn.textContent = paused ? "Resume" : "Pause";
    pauseBtn.setAttribute("aria-pressed", String(paused));
    if (paused) {  // what arrived but is not painted yet waits too
      if (frame) { cancelAnimationFrame(frame); frame = 0; }
      kept.splice(Math.max(0, kept.length - unseen.length));
      held = unseen;
      unseen = [];
    } else {
      const h = held; held = []; h.forEach(take);
    }
  });
  stream([], (ev) => {
    if (!paused) return take(ev);
    held.push(ev);
    if (held.length > MAX_PAUSED) { held.shift(); dropped += 1; }
    if (dropped % 50 === 1) count();
  });
  ready();
}

// -- Chains and steering ------------------------------------------------------------------

const PRESETS = ["smartest", "fastest", "biggest_budget"];

function chains() {
  const box = document.getElementById("chains");
  let dragged = null;
  const show = (chain, active) => {
    const name = chain.name;
    const list = el("ol", {class: "chain-models", dataset: {chain: name}});
    const move = (model, position) => attempt(async () => {
      await admin("chains", "move", {name, model, position});
      await load();
    }, `moved ${model} to ${position} in ${name}`);
    chain.models.forEach((m, i) => {
      const li = el("li", {draggable: "true", dataset: {model: m.model}},
        el("span", {class: "handle", "aria-hidden": "true", text: "⠿"}),
        el("span", {class: "model", text: m.model}),
        el("label", {}, el("input", {type: "checkbox", checked: m.enabled, "aria-label": `${m.model} on`,
          onchange: (e) => attempt(async () => {
            await admin("chains", "set_enabled", {name, model: m.model, enabled: e.target.checked});
            await load();
          }, `${m.model} ${e.target.checked ? "on" : "off"} in ${name}`)}), " on"),
        el("button", {type: "button", class: "up", "aria-label": `move ${m.model} up`, disabled: i === 0,
          onclick: () => move(m.model, i)}, "↑"),
        el("button", {type: "button", class: "down", "aria-label": `move ${m.model} down`,
          disabled: i === chain.models.length - 1, onclick: () => move(m.model, i + 2)}, "↓"));
      li.addEventListener("dragstart", (e) => {
        dragged = m.model;
        e.dataTransfer.effectAllowed = "move";
        e.dataTransfer.setData("text/plain", m.model);
      });
      li.addEventListener("dragover", (e) => { e.preventDefault(); li.classList.add("over"); });
      li.addEventListener("dragleave", () => li.classList.remove("over"));
      li.addEventListener("drop", (e) => {
        e.preventDefault();
        li.classList.remove("over");
        const model = dragged || e.dataTransfer.getData("text/plain");
        dragged = null;
        if (model && model !== m.model) move(model, i + 1);
      });
      list.append(li);
    });
    return el("article", {class: "chain", dataset: {chain: name}},
      el("h3", {}, name, chain.org ? ` (org ${chain.org})` : "", active ? el("span", {class: "badge", text: "active"}) : null),
      list,
      el("p", {class: "actions"},
        ...PRESETS.map((p) => el("button", {type: "button", dataset: {preset: p},
          onclick: () => attempt(async () => { await admin("chains", "preset", {name, preset: p}); await load(); },
            `${name} ordered by ${p}`)}, `Preset: ${p}`)),
        el("label", {}, el("input", {type: "checkbox", class: "backfill", checked: chain.backfill,
          onchange: (e) => attempt(async () => {
            await admin("chains", "set_backfill", {name, backfill: e.target.checked}); await load();
          }, `backfill ${e.target.checked ? "on" : "off"} for ${name}`)}), " backfill"),
        el("button", {type: "button", class: "activate", disabled: active,
          onclick: () => attempt(async () => { await admin("chains", "activate", {name}); await load(); },
            `${name} is the active chain`)}, "Make active"),
        el("button", {type: "button", class: "delete",
          onclick: () => attempt(async () => { await admin("chains", "delete", {name}); await load(); },
            `deleted ${name}`)}, "Delete")));
  };
  const profile = document.getElementById("profile");
  const guard = document.getElementById("guardrails");
  const explore = document.getElementById("exploration");
  const AXES = ["capability", "speed", "reliability"];
  const load = coalesced(async () => {
    const [list, steer] = await Promise.all([admin("chains", "list"), admin("steering", "get")]);
    document.getElementById("active-chain").textContent = list.active_chain || "none (built-in)";
    box.replaceChildren(...list.chains.map((c) => show(c, c.name === list.active_chain)));
    // A form the operator is in (typing, or pressing its button) keeps what they typed: a
    // refresh (the live stream reconnecting, another operator's change) must not undo it.
    if (!editing(profile)) {
      profile.elements.profile.value = steer.profile;
      document.getElementById("weights").replaceChildren(el("legend", {text: "Custom weights"}),
        ...AXES.map((a, i) => el("label", {}, `${a} `, el("input", {name: a, type: "number", step: "0.05",
          min: "0", max: "1", value: String(steer.weights[i])}))));
    }
    if (!editing(guard)) {
      guard.querySelector("fieldset").replaceChildren(el("legend", {text: "Guardrails"}),
        ...Object.entries(steer.guardrails).map(([k, v]) => el("label", {}, `${k} `,
          el("input", {name: k, type: "number", step: "any", value: String(v)}))));
    }
    if (!editing(explore)) explore.elements.exploration.value = steer.exploration;
  });
  profile.addEventListener("submit", (e) => {
    e.preventDefault();
    const p = profile.elements.profile.value;
    const args = {profile: p};
    attempt(async () => {
      if (p === "custom") args.weights = AXES.map((a) => numberIn(profile.elements[a], a));
      await admin("steering", "set_profile", args); await load();
    }, `profile ${p}`);
  });
  guard.addEventListener("submit", (e) => {
    e.preventDefault();
    const args = {};
    attempt(async () => {
      for (const input of guard.querySelectorAll("input")) args[input.name] = numberIn(input, input.name);
      await admin("steering", "set_guardrails", args); await load();
    }, "guardrails saved");
  });
  explore.addEventListener("submit", (e) => {
    e.preventDefault();
    const field = explore.elements.exploration;
    attempt(async () => {
      await admin("steering", "set_exploration", {exploration: numberIn(field, "exploration")});
      await load();
    }, `exploration ${field.value}`);
  });
  document.getElementById("create-chain").addEventListener("submit", (e) => {
    e.preventDefault();
    const f = e.target.elements;
    const models = f.models.value.split(",").map((s) => s.trim()).filter(Boolean);
    attempt(async () => {
      await admin("chains", "create", {name: f.name.value, models, backfill: f.backfill.checked});
      e.target.reset();
      await load();
    }, `created ${f.name.value}`);
  });
  load().then(() => {
    stream(["admin"], followAdmin(["chains", "steering", "config"], load), undefined, load);
    ready();
  });
}

// -- Rules --------------------------------------------------------------------------------

function rules() {
  const box = document.getElementById("rules");
  const globalErr = document.getElementById("rules-error");
  const card = (r) => el("article", {class: "rule"},
    el("label", {}, "Name ", el("input", {name: "name", value: r.name || ""})),
    el("label", {}, "Route ", el("input", {name: "route", value: r.route || "", placeholder: "auto:<chain> or auto:<axis>"})),
    el("label", {class: "when"}, "When (JSON) ", el("textarea", {name: "when", rows: "4",
      value: JSON.stringify(r.when || {}, null, 2)})),
    el("p", {class: "error field-error", role: "alert"}),
    el("p", {class: "actions"},
      el("button", {type: "button", onclick: (e) => { const a = e.target.closest("article"); a.previousElementSibling?.before(a); }}, "↑"),
      el("button", {type: "button", onclick: (e) => { const a = e.target.closest("article"); a.nextElementSibling?.after(a); }}, "↓"),
      el("button", {type: "button", onclick: (e) => e.target.closest("article").remove()}, "Remove")));
  const clear = () => {
    globalErr.textContent = "";
    for (const p of box.querySelectorAll(".field-error")) p.textContent = "";
    for (const f of box.querySelectorAll("[aria-invalid]")) f.removeAttribute("aria-invalid");
  };
  // Show an error at the rule and field its path names (``rules[2].when.x.$regex``).
  const place = (path, message) => {
    if (path && !message.startsWith(path)) message = `${path}: ${message}`;
    globalErr.textContent = message;
    const m = /^rules\[(\d+)\](?:\.(\w+))?/.exec(path || "");
    const target = m && box.children[Number(m[1])];
    if (!target) return;
    const field = target.querySelector(`[name="${m[2] || "name"}"]`) || target.querySelector("[name=when]");
    field.setAttribute("aria-invalid", "true");
    target.querySelector(".field-error").textContent = message;
    target.scrollIntoView({block: "center"});
  };
  const load = async () => {
    const set = await api("GET", "/api/fallback/routing-rules");
    box.replaceChildren(...set.rules.map(card));
  };
  document.getElementById("add-rule").addEventListener("click", () => box.append(card({when: {}})));
  document.getElementById("save-rules").addEventListener("click", async () => {
    clear();
    const set = [];
    for (const [i, a] of [...box.children].entries()) {
      let when;
      try { when = JSON.parse(a.querySelector("[name=when]").value || "{}"); } catch (err) {
        place(`rules[${i}].when`, `not JSON: ${err.message}`);
        return;
      }
      set.push({name: a.querySelector("[name=name]").value, when, route: a.querySelector("[name=route]").value});
    }
    try {
      await api("PUT", "/api/fallback/routing-rules", {rules: set});
      flash(`saved ${set.length} rules`, false);
    } catch (err) {
      place(err.param, err.message);
      flash("the rule set was refused; nothing changed", true);
    }
  });
  document.getElementById("try").addEventListener("submit", async (e) => {
    e.preventDefault();
    const out = document.getElementById("try-result");
    let body;
    try { body = JSON.parse(e.target.elements.body.value); } catch (err) {
      out.replaceChildren(el("p", {class: "error", text: `not JSON: ${err.message}`}));
      return;
    }
    try {
      // Without a key the gateway answers as this session's admin.
      const caller = e.target.elements.caller.value;
      const labels = e.target.elements.labels.value.trim();
      const headers = caller ? {authorization: `Bearer ${caller}`} : {};
      if (labels) headers["x-llmgw-metadata"] = labels;
      const r = await api("POST", "/admin/routing/explain", {path: "/v1/chat/completions", body, headers});
      const t = r.target;
      out.replaceChildren(
        el("p", {class: "verdict"}, "Rule: ", el("strong", {class: "rule-name", text: t.rule || "none matched"}),
          " → model ", el("strong", {class: "model-name", text: r.plan.model}),
          ` (target ${t.kind}${t.chain ? " " + t.chain : ""}${t.axis ? " " + t.axis : ""}, ordering ${t.ordering || "–"}, plan ${r.plan.reason})`),
        el("p", {text: `order: ${(r.order || [r.plan.model]).join(" → ")}`}),
        el("ul", {}, ...(r.rules || []).map((x) => el("li", {text: JSON.stringify(x)}))),
        ...(r.excluded || []).map((x) => el("p", {text: `excluded ${x.model}: ${x.reason}`})));
    } catch (err) {
      out.replaceChildren(el("p", {class: "error", text: `${err.param ? err.param + ": " : ""}${err.message}`}));
    }
  });
  load().then(() => {
    stream(["admin"], (ev) => { if (ev.kind === "admin" && ev.area === "rules" && ev.ok && ev.by !== ME) flash("the rule set changed (reload to see it)", false); });
    ready();
  });
}

// -- Weights and benches ------------------------------------------------------------------

// A backup is never drawn (weight 0 whatever configured); only an override can be restored.
function weightText(r) {
  if (r.fallback_only) return "fallback only (never drawn)";
  return r.overridden ? `${r.weight} (configured ${r.configured_weight})` : `${r.weight}`;
}

// What the operator typed in a table's inputs and has not sent, by row key, and the row whose
// input has the focus: the live redraw (an event, another operator's change) builds new rows,
// and must not put the old value back under their cursor (a click then sent the old one).
function typedIn(tbody, key) {
  const typed = new Map();
  for (const input of tbody.querySelectorAll("tr input")) {
    if (input.value !== input.defaultValue) typed.set(input.closest("tr").dataset[key], input.value);
  }
  const focused = tbody.contains(document.activeElement) ? document.activeElement.closest("tr") : null;
  return {typed, focused: focused ? focused.dataset[key] : null};
}

function keepTyped(input, rowKey, kept) {
  if (kept.typed.has(rowKey)) input.value = kept.typed.get(rowKey);
  if (kept.focused === rowKey) queueMicrotask(() => input.focus());
  return input;
}

function weights() {
  const wBody = document.querySelector("#weights tbody");
  const bBody = document.querySelector("#benches tbody");
  const load = coalesced(async () => {
    const [w, health] = await Promise.all([admin("routing", "weights"), api("GET", "/health/deep")]);
    const kept = typedIn(wBody, "endpoint");
    wBody.replaceChildren(...w.models.flatMap((m) => m.routes.map((r) => {
      const st = health.endpoints[r.endpoint] || {};
      const input = keepTyped(el("input", {type: "number", step: "any", min: "0", value: String(r.weight), "aria-label": `weight of ${r.endpoint}`}), r.endpoint, kept);
      return el("tr", {dataset: {endpoint: r.endpoint}},
        el("td", {text: m.model}), el("td", {text: r.endpoint}), el("td", {text: st.base_url || ""}),
        el("td", {class: "weight", text: weightText(r)}),
        el("td", {class: `circuit ${st.circuit_state}`, text: st.circuit_state || ""}),
        el("td", {}, input,
          el("button", {type: "button", class: "set", onclick: () => attempt(async () => {
            const weight = numberIn(input, `weight of ${r.endpoint}`);
            await admin("routing", "set_weight", {model: m.model, endpoint: r.endpoint, weight});
            await load();
          }, `weight of ${r.endpoint} set`)}, "Override"),
          el("button", {type: "button", class: "restore", disabled: !r.overridden,
            onclick: () => attempt(async () => {
              await admin("routing", "reset_weight", {model: m.model, endpoint: r.endpoint});
              await load();
            }, `weight of ${r.endpoint} restored`)}, "Restore")));
    })));
    bBody.replaceChildren(...Object.entries(health.endpoints).map(([endpoint, st]) => el("tr", {dataset: {endpoint}},
      el("td", {text: endpoint}), el("td", {text: st.model}),
      el("td", {class: "until", text: st.benched_until ? stamp(st.benched_until) : "not benched"}),
      el("td", {}, el("button", {type: "button", class: "lift", disabled: !st.benched_until,
        onclick: () => attempt(async () => { await admin("bench", "lift", {endpoint}); },
          `lift of ${endpoint} requested`)}, "Lift bench")))));
  });
  load().then(() => {
    stream(["admin", "bench", "circuit"], (ev) => {
      if (ev.kind !== "admin" || (ev.ok && ["routing", "bench", "config"].includes(ev.area))) load();
    });
    ready();
  });
}

// -- Keys ---------------------------------------------------------------------------------

function keys() {
  const kBody = document.querySelector("#api-keys tbody");
  const pBody = document.querySelector("#provider-keys tbody");
  const rBody = document.querySelector("#reservations tbody");
  const roles = ["free", "pro", "internal", "admin"];
  const load = coalesced(async () => {
    const [gk, pk] = await Promise.all([api("GET", "/admin/keys"), api("GET", "/admin/provider-keys")]);
    kBody.replaceChildren(...gk.data.map((k) => el("tr", {dataset: {key: k.id, status: k.status}},
      el("td", {text: k.id}), el("td", {text: k.name}), el("td", {text: k.org}), el("td", {text: k.user}),
      el("td", {text: k.role}), el("td", {class: "status", text: k.status}),
      el("td", {}, el("button", {type: "button", class: "revoke", disabled: k.status !== "active",
        onclick: () => attempt(async () => {
          await api("POST", `/admin/keys/${encodeURIComponent(k.id)}/revoke`, {});
          await load();
        }, `revoked ${k.id}`)}, "Revoke")))));
    const roleSelect = (cid, current) => el("select", {"aria-label": `minimum role of ${cid}`,
      onchange: (e) => attempt(async () => {
        await api("POST", "/admin/provider-keys/min-role-env", {credential_id: cid, min_role: e.target.value});
        await load();
      }, `${cid} reserved for ${e.target.value} and above`)},
      ...roles.map((r) => el("option", {selected: r === current, text: r})));
    pBody.replaceChildren(
      ...pk.database.map((k) => el("tr", {dataset: {credential: k.credential_id}},
        el("td", {text: k.credential_id}), el("td", {text: "database"}), el("td", {text: k.endpoint || k.base_url}),
        el("td", {text: k.effective_min_role}),
        el("td", {}, el("button", {type: "button", onclick: () => attempt(async () => {
          await api("DELETE", `/admin/provider-keys/${encodeURIComponent(k.id)}`); await load();
        }, `deleted ${k.credential_id}`)}, "Delete")))),
      ...pk.configured.map((k) => el("tr", {dataset: {credential: k.credential_id}},
        el("td", {text: k.credential_id}), el("td", {text: "config"}), el("td", {text: k.endpoints.join(", ")}),
        el("td", {}, roleSelect(k.credential_id, k.effective_min_role)), el("td"))));
    rBody.replaceChildren(...pk.reservations.map((r) => el("tr", {},
      el("td", {text: r.credential_id}), el("td", {text: r.min_role}),
      el("td", {text: r.configured ? "" : "points at no configured key"}))));
  });
  document.getElementById("create-key").addEventListener("submit", (e) => {
    e.preventDefault();
    const f = e.target.elements;
    const args = {org: f.org.value, user: f.user.value, role: f.role.value};
    if (f.name.value) args.name = f.name.value;
    attempt(async () => {
      const made = await api("POST", "/admin/keys", args);
      document.getElementById("new-key-value").textContent = made.key;
      document.getElementById("new-key").hidden = false;
      e.target.reset();
      await load();
    }, "key created: copy it now, it is not shown again");
  });
  document.getElementById("add-provider-key").addEventListener("submit", (e) => {
    e.preventDefault();
    const f = e.target.elements;
    attempt(async () => {
      await api("POST", "/admin/provider-keys", {key: f.key.value, endpoint: f.endpoint.value, min_role: f.min_role.value});
      e.target.reset();
      await load();
    }, "provider key added");
  });
  load().then(() => {
    stream(["admin"], followAdmin(["api_keys", "provider_keys"], load), undefined, load);
    ready();
  });
}

// -- Request log --------------------------------------------------------------------------

function log() {
  const form = document.getElementById("log-filter");
  const tbody = document.querySelector("#log tbody");
  const epoch = (v) => v ? new Date(v).getTime() / 1000 : undefined;
  const params = new URLSearchParams(location.search);
  for (const [k, v] of params) if (form.elements[k]) form.elements[k].value = v;
  const attempts = async (row, requestId) => {
    const open = row.nextElementSibling;
    if (open && open.classList.contains("attempts")) { open.remove(); return; }
    const got = await admin("log", "query", {kind: "attempt", request_id: requestId, limit: 50});
    row.after(el("tr", {class: "attempts"}, el("td", {colspan: "9"},
      el("table", {}, el("thead", {}, el("tr", {}, ...["#", "Endpoint", "Credential", "Status", "Outcome", "Error", "TTFT", "Latency"].map((h) => el("th", {text: h})))),
        el("tbody", {}, ...rowsOr(got.rows.map((a) => el("tr", {},
          el("td", {text: a.attempt}), el("td", {text: a.endpoint}), el("td", {text: a.credential_id}),
          el("td", {text: a.status ?? ""}), el("td", {text: a.outcome}), el("td", {text: a.error_kind}),
          el("td", {text: ms(a.ttft_ms)}), el("td", {text: ms(a.latency_ms)}))), 8,
          "No upstream attempt: the gateway answered this request itself (refused or no route)."))))));
  };
  const load = async () => {
    const f = form.elements;
    const args = {kind: "request", limit: Number(f.limit.value) || 50};
    if (f.model.value) args.model = f.model.value;
    if (f.status.value) args.status = Number(f.status.value);
    if (f.caller_id.value) args.caller_id = f.caller_id.value;
    if (f.since.value) args.since = epoch(f.since.value);
    if (f.until.value) args.until = epoch(f.until.value);
    const got = await admin("log", "query", args);
    const filtered = ["model", "status", "caller_id", "since", "until"].some((k) => f[k].value);
    tbody.replaceChildren(...rowsOr(got.rows.reverse().map((r) => {
      const tr = el("tr", {class: "request", dataset: {request: r.request_id, status: String(r.status)}, tabindex: "0",
        title: "show attempts"},
        el("td", {text: stamp(r.ts)}), el("td", {text: r.request_id}), el("td", {text: r.caller_id}),
        el("td", {text: r.requested_model}), el("td", {text: r.model}), el("td", {text: r.endpoint}),
        el("td", {class: "status", text: r.status ?? ""}), el("td", {text: r.attempt}), el("td", {text: ms(r.latency_ms)}));
      const toggle = () => attempt(() => attempts(tr, r.request_id));
      tr.addEventListener("click", toggle);
      tr.addEventListener("keydown", (e) => { if (e.key === "Enter") toggle(); });
      return tr;
    }), 9, filtered ? "No request matches these filters." : "No request logged yet."));
    document.body.dataset.rows = String(got.rows.length);
  };
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    for (const input of form.querySelectorAll("input")) if (input.value) q.set(input.name, input.value);
    history.replaceState(null, "", "?" + q);
    delete document.body.dataset.ready;
    attempt(load).then(ready);
  });
  attempt(load).then(ready);
}

// -- Models -------------------------------------------------------------------------------

const AXES = ["capability", "speed", "reliability"];
const num = (v, digits = 3) => v === null || v === undefined ? "–" : Number(v).toFixed(digits);

// The decision of an explain answer as the walk the failover loop would make: each model in
// order, the first with its plan (routes tried in order, routes passed over and why).
function drawWalk(box, r) {
  const t = r.target;
  const plan = r.plan;
  const order = r.order && r.order.length ? r.order : [plan.model];
  box.replaceChildren(
    el("p", {class: "verdict"}, `${r.model_field} → `, el("strong", {class: "target", text: t.kind === "model" ? t.model : `${t.kind} ${t.name || ""}`}),
      t.rule ? ` (rule ${t.rule})` : "", t.ordering ? ` · ordering ${t.ordering}` : "",
      r.exploration ? ` · exploration ${r.exploration}` : "", r.degraded ? " · degraded" : ""),
    el("ol", {class: "walk"}, ...order.map((m, i) => el("li", {dataset: {model: m}},
      el("strong", {text: m}),
      i === 0 ? el("span", {text: ` · plan ${plan.reason}${plan.pinned ? " (pinned)" : ""}`}) : null,
      i === 0 ? el("ol", {class: "routes"}, ...plan.candidates.map((c) => el("li", {dataset: {endpoint: c.endpoint}},
        `${c.endpoint} (${c.kind}, ${c.upstream_model}${c.credential_id ? ", " + c.credential_id : ""})${c.probe ? " · half-open probe" : ""}`))) : null,
      i === 0 && plan.skipped.length ? el("p", {class: "skipped", text: "passed over: " + plan.skipped.map((k) =>
        `${k.endpoint} ${k.reason}${k.until ? " until " + time(k.until) : ""}${k.limit ? ` (limit ${k.limit}, ${k.in_flight} in flight)` : ""}`).join("; ")}) : null))),
    ...(r.excluded || []).map((x) => el("p", {class: "excluded", text: `excluded ${x.model}: ${x.reason}`})),
    ...(r.refused || []).map((x) => el("p", {class: "excluded", text: `refused ${x.model}: ${x.reason} (${x.message})`})));
}

function models() {
  const box = document.getElementById("models");
  const routeRows = (model, health) => Object.entries((health.load || {})[model] || {}).map(([endpoint, load]) => {
    const st = health.endpoints[endpoint] || {};
    const cooling = load.cooling_until && load.cooling_until > Date.now() / 1000;
    const spent = load.rate_limit_until && load.rate_limit_until > Date.now() / 1000;
    return el("tr", {dataset: {endpoint}},
      el("td", {text: endpoint}),
      el("td", {class: "availability", text: st.availability === undefined ? "–" : `${(st.availability * 100).toFixed(1)}%`}),
      el("td", {class: `circuit ${st.circuit_state}`, text: st.circuit_state || "–"}),
      el("td", {text: st.benched_until ? `until ${time(st.benched_until)}${st.bench_reason ? ` (${st.bench_reason})` : ""}` : "–"}),
      el("td", {text: cooling ? `until ${time(load.cooling_until)}` : "–"}),
      el("td", {class: "capacity", text: `${load.in_flight} in flight / ${load.learned_limit === null ? "no limit learned" : `limit ${num(load.learned_limit, 1)} (${load.limit_reason})`}${spent ? ` · rate limit spent until ${time(load.rate_limit_until)}` : ""}`}),
      el("td", {text: `${ms(load.ttft_baseline_ms)} / ${ms(load.ttft_recent_ms)}`}));
  });
  const routewise = (rw) => !rw ? null : el("table", {class: "routewise"},
    el("caption", {text: `RouteWise candidates, priced for ${rw.prompt_tokens} prompt tokens`}),
    el("thead", {}, el("tr", {}, ...["Route", "Effective cost (USD)", "Latency", "Samples", "LP weight", "Excluded"].map((h) => el("th", {text: h})))),
    el("tbody", {}, ...rw.candidates.map((c) => el("tr", {dataset: {endpoint: c.endpoint}},
      el("td", {text: c.endpoint}), el("td", {text: c.effective_cost_usd === null ? "–" : c.effective_cost_usd.toPrecision(3)}),
      el("td", {text: `${ms(c.latency_ms)}${c.profiled ? "" : " (unprofiled)"}`}), el("td", {text: c.samples}),
      el("td", {class: "lp", text: num(c.lp_weight)}), el("td", {text: c.excluded || ""})))));
  const load = coalesced(async () => {
    const [health, steer, ranked] = await Promise.all([
      api("GET", "/health/deep"), admin("steering", "get"),
      // Every enabled catalogue model with its axis scores and multipliers, ranked dry.
      api("POST", "/admin/routing/explain", {body: {model: "auto:smartest", messages: [{role: "user", content: "hi"}]}})
        .catch(() => ({candidates: []})),
    ]);
    const scored = Object.fromEntries(ranked.candidates.map((c) => [c.model, c]));
    const w = steer.profile === "priority" ? null : steer.weights;
    document.getElementById("profile-note").textContent = w
      ? `Profile ${steer.profile}: score = (${AXES.map((a, i) => `${w[i]}·${a}`).join(" + ")}) × allowance × rate limit multipliers.`
      : "Profile priority: chains keep their order; the scores are shown for reference.";
    const ids = [...new Set([...Object.keys(health.load || {}), ...Object.keys(steer.evidence)])].sort();
    box.replaceChildren(...ids.map((id) => {
      const c = scored[id];
      const ev = steer.evidence[id] || {};
      const score = c && w ? AXES.reduce((s, a, i) => s + w[i] * c.scores[a], 0) * c.multipliers.allowance * c.multipliers.rate_limit : null;
      return el("article", {class: "model-card", dataset: {model: id}},
        el("h2", {text: id}),
        el("dl", {class: "scores"},
          ...AXES.flatMap((a) => [el("dt", {text: a}), el("dd", {dataset: {score: a}, text: c ? num(c.scores[a]) : "–"})]),
          el("dt", {text: "allowance ×"}), el("dd", {dataset: {score: "allowance"}, text: num(ev.allowance_multiplier)}),
          el("dt", {text: "rate limit ×"}), el("dd", {dataset: {score: "rate_limit"}, text: num(ev.rate_limit_multiplier)}),
          el("dt", {text: "score"}), el("dd", {dataset: {score: "score"}, text: num(score)})),
        el("p", {class: "evidence", text: `Evidence: ${ev.attempts || 0} attempts, success (EWMA) ${num(ev.reliability)}, TTFT ${ms(ev.ttft_ms)}, ${ev.tokens_per_second ? num(ev.tokens_per_second, 1) : "–"} tokens/s${ev.allowance_used !== null && ev.allowance_used !== undefined ? `, allowance used ${Math.round(ev.allowance_used * 100)}%` : ""}${ev.healthy === false ? ", no route can serve" : ""}`}),
        el("table", {class: "routes"},
          el("thead", {}, el("tr", {}, ...["Route", "Availability", "Circuit", "Bench", "Cooling", "Capacity", "TTFT baseline / recent"].map((h) => el("th", {text: h})))),
          el("tbody", {}, ...routeRows(id, health))),
        routewise((health.routewise || {})[id]));
    }));
  });
  // Evidence moves with every request: re-read at most every 5 s while decisions arrive.
  let last = 0, trailing = 0;
  const soon = () => {
    const wait = last + 5000 - Date.now();
    if (wait <= 0) { last = Date.now(); load(); return; }
    if (!trailing) trailing = setTimeout(() => { trailing = 0; soon(); }, wait);
  };
  document.getElementById("explain").addEventListener("submit", async (e) => {
    e.preventDefault();
    const f = e.target.elements;
    const out = document.getElementById("walk");
    let body;
    try { body = JSON.parse(f.body.value); } catch (err) {
      out.replaceChildren(el("p", {class: "error", text: `not JSON: ${err.message}`}));
      return;
    }
    const headers = f.caller.value ? {authorization: `Bearer ${f.caller.value}`} : {};
    if (f.labels.value.trim()) headers["x-llmgw-metadata"] = f.labels.value.trim();
    try {
      drawWalk(out, await api("POST", "/admin/routing/explain", {path: f.path.value, body, headers}));
    } catch (err) {
      out.replaceChildren(el("p", {class: "error", text: `${err.param ? err.param + ": " : ""}${err.message}`}));
    }
  });
  attempt(load).then(() => {
    last = Date.now();
    stream(["decision", "circuit", "bench", "capacity", "keypool", "admin"], (ev) => {
      if (ev.kind !== "admin" || (ev.ok && ["steering", "routing", "config"].includes(ev.area))) soon();
    });
    ready();
  });
}

// -- Spend and limits ---------------------------------------------------------------------

function spend() {
  const lBody = document.querySelector("#limits tbody");
  const setForm = document.getElementById("set-limit");
  const spendForm = document.getElementById("spend-filter");
  const usd = (v) => `$${v < 0.01 ? v.toPrecision(3) : v.toFixed(2)}`;
  const pct = (r) => `${Math.round(r * 100)}%`;
  const axisCell = (axes, name) => {
    const a = axes.find((x) => x.axis === name);
    if (!a) return el("td", {text: "–"});
    const level = a.ratio >= 1 ? "over" : a.ratio >= 0.8 ? "near" : "";
    if (name !== "budget") return el("td", {class: `usage ${level}`, dataset: {axis: name}, text: `${a.used} / ${a.limit} (${pct(a.ratio)})`});
    const state = a.exhausted ? "exhausted" : a.soft_crossed ? "soft" : "ok";
    return el("td", {class: `usage ${level} budget-${state}`, dataset: {axis: name, state}},
      `${usd(a.used)} / ${usd(a.limit)} per ${a.period} (${pct(a.ratio)})`,
      a.soft_usd !== null ? el("span", {class: "soft", text: ` · soft ${usd(a.soft_usd)}${a.soft_crossed ? " crossed" : ""}`}) : null,
      a.exhausted ? el("strong", {text: " · spent"}) : null);
  };
  const limits = coalesced(async () => {
    const got = await admin("limits", "usage");
    lBody.replaceChildren(...rowsOr(got.subjects.map((s) => el("tr", {dataset: {subject: s.subject}},
      el("td", {text: s.subject}), el("td", {class: "closeness", text: pct(s.closeness)}),
      axisCell(s.axes, "rpm"), axisCell(s.axes, "tpm"), axisCell(s.axes, "concurrency"), axisCell(s.axes, "budget"),
      el("td", {}, el("button", {type: "button", class: "clear", "aria-label": `clear the limit of ${s.subject}`,
        onclick: () => attempt(async () => { await admin("limits", "clear", {subject: s.subject}); await limits(); },
          `limit of ${s.subject} cleared`)}, "Clear")))),
      7, "No key, user, org or role has a limit of its own: set one below."));
  });
  const chart = new TimeChart(document.getElementById("chart-spend"), "USD", new Intervals());
  const report = coalesced(async () => {
    const f = spendForm.elements;
    const args = {group_by: f.group_by.value, per_day: true};
    if (f.since.value) args.since = /^\d+(\.\d+)?$/.test(f.since.value) ? Number(f.since.value) : f.since.value;
    if (f.until.value) args.until = /^\d+(\.\d+)?$/.test(f.until.value) ? Number(f.until.value) : f.until.value;
    const got = await admin("spend", "report", args);
    document.getElementById("spend-total").textContent = `Total ${usd(got.total_usd)} from ${stamp(got.since)} to ${stamp(got.until)}`;
    document.querySelector("#spend tbody").replaceChildren(...got.groups.map((g) => el("tr", {dataset: {group: g[got.group_by]}},
      el("td", {text: g[got.group_by] || "(none)"}), el("td", {text: g.requests}), el("td", {text: g.prompt_tokens}),
      el("td", {text: g.completion_tokens}), el("td", {class: "usd", text: usd(g.cost_usd)}), el("td", {text: g.estimated_requests}))));
    const first = Math.floor(got.since / 86400), last = Math.floor((got.until - 1) / 86400);
    const xs = [];
    for (let d = Math.max(first, last - 365); d <= last; d++) xs.push(d * 86400);
    const names = got.groups.map((g) => g[got.group_by]);
    chart.show(xs, 86400, names.map((n) => ({name: n || "(none)", values: xs.map((x) => {
      const hit = got.days.find((d) => d.day === x && d[got.group_by] === n);
      return hit ? Number(hit.cost_usd.toPrecision(6)) : 0;
    })})));
  });
  setForm.addEventListener("submit", (e) => {
    e.preventDefault();
    const f = setForm.elements;
    const args = {subject: f.subject.value.trim()};
    for (const k of ["rpm", "tpm", "concurrency"]) if (f[k].value) args[k] = Number(f[k].value);
    if (f.budget_usd.value) { args.budget_usd = Number(f.budget_usd.value); args.budget_period = f.budget_period.value; }
    if (f.soft_fraction.value) args.soft_fraction = Number(f.soft_fraction.value);
    attempt(async () => { await admin("limits", "set", args); await limits(); }, `limit of ${args.subject} set`);
  });
  spendForm.addEventListener("submit", (e) => { e.preventDefault(); attempt(report); });
  Promise.all([attempt(limits), attempt(report)]).then(() => {
    // A budget crossing, a limit changed anywhere, a lease released: read the usage again.
    stream(["budget", "limits", "admin"], (ev) => {
      if (ev.kind !== "admin" || (ev.ok && ev.area === "limits")) limits();
      if (ev.kind === "budget") report();
    });
    // Requests, tokens and concurrency move with every request and the per-minute windows
    // slide on their own; no event says so (a subject refused at its rpm is none either):
    // without this the table showed 50% of the rpm while the key was being refused.
    setInterval(() => { if (!document.hidden) limits(); }, USAGE_MS);
    ready();
  });
}

// -- Replay reports -----------------------------------------------------------------------

function reports() {
  const pick = document.getElementById("report-pick");
  const note = document.getElementById("reports-note");
  const secs = (v) => v === null || v === undefined ? "–" : `${v.toFixed(3)} s`;
  const usd = (v) => v === null || v === undefined ? "–" : v.toFixed(4);
  const files = (name) => `/dashboard/report-files/${encodeURIComponent(name)}/`;
  // The table of ``report.json`` (the columns of its report.md), and the plots beside it.
  const show = (title, report, plots) => {
    document.getElementById("report").hidden = false;
    document.getElementById("report-title").textContent = title;
    document.getElementById("report-meta").textContent =
      `seed ${report.seed} · ${Object.keys(report.configs).length} configs`;
    const rows = Object.entries(report.configs).map(([name, c]) => el("tr", {dataset: {config: name}},
      el("td", {text: name}), el("td", {class: "served", text: `${(100 * c.served_share).toFixed(1)} %`}),
      el("td", {text: Object.entries(c.errors).map(([k, v]) => `${k}: ${v}`).join(", ") || "none"}),
      el("td", {class: "ttft", text: secs(c.ttft_mean)}), el("td", {text: secs(c.ttft_p50)}),
      el("td", {text: secs(c.ttft_p99)}), el("td", {text: c.slo_violations}),
      el("td", {class: "cost", text: usd(c.cost_usd)}), el("td", {text: c.attempts_per_request.toFixed(2)}),
      el("td", {text: c.rate_limited_attempts}), el("td", {text: c.transitions["bench:benched"] || 0}),
      el("td", {text: c.transitions["circuit:open"] || 0})));
    const o = report.oracle || {};
    rows.push(el("tr", {class: "oracle"}, el("td", {}, el("em", {text: "oracle"})), el("td", {text: "100.0 %"}),
      el("td"), el("td", {text: secs(o.ttft_mean)}), el("td"), el("td"), el("td"),
      el("td", {text: usd(o.cost_usd)}), el("td"), el("td"), el("td"), el("td")));
    document.querySelector("#report-table tbody").replaceChildren(...rows);
    document.getElementById("report-plots").replaceChildren(...plots.map(([name, url]) =>
      el("figure", {}, el("img", {src: url, alt: `plot ${name}`, loading: "lazy"}), el("figcaption", {text: name}))));
  };
  const open = async (entry) => {
    const resp = await fetch(files(entry.name) + "report.json", {credentials: "same-origin"});
    if (!resp.ok) throw new Error(`report ${entry.name}: HTTP ${resp.status}`);
    const pngs = entry.files.filter((f) => f.endsWith(".png"));
    show(entry.name, await resp.json(), pngs.map((f) => [f, files(entry.name) + encodeURIComponent(f)]));
    document.getElementById("report-files").replaceChildren("Files: ", ...entry.files.flatMap((f, i) =>
      [i ? ", " : "", el("a", {href: files(entry.name) + encodeURIComponent(f), text: f})]));
  };
  document.getElementById("report-upload").addEventListener("change", (e) => {
    const file = e.target.files[0];
    if (!file) return;
    attempt(async () => {
      let report;
      try { report = JSON.parse(await file.text()); } catch (err) { throw new Error(`${file.name}: not JSON`); }
      if (!report || typeof report.configs !== "object") throw new Error(`${file.name}: not a replay report.json`);
      show(file.name, report, []);
      document.getElementById("report-files").textContent = "Opened from this computer: no plots.";
    }, `opened ${file.name}`);
  });
  attempt(async () => {
    const got = await api("GET", "/reports");
    if (!got.configured) note.textContent = "No reports folder configured (dashboard.reports_dir): open a report.json instead.";
    else if (!got.reports.length) note.textContent = "The reports folder holds no report yet.";
    pick.replaceChildren(...got.reports.map((r) => el("option", {value: r.name, text: `${r.name} (${stamp(r.modified)})`})));
    pick.disabled = !got.reports.length;
    pick.addEventListener("change", () => attempt(() => open(got.reports.find((r) => r.name === pick.value))));
    if (got.reports.length) await open(got.reports[0]);
  }).then(ready);
}

const PAGES = {overview, events, chains, models, rules, weights, keys, spend, log, reports};
const run = PAGES[document.body.dataset.page];
if (run) Promise.resolve(run()).catch((err) => flash(err.message, true));
