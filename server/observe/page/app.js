// The live page of mlockd: polls /api/view once a second (not while the
// tab is hidden) and redraws. Every text from the server goes through
// textContent: resource and owner names are the clients'.
"use strict";

const $ = (id) => document.getElementById(id);
let prefix = "";
let limit = 20;
let timer = null;
let inflight = false;
let lastStart = 0; // of the latest request: at most one a second

function fmtNum(n) {
  return n.toLocaleString("en-US");
}

function fmtRate(r) {
  if (r >= 100) return fmtNum(Math.round(r));
  if (r >= 10) return r.toFixed(1);
  return r.toFixed(2);
}

// fmtDur formats milliseconds: 850ms, 4.2s, 3m 04s, 2h 05m, 3d 4h.
function fmtDur(ms) {
  if (ms == null) return "";
  const neg = ms < 0;
  ms = Math.abs(ms);
  let s;
  if (ms < 1000) s = Math.round(ms) + "ms";
  else if (ms < 60000) s = (ms / 1000).toFixed(1) + "s";
  else if (ms < 3600000) s = Math.floor(ms / 60000) + "m " + String(Math.floor(ms / 1000) % 60).padStart(2, "0") + "s";
  else if (ms < 86400000) s = Math.floor(ms / 3600000) + "h " + String(Math.floor(ms / 60000) % 60).padStart(2, "0") + "m";
  else s = Math.floor(ms / 86400000) + "d " + (Math.floor(ms / 3600000) % 24) + "h";
  return neg ? "-" + s : s;
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text != null) e.textContent = text;
  return e;
}

function setText(id, v) {
  const e = $(id);
  if (e.textContent !== v) e.textContent = v;
}

// plot draws values as a line with an area under it.
function plot(id, values) {
  const svg = $(id);
  const ns = "http://www.w3.org/2000/svg";
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  if (!values.length) return;
  const w = 300, h = 60, top = Math.max(1, ...values) * 1.1;
  const n = Math.max(values.length - 1, 1);
  const pts = values.map((v, i) => [(i / n) * w, h - (v / top) * (h - 2) - 1]);
  const line = "M" + pts.map((p) => p[0].toFixed(1) + "," + p[1].toFixed(1)).join("L");
  const area = document.createElementNS(ns, "path");
  area.setAttribute("class", "area");
  area.setAttribute("d", line + "L" + w + "," + h + "L0," + h + "Z");
  const path = document.createElementNS(ns, "path");
  path.setAttribute("class", "line");
  path.setAttribute("d", line);
  svg.appendChild(area);
  svg.appendChild(path);
}

function entryRow(e) {
  const tr = el("tr");
  tr.dataset.state = e.state;
  if (e.owner) tr.dataset.owner = e.owner;
  tr.appendChild(el("td", "state-" + e.state, e.state === "held" ? "held" : "#" + e.position));
  const owner = el("td", "mono", e.owner || "");
  owner.title = e.owner || "";
  tr.appendChild(owner);
  tr.appendChild(el("td", "mono", e.lock || ""));
  tr.appendChild(el("td", "mono", e.session || ""));
  if (e.state === "held") {
    tr.appendChild(el("td", null, fmtDur(e.heldMs != null ? e.heldMs : e.ageMs)));
    tr.appendChild(el("td", null, e.ttlLeftMs != null ? fmtDur(e.ttlLeftMs) + " left" : ""));
    tr.appendChild(el("td", "mono", e.token ? String(e.token) : ""));
  } else {
    tr.appendChild(el("td", null, fmtDur(e.ageMs)));
    tr.appendChild(el("td", null, e.timeoutLeftMs != null ? "times out in " + fmtDur(e.timeoutLeftMs) : "no timeout"));
    tr.appendChild(el("td"));
  }
  if (e.principal) tr.title = "principal " + e.principal;
  return tr;
}

