// The jetwake dashboard: draws the view the address names from the member's JSON API (/api/)
// and refreshes it once a second. Plain DOM, no library: every element is built with h() or
// svg(), so nothing the member reports is ever parsed as HTML.
"use strict";

const TOKEN_KEY = "jetwake_token";
const TOKEN_HEADER = "X-Jetwake-Token";
const REFRESH_MS = 1000;

// ---- small helpers ------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const SVG_NS = "http://www.w3.org/2000/svg";
function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "text") el.textContent = v; else el.setAttribute(k, v);
  }
  for (const c of children.flat()) if (c) el.append(c);
  return el;
}

function fmtRate(v) {
  if (v === null || v === undefined) return "–";
  if (v >= 10000) return (v / 1000).toFixed(1) + " k/s";
  return (Math.round(v * 10) / 10).toFixed(1) + "/s";
}
function fmtCount(v) { return v === null || v === undefined ? "–" : v.toLocaleString("en"); }
function fmtBytes(b) {
  if (b === null || b === undefined) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
  return (i ? b.toFixed(1) : b) + " " + units[i];
}
function fmtAge(s) {
  if (s === null || s === undefined) return "never";
  if (s < 60) return Math.round(s) + " s ago";
  if (s < 3600) return Math.round(s / 60) + " min ago";
  return (s / 3600).toFixed(1) + " h ago";
}
function fmtMs(ms) {
  if (ms === null || ms === undefined) return "–";
  if (ms < 1000) return Math.round(ms) + " ms";
  return (ms / 1000).toFixed(1) + " s";
}
function fmtTime(epoch) {
  return epoch ? new Date(epoch * 1000).toLocaleString("en-GB") : "–";
}
function statusBadge(status, id) {
  return h("span", {class: "status status-" + String(status).toLowerCase(), id: id},
           status);
}

// ---- the token ----------------------------------------------------------------------------

function token() { return sessionStorage.getItem(TOKEN_KEY); }

function setToken(value) {
  if (value) {
    sessionStorage.setItem(TOKEN_KEY, value);
    // pages are loaded without custom headers: with --ui-auth required they read this cookie
    // (kept for the browser session, sent only to this server)
    document.cookie = "jetwake_token=" + encodeURIComponent(value) +
      "; path=/; SameSite=Strict";
  } else {
    sessionStorage.removeItem(TOKEN_KEY);
    document.cookie = "jetwake_token=; path=/; max-age=0; SameSite=Strict";
  }
  checkSession();
}

async function checkSession() {
  const state = document.getElementById("auth-state");
  try {
    const s = await api("/api/session");
    state.textContent = !token() ? "no token" :
      s.authorized ? "token accepted" : "token not accepted";
    state.className = token() && !s.authorized ? "bad" : "muted";
    return s;
  } catch (e) {
    return null;
  }
}

function askToken(why) {
  return new Promise((resolve) => {
    const dlg = document.getElementById("token-dialog");
    const input = document.getElementById("token-input");
    if (why) document.getElementById("token-why").textContent = why;
    input.value = token() || "";
    const done = (value) => {
      cleanup();
      dlg.close();
      resolve(value);
    };
    const save = () => { setToken(input.value.trim()); done(input.value.trim()); };
    const forget = () => { setToken(null); done(null); };
    const cancel = () => done(undefined);
    const key = (ev) => { if (ev.key === "Enter") { ev.preventDefault(); save(); } };
    const ids = {"token-save": save, "token-forget": forget, "token-cancel": cancel};
    function cleanup() {
      for (const [id, fn] of Object.entries(ids))
        document.getElementById(id).removeEventListener("click", fn);
      input.removeEventListener("keydown", key);
      dlg.removeEventListener("cancel", cancel);
    }
    for (const [id, fn] of Object.entries(ids))
      document.getElementById(id).addEventListener("click", fn);
    input.addEventListener("keydown", key);
    dlg.addEventListener("cancel", cancel);
    dlg.showModal();
    input.focus();
  });
}

function confirmAction(title, text, askName) {
  return new Promise((resolve) => {
    const dlg = document.getElementById("confirm-dialog");
    document.getElementById("confirm-title").textContent = title;
    document.getElementById("confirm-text").textContent = text;
    const label = document.getElementById("confirm-name-label");
    const name = document.getElementById("confirm-name");
    label.hidden = !askName;
    name.value = askName || "";
    const ok = document.getElementById("confirm-ok");
    const no = document.getElementById("confirm-cancel");
    const finish = (value) => {
      ok.removeEventListener("click", yes);
      no.removeEventListener("click", nope);
      dlg.removeEventListener("cancel", nope);
      dlg.close();
      resolve(value);
    };
    const yes = () => finish(askName ? name.value.trim() : true);
    const nope = () => finish(null);
    ok.addEventListener("click", yes);
    no.addEventListener("click", nope);
    dlg.addEventListener("cancel", nope);
    ok.textContent = title.split(" ")[0];
    dlg.showModal();
    (askName ? name : ok).focus();
  });
}

// ---- the API ------------------------------------------------------------------------------

class ApiFailure extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path, options) {
  const opts = Object.assign({headers: {}}, options || {});
  const t = token();
  if (t) opts.headers[TOKEN_HEADER] = t;
  const r = await fetch(path, opts);
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  if (!r.ok) {
    throw new ApiFailure(r.status, body && body.message ? body.message : r.statusText);
  }
  return body;
}

function notice(text, kind) {
  const n = document.getElementById("notice");
  n.textContent = text;
  n.className = "notice " + (kind || "info");
  n.hidden = !text;
}

async function runAction(label, method, path, body) {
  if (!token()) {
    const t = await askToken("This action needs the member's token (the one it was started " +
                             "with, --token). It is kept for this browser session only.");
    if (!t) return;
  }
  try {
    const opts = {method: method, headers: {"Content-Type": "application/json"}};
    if (body) opts.body = JSON.stringify(body);
    await api(path, opts);
    notice(label + ": requested", "info");
  } catch (e) {
    notice(label + " failed (" + e.status + "): " + e.message, "error");
  }
  refresh();
}

// ---- views --------------------------------------------------------------------------------

function sparkline(points, cls) {
  // points: [[time, in, out], ...]; two lines, in and out, scaled to the larger
  const w = 120, hgt = 28;
  const el = svg("svg", {class: "spark " + (cls || ""), width: w, height: hgt,
                         viewBox: `0 0 ${w} ${hgt}`, role: "img"});
  if (!points || points.length < 2) return el;
  const max = Math.max(1, ...points.map((p) => Math.max(p[1], p[2])));
  const line = (idx) => points.map((p, i) =>
    `${(i / (points.length - 1) * w).toFixed(1)},${(hgt - 2 - p[idx] / max * (hgt - 4)).toFixed(1)}`
  ).join(" ");
  el.append(svg("polyline", {points: line(1), class: "spark-in"}),
            svg("polyline", {points: line(2), class: "spark-out"}));
  return el;
}

const views = {};

views.jobs = {
  title: "Jobs",
  async load() { return api("/api/jobs"); },
  render(jobs) {
    if (!jobs.length) {
      return h("section", {}, h("h1", {text: "Jobs"}),
               h("p", {class: "muted", id: "no-jobs"},
                 "No jobs yet. Submit one with `jetwake submit FILE.py` or a Client: the " +
                 "dashboard shows jobs and acts on them, it does not submit them."));
    }
    const rows = jobs.map((j) => h("tr", {"data-job-id": j.id, "data-job-name": j.name},
      h("td", {}, h("a", {href: "/jobs/" + encodeURIComponent(j.id), class: "job-link"},
                    j.name), j.light ? h("span", {class: "tag", title: "a light job: no " +
                    "snapshots, coordinated by the member it was submitted to"}, "light") : null),
      h("td", {class: "status-cell"}, statusBadge(j.status)),
      h("td", {class: "muted"}, j.submitted || "–"),
      h("td", {}, j.guarantee),
      h("td", {class: "num rate-in"}, fmtRate(j.in_per_s)),
      h("td", {class: "num rate-out"}, fmtRate(j.out_per_s)),
      h("td", {}, sparkline(j.history)),
      h("td", {class: "muted"}, j.guarantee === "none" ? "no snapshots" :
                                 fmtAge(j.last_snapshot_age_s))));
    return h("section", {}, h("h1", {text: "Jobs"}),
      h("table", {id: "jobs", class: "grid"},
        h("thead", {}, h("tr", {}, ["Name", "Status", "Submitted", "Guarantee", "In",
                                    "Out", "Last 2 min (in / out)", "Last snapshot"]
          .map((t) => h("th", {text: t})))),
        h("tbody", {}, rows)));
  },
};