function queueBlock(q, longest) {
  const div = el("div", "queue");
  div.dataset.resource = q.resource;
  div.dataset.length = q.length;
  const head = el("div", "q-head");
  head.appendChild(el("span", "q-name", q.resource));
  const bar = el("div", "q-bar");
  const fill = el("div");
  fill.style.width = Math.max(2, (100 * q.length) / Math.max(longest, 1)) + "%";
  bar.appendChild(fill);
  head.appendChild(bar);
  const waiting = q.entries.filter((e) => e.state === "waiting").length + (q.length - q.entries.length);
  head.appendChild(el("span", "q-len", waiting ? waiting + " waiting" : "no waiters"));
  div.appendChild(head);
  const t = el("table", "entries");
  const cg = el("colgroup");
  for (const c of ["state", "owner", "lock", "session", "for", "left", "token"]) cg.appendChild(el("col", "c-" + c));
  t.appendChild(cg);
  const hr = el("tr");
  for (const h of ["", "owner", "lock", "session", "for", "", "fencing token"]) hr.appendChild(el("th", null, h));
  t.appendChild(hr);
  for (const e of q.entries) t.appendChild(entryRow(e));
  div.appendChild(t);
  if (q.length > q.entries.length) div.appendChild(el("div", "more", "… and " + fmtNum(q.length - q.entries.length) + " more waiting"));
  return div;
}

function render(v) {
  setText("version", v.version);
  const ready = $("ready");
  ready.textContent = v.ready ? "ready" : "not ready: " + (v.why || "");
  ready.className = "pill " + (v.ready ? "ok" : "bad");
  $("quiet").hidden = !v.quiet;
  setText("uptime", "up " + fmtDur(v.now - v.startAt));
  const c = v.counts;
  setText("held", fmtNum(c.held));
  setText("waiting", fmtNum(c.waiting));
  setText("queues", fmtNum(c.queues));
  setText("online", fmtNum(c.online));
  setText("grace", fmtNum(c.grace));
  setText("conns", fmtNum(c.conns));
  setText("token", String(c.lastToken));

  const r = v.rates;
  if (r.at && r.at.length > 1) {
    for (const e of document.querySelectorAll(".span-label")) e.textContent = "· last " + fmtDur(r.at[r.at.length - 1] - r.at[0]);
  }
  for (const k of ["grants", "requests", "timeouts", "expiries"]) {
    const vals = r[k] || [];
    plot("plot-" + k, vals);
    setText("rate-" + k, vals.length ? fmtRate(vals[vals.length - 1]) : "–");
  }

  const cl = v.cluster;
  $("cluster").hidden = !cl;
  if (cl) {
    setText("cl-id", cl.id);
    setText("cl-role", cl.role);
    setText("cl-term", String(cl.term));
    setText("cl-leader", cl.leader || "none known");
    setText("cl-commit", String(cl.commitIndex));
    setText("cl-applied", String(cl.appliedIndex));
    const ul = $("cl-peers");
    ul.replaceChildren(...(cl.peers || []).map((p) => {
      const li = el("li", p.failing ? "failing" : "", p.id + " " + p.addr + (p.id === cl.leader ? " (leader)" : "") + (p.failing ? " failing" : ""));
      return li;
    }));
  }

  const list = $("queues-list");
  const top = v.top || [];
  const longest = top.length ? top[0].length : 1;
  list.replaceChildren(...top.map((q) => queueBlock(q, longest)));
  $("empty").hidden = top.length > 0;
  const what = v.prefix ? "resources starting with \u201c" + v.prefix + "\u201d" : "resources";
  setText("matched", fmtNum(v.matched) + " " + what + " held or waited for; the " + Math.min(top.length, v.matched) + " with the longest queues:");
  setText("updated", "updated " + new Date(v.now).toLocaleTimeString());
}

async function poll() {
  timer = null;
  if (document.hidden || inflight) return;
  inflight = true;
  lastStart = Date.now();
  try {
    const res = await fetch("/api/view?prefix=" + encodeURIComponent(prefix) + "&limit=" + limit, { cache: "no-store" });
    if (!res.ok) throw new Error(res.status + " " + res.statusText);
    render(await res.json());
  } catch (err) {
    const ready = $("ready");
    ready.textContent = "unreachable";
    ready.className = "pill bad";
    setText("updated", "last error: " + err.message);
  } finally {
    inflight = false;
    schedule(1000);
  }
}

function schedule(ms) {
  if (timer) clearTimeout(timer);
  timer = setTimeout(poll, Math.max(ms, lastStart + 1000 - Date.now()));
}

document.addEventListener("visibilitychange", () => { if (!document.hidden) schedule(0); });
$("filter").addEventListener("submit", (e) => e.preventDefault());
$("prefix").addEventListener("input", () => { prefix = $("prefix").value.trim(); schedule(250); });
$("limit").addEventListener("change", () => { limit = Number($("limit").value); schedule(0); });
const params = new URLSearchParams(location.search);
if (params.get("prefix")) { prefix = params.get("prefix"); $("prefix").value = prefix; }
schedule(0);