views.cluster = {
  title: "Cluster",
  async load() { return api("/api/cluster"); },
  render(c) {
    const rows = c.members.map((m) => h("tr", {"data-member-id": m.id},
      h("td", {}, String(m.id)), h("td", {}, m.address || "–"),
      h("td", {}, m.coordinator ? "yes" : ""), h("td", {}, statusBadge(m.state || "–")),
      h("td", {class: "num"}, m.jobs === null || m.jobs === undefined ? "–" :
                              String(typeof m.jobs === "object" ?
                                     Object.values(m.jobs).reduce((a, b) => a + b, 0) : m.jobs)),
      h("td", {class: "num"}, fmtBytes(m.rss_bytes)),
      h("td", {class: "num"}, m.cpu_percent === null || m.cpu_percent === undefined ? "–" :
                              m.cpu_percent.toFixed(1) + " %"),
      h("td", {class: "num muted"}, m.pid || "–")));
    return h("section", {},
      h("h1", {text: "Cluster " + (c.name ? "'" + c.name + "'" : "(a single member)")}),
      h("dl", {class: "facts"},
        h("dt", {text: "State"}), h("dd", {}, statusBadge(c.state, "cluster-state")),
        h("dt", {text: "Coordinator"}), h("dd", {text: String(c.coordinator)}),
        h("dt", {text: "Members"}), h("dd", {text: String(c.members.length)}),
        h("dt", {text: "Quorum"}), h("dd", {text: String(c.quorum)}),
        h("dt", {text: "Version"}), h("dd", {text: c.version})),
      h("table", {id: "members", class: "grid"},
        h("thead", {}, h("tr", {}, ["Member", "Address", "Coordinator", "State", "Jobs",
                                    "Memory", "CPU", "PID"].map((t) => h("th", {text: t})))),
        h("tbody", {}, rows)));
  },
};

views.snapshots = {
  title: "Snapshots",
  async load() { return api("/api/snapshots"); },
  render(snaps) {
    const del = (s) => async () => {
      const ok = await confirmAction("Delete snapshot '" + s.name + "'?",
        "The exported snapshot is removed from the member's data directory; jobs can no " +
        "longer start from it.");
      if (ok) runAction("delete snapshot '" + s.name + "'", "DELETE",
                        "/api/snapshots/" + encodeURIComponent(s.name));
    };
    const rows = snaps.map((s) => h("tr", {"data-snapshot": s.name},
      h("td", {}, s.name), h("td", {}, s.job_name), h("td", {class: "num"}, s.snapshot_id),
      h("td", {class: "num"}, fmtBytes(s.size_bytes)), h("td", {class: "num"},
      fmtCount(s.entries)), h("td", {}, fmtTime(s.created)),
      h("td", {}, h("button", {type: "button", class: "danger", onclick: del(s)}, "Delete"))));
    return h("section", {}, h("h1", {text: "Exported snapshots"}),
      snaps.length ? h("table", {id: "snapshots", class: "grid"},
        h("thead", {}, h("tr", {}, ["Name", "Job", "Snapshot", "Size", "Entries", "Created",
                                    ""].map((t) => h("th", {text: t})))),
        h("tbody", {}, rows))
      : h("p", {class: "muted"}, "No exported snapshots. Export one from a job's page or " +
          "with `jetwake save-snapshot`."));
  },
};

function dagPicture(dag) {
  // layers by the longest path from a source; vertices of a layer stacked
  const depth = {};
  for (const v of dag.vertices) depth[v.name] = 0;
  for (let changed = true, n = 0; changed && n < dag.vertices.length; n++) {
    changed = false;
    for (const e of dag.edges) {
      if (depth[e.to] < depth[e.from] + 1) { depth[e.to] = depth[e.from] + 1; changed = true; }
    }
  }
  const layers = [];
  for (const v of dag.vertices) (layers[depth[v.name]] = layers[depth[v.name]] || []).push(v);
  const BW = 180, BH = 84, GX = 110, GY = 26, PAD = 12;
  const pos = {};
  const tallest = Math.max(...layers.map((l) => l.length));
  layers.forEach((layer, x) => layer.forEach((v, y) => {
    const offset = (tallest - layer.length) * (BH + GY) / 2;
    pos[v.name] = {x: PAD + x * (BW + GX), y: PAD + offset + y * (BH + GY)};
  }));
  const width = PAD * 2 + layers.length * BW + (layers.length - 1) * GX;
  const height = PAD * 2 + tallest * BH + (tallest - 1) * GY;
  const pic = svg("svg", {id: "dag", width: width, height: height,
                          viewBox: `0 0 ${width} ${height}`, role: "img"});
  pic.append(svg("defs", {}, svg("marker", {id: "arrow", viewBox: "0 0 10 10", refX: 10,
    refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse"},
    svg("path", {d: "M 0 0 L 10 5 L 0 10 z", class: "arrow-head"}))));
  for (const e of dag.edges) {
    const a = pos[e.from], b = pos[e.to];
    const x1 = a.x + BW, y1 = a.y + BH / 2, x2 = b.x, y2 = b.y + BH / 2;
    const mx = (x1 + x2) / 2;
    const kind = e.routing.replace(/_/g, "-") + (e.distributed ? " · dist." : "");
    pic.append(svg("g", {class: "edge" + (e.distributed ? " distributed" : ""),
                         "data-from": e.from, "data-to": e.to},
      svg("path", {d: `M ${x1} ${y1} C ${mx} ${y1}, ${mx} ${y2}, ${x2} ${y2}`,
                   "marker-end": "url(#arrow)"}),
      svg("text", {x: mx, y: (y1 + y2) / 2 - 6, "text-anchor": "middle", class: "edge-label",
                   text: kind})));
  }
  for (const v of dag.vertices) {
    const p = pos[v.name];
    const fill = Math.min(1, v.queue_fill || 0);
    const g = svg("g", {class: "vertex", "data-vertex": v.name,
                        transform: `translate(${p.x},${p.y})`},
      svg("title", {text: `${v.name}: ${v.processors} processor(s) running, ` +
                          `local parallelism ${v.local_parallelism}`}),
      svg("rect", {width: BW, height: BH, rx: 8, class: "vertex-box"}),
      svg("text", {x: 10, y: 20, class: "vertex-name",
                   text: v.name.length > 16 ? v.name.slice(0, 15) + "…" : v.name}),
      svg("text", {x: BW - 10, y: 20, "text-anchor": "end", class: "vertex-lp",
                   text: "×" + v.local_parallelism}),
      svg("text", {x: 10, y: 42, class: "vertex-rates",
                   text: `in ${fmtRate(v.in_per_s)} · out ${fmtRate(v.out_per_s)}`}),
      svg("text", {x: 10, y: 60, class: "vertex-extra",
                   text: v.watermark_lag_ms !== null ? `wm lag ${fmtMs(v.watermark_lag_ms)}`
                     : "no watermark"}),
      svg("rect", {x: 10, y: 68, width: BW - 20, height: 6, rx: 3, class: "fill-bg"}),
      svg("rect", {x: 10, y: 68, width: Math.max(0, (BW - 20) * fill), height: 6, rx: 3,
                   class: "fill-bar" + (fill > 0.8 ? " full" : "")}));
    pic.append(g);
  }
  return pic;
}

views.job = {
  title: "Job",
  async load(id) { return api("/api/jobs/" + encodeURIComponent(id)); },
  render(j) {
    document.title = j.name + " · jetwake";
    const path = "/api/jobs/" + encodeURIComponent(j.id) + "/";
    const act = (action, title, text) => async () => {
      const ok = await confirmAction(title, text);
      if (ok) runAction(action + " '" + j.name + "'", "POST", path + action);
    };
    const exportSnapshot = async () => {
      const name = await confirmAction("Export a snapshot of '" + j.name + "'",
        "Takes a snapshot now and keeps it under this name (a job can start from it).",
        j.name + "-" + new Date().toISOString().slice(0, 19).replace(/[:T]/g, "-"));
      if (name) runAction("export snapshot '" + name + "'", "POST", path + "export-snapshot",
                          {name: name});
    };
    const running = j.status === "RUNNING", suspended = j.status === "SUSPENDED";
    const ended = j.status === "COMPLETED" || j.status === "FAILED";
    const snapshots = j.guarantee !== "none";
    const actions = h("div", {class: "actions"},
      h("button", {type: "button", id: "action-suspend", disabled: !running, onclick: act("suspend", "Suspend '" + j.name + "'?",
        "The job takes a terminal snapshot and stops; resume starts it from there.")},
        "Suspend"),
      h("button", {type: "button", id: "action-resume", disabled: !suspended,
                   onclick: act("resume", "Resume '" + j.name + "'?",
        "The job starts again from its last snapshot.")}, "Resume"),
      h("button", {type: "button", id: "action-restart", disabled: !running,
                   onclick: act("restart", "Restart '" + j.name + "'?",
        "The execution stops and starts again from the last snapshot.")}, "Restart"),
      h("button", {type: "button", id: "action-export", disabled: !(running && snapshots || suspended),
                   onclick: exportSnapshot}, "Export snapshot"),
      h("button", {type: "button", id: "action-cancel", class: "danger", disabled: ended,
                   onclick: act("cancel", "Cancel '" + j.name + "'?",
        "The job stops for good and its snapshots are deleted (exported ones stay).")},
        "Cancel"));
    const vrows = j.dag.vertices.map((v) => h("tr", {"data-vertex": v.name},
      h("td", {}, v.name), h("td", {class: "num"}, v.local_parallelism),
      h("td", {class: "num items-in"}, fmtCount(v.items_in)),
      h("td", {class: "num items-out"}, fmtCount(v.items_out)),
      h("td", {class: "num rate-in"}, fmtRate(v.in_per_s)),
      h("td", {class: "num rate-out"}, fmtRate(v.out_per_s)),
      h("td", {class: "num"}, Math.round(v.queue_fill * 100) + " %"),
      h("td", {class: "num"}, v.watermark ? new Date(v.watermark).toISOString()
        .slice(11, 23) : "–"),
      h("td", {class: "num"}, fmtMs(v.watermark_lag_ms)),
      h("td", {class: "num"}, fmtCount(v.late_events)),
      h("td", {class: "num"}, fmtCount(v.dead_letters))));
    // the stages that call a service (map_using_service): calls, in flight, latency
    const callers = j.dag.vertices.filter((v) => v.counters && v.counters.calls !== undefined);
    const services = callers.length ? h("table", {id: "service-calls", class: "grid"},
      h("thead", {}, h("tr", {}, ["Vertex", "Calls", "In flight", "Retries", "Failures",
        "Latency p50", "p95", "p99"].map((t) => h("th", {text: t})))),
      h("tbody", {}, callers.map((v) => h("tr", {"data-vertex": v.name},
        h("td", {}, v.name), h("td", {class: "num"}, fmtCount(v.counters.calls)),
        h("td", {class: "num"}, fmtCount(v.counters.calls_in_flight)),
        h("td", {class: "num"}, fmtCount(v.counters.call_retries)),
        h("td", {class: "num"}, fmtCount(v.counters.call_failures)),
        h("td", {class: "num"}, fmtMs(v.counters.call_latency_p50_ms ?? null)),
        h("td", {class: "num"}, fmtMs(v.counters.call_latency_p95_ms ?? null)),
        h("td", {class: "num"}, fmtMs(v.counters.call_latency_p99_ms ?? null))))))
      : null;
    // the stages that keep a table (join_table) or the state of a join of two streams
    // (join_interval, join_asof): its size now and what it did
    const keepers = j.dag.vertices.filter((v) => v.counters &&
      (v.counters.table_entries !== undefined || v.counters.join_state_entries !== undefined));
    const count = (v, k) => fmtCount(v.counters[k] ?? null);
    const joins = keepers.length ? h("table", {id: "join-state", class: "grid"},
      h("thead", {}, h("tr", {}, ["Vertex", "Table entries", "Hits", "Misses", "Updates",
        "Deletes", "Join state entries", "Pairs", "Evicted"].map((t) => h("th", {text: t})))),
      h("tbody", {}, keepers.map((v) => h("tr", {"data-vertex": v.name},
        h("td", {}, v.name), ...["table_entries", "table_hits", "table_misses",
          "table_updates", "table_deletes", "join_state_entries", "join_pairs",
          "join_evicted_entries"].map((k) => h("td", {class: "num"}, count(v, k)))))))
      : null;
    const kafka = j.kafka_lag.length ? h("table", {id: "kafka-lag", class: "grid"},
      h("thead", {}, h("tr", {}, ["Vertex", "Topic", "Partition", "Position", "End", "Lag"]
        .map((t) => h("th", {text: t})))),
      h("tbody", {}, j.kafka_lag.map((p) => h("tr", {},
        h("td", {}, p.vertex), h("td", {}, p.topic), h("td", {class: "num"}, p.partition),
        h("td", {class: "num"}, fmtCount(p.position)), h("td", {class: "num"}, fmtCount(p.end)),
        h("td", {class: "num lag"}, fmtCount(p.lag))))))
      : h("p", {class: "muted"}, "No Kafka source is reading now.");
    const snaps = j.snapshots.length ? h("table", {id: "snapshot-history", class: "grid"},
      h("thead", {}, h("tr", {}, ["Id", "Started", "Duration", "Size", "Entries",
                                  "Phase reached", "Outcome", "Failure"]
        .map((t) => h("th", {text: t})))),
      h("tbody", {}, j.snapshots.map((s) => h("tr", {class: "outcome-" + s.outcome
                                                        .replace(" ", "-")},
        h("td", {class: "num"}, s.id === null ? "–" : s.id + (s.terminal ? " (terminal)" : "")),
        h("td", {}, fmtTime(s.started)), h("td", {class: "num"}, fmtMs(s.duration_ms)),
        h("td", {class: "num"}, fmtBytes(s.size_bytes)),
        h("td", {class: "num"}, fmtCount(s.entries)), h("td", {}, s.phase),
        h("td", {}, s.outcome), h("td", {class: "failure"}, s.failure || "")))))
      : h("p", {class: "muted"}, snapshots ? "No snapshot taken yet by this coordinator." :
          "The job's guarantee is 'none': it takes no snapshots.");
    const error = j.error ? h("section", {class: "error", id: "job-error"},
      h("h2", {text: "Error"}), h("p", {}, (j.error.type ? j.error.type + ": " : "") +
                                  j.error.message),
      j.error.traceback ? h("pre", {}, j.error.traceback) : null) : null;
    const config = h("table", {id: "config", class: "grid narrow"},
      h("tbody", {}, Object.entries(j.config).map(([k, v]) => h("tr", {},
        h("th", {text: k}), h("td", {}, typeof v === "object" ? JSON.stringify(v) :
                                          String(v))))));
    return h("section", {},
      h("div", {class: "title"}, h("h1", {id: "job-name"}, j.name),
        statusBadge(j.status, "job-status"),
        j.light ? h("span", {class: "tag"}, "light") : null),
      h("dl", {class: "facts"},
        h("dt", {text: "Id"}), h("dd", {}, j.id),
        h("dt", {text: "Submitted"}), h("dd", {}, j.submitted || "–"),
        h("dt", {text: "Guarantee"}), h("dd", {}, j.guarantee),
        h("dt", {text: "In / out"}), h("dd", {id: "job-rates"},
          fmtRate(j.throughput.in_per_s) + " / " + fmtRate(j.throughput.out_per_s)),
        h("dt", {text: "Restarts"}), h("dd", {}, String(j.restart_count)),
        h("dt", {text: "Last snapshot"}), h("dd", {}, snapshots ?
          (j.last_snapshot ? "#" + j.last_snapshot.snapshot_id + ", " +
           fmtAge(j.last_snapshot_age_s) : "none yet") +
          (j.snapshot_failures ? ` (${j.snapshot_failures} failed)` : "") : "no snapshots")),
      actions, error,
      h("h2", {text: "Graph"}),
      h("div", {class: "dag-wrap"}, dagPicture(j.dag)),
      h("table", {id: "vertices", class: "grid"},
        h("thead", {}, h("tr", {}, ["Vertex", "Parallelism", "Items in", "Items out",
          "In", "Out", "Queue fill", "Watermark", "Watermark lag", "Late", "Dead letters"]
          .map((t) => h("th", {text: t})))),
        h("tbody", {}, vrows)),
      services ? h("h2", {text: "Service calls"}) : null, services,
      joins ? h("h2", {text: "Tables and joins"}) : null, joins,
      stateSection(j),
      h("h2", {text: "Kafka consumer lag"}), kafka,
      h("h2", {text: "Snapshots"}), snaps,
      h("h2", {text: "Configuration"}), config);
  },
};

// ---- the job's state (job.state) ----------------------------------------------------------

// what the state lookup shows; kept across the page's refreshes
const lookup = {job: null, stage: null, key: "", latest: false, result: null, error: null};

function lookupText(r) {
  const where = r.consistency === "latest" ? "live state" : "snapshot #" + r.snapshot_id;
  if (r.key !== null && !r.entries.length) return `${r.key}: no state (${where})`;
  const head = r.key === null ? `${r.count} keys (${where}), the first ${r.entries.length}:\n`
                              : `(${where})\n`;
  return head + r.entries.map((e) => e.text).join("\n");
}

async function lookUp(jobId) {
  const path = "/api/jobs/" + encodeURIComponent(jobId) + "/state/" +
    encodeURIComponent(lookup.stage) + "/" + (lookup.latest ? "latest" : "snapshot") +
    (lookup.key !== "" ? "/" + encodeURIComponent(lookup.key) : "");
  try {
    lookup.result = lookupText(await api(path));
    lookup.error = null;
  } catch (e) {
    lookup.result = null;
    lookup.error = e.message;
  }
  if (document.activeElement) document.activeElement.blur();
  refresh();
}

// the stateful stages with their keys and bytes in the last committed snapshot, and a form
// that looks a key up (or lists the first keys) in the snapshot or in the live state
function stateSection(j) {
  if (!j.state || !j.state.length) return null;
  if (lookup.job !== j.id) Object.assign(lookup, {job: j.id, stage: null, key: "",
                                                  result: null, error: null});
  if (!j.state.some((s) => s.stage === lookup.stage)) lookup.stage = j.state[0].stage;
  const stages = h("table", {id: "state-stages", class: "grid"},
    h("thead", {}, h("tr", {}, ["Stage", "Kind", "Keys", "Bytes", "Snapshot"]
      .map((t) => h("th", {text: t})))),
    h("tbody", {}, j.state.map((s) => h("tr", {"data-stage": s.stage},
      h("td", {}, s.stage), h("td", {}, s.description),
      h("td", {class: "num"}, fmtCount(s.keys)),
      h("td", {class: "num"}, s.bytes === null ? "–" : fmtBytes(s.bytes)),
      h("td", {class: "num"}, s.snapshot_id === null ? "none yet" : "#" + s.snapshot_id)))));
  const form = h("form", {id: "state-lookup", class: "lookup", onsubmit: (e) => {
      e.preventDefault(); lookUp(j.id); }},
    h("select", {id: "state-stage", onchange: (e) => { lookup.stage = e.target.value; }},
      j.state.map((s) => h("option", {value: s.stage, selected: s.stage === lookup.stage},
                           s.stage))),
    h("input", {id: "state-key", type: "text", value: lookup.key, size: 28,
                placeholder: 'key: 42, "42", ["eu", 1]; empty: list keys',
                oninput: (e) => { lookup.key = e.target.value; }}),
    h("label", {}, h("input", {id: "state-latest", type: "checkbox", checked: lookup.latest,
                               onchange: (e) => { lookup.latest = e.target.checked; }}),
      " live"),
    h("button", {type: "submit", id: "state-lookup-button"}, "Look up"));
  const result = lookup.error !== null ? h("p", {id: "state-result", class: "error"},
                                            lookup.error)
    : lookup.result !== null ? h("pre", {id: "state-result"}, lookup.result) : null;
  return h("section", {id: "state"}, h("h2", {text: "State"}), stages, form, result);
}

// ---- the page -----------------------------------------------------------------------------

function route() {
  const path = location.pathname.replace(/\/+$/, "") || "/";
  const m = path.match(/^\/jobs\/([^/]+)$/);
  if (m) return {view: views.job, arg: decodeURIComponent(m[1]), nav: "jobs"};
  if (path === "/cluster") return {view: views.cluster, nav: "cluster"};
  if (path === "/snapshots") return {view: views.snapshots, nav: "snapshots"};
  return {view: views.jobs, nav: "jobs"};
}

let current = null;
let busy = false;
let failures = 0;

async function refresh() {
  if (busy || !current) return;
  // a dialog is open: the view stays as the user sees it until it closes
  if (document.querySelector("dialog[open]")) return;
  // the user is typing in the state lookup: the page waits until the field loses focus
  if (document.activeElement && document.activeElement.closest("#state-lookup")) return;
  busy = true;
  try {
    const data = await current.view.load(current.arg);
    const view = document.getElementById("view");
    view.replaceChildren(current.view.render(data));
    document.getElementById("updated").textContent =
      "updated " + new Date().toLocaleTimeString("en-GB");
    if (failures) { failures = 0; notice(""); }
  } catch (e) {
    failures++;
    if (e instanceof ApiFailure && e.status === 404) {
      document.getElementById("view").replaceChildren(h("section", {class: "message"},
        h("h1", {text: "Not found"}), h("p", {id: "message"}, e.message)));
    } else if (e instanceof ApiFailure && e.status === 403) {
      document.getElementById("view").replaceChildren(h("section", {class: "message"},
        h("h1", {text: "Token needed"}), h("p", {}, e.message),
        h("button", {type: "button", class: "primary", onclick: () => askToken()},
          "Enter the token")));
    } else if (failures > 1) {
      notice("The member does not answer (" + e.message + "); retrying every second.",
             "error");
    }
  } finally {
    busy = false;
  }
}

async function start() {
  current = route();
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", a.dataset.nav === current.nav);
  }
  document.getElementById("token-button").addEventListener("click", () => askToken());
  const session = await checkSession();
  if (session && !session.readable) {
    document.getElementById("view").replaceChildren(h("section", {class: "message"},
      h("h1", {text: "This dashboard needs the member's token"}),
      h("p", {}, "The member was started with --ui-auth required: enter its token to see " +
                 "the cluster and its jobs."),
      h("button", {type: "button", class: "primary", id: "login",
                   onclick: async () => { if (await askToken()) location.reload(); }},
        "Enter the token")));
    return;
  }
  await refresh();
  setInterval(refresh, REFRESH_MS);
}

document.addEventListener("DOMContentLoaded", start);
