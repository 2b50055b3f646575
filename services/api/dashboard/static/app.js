// torpor dashboard: plain JS, no build. Data is only ever put into the page as text
// (textContent), never as HTML. Signing in sends the API key once; the session lives in an
// HttpOnly cookie holding a random id, and every write carries the session's CSRF token.
"use strict";

const $ = (sel) => document.querySelector(sel);
const state = {
  me: null, csrf: "", sandboxes: [], selected: null, owner: "", source: null, timer: null,
};

async function api(path, options = {}) {
  const headers = { "X-CSRF-Token": state.csrf, ...(options.headers || {}) };
  const res = await fetch(path, { credentials: "same-origin", ...options, headers });
  if (res.status === 204) return null;
  const body = await res.json().catch(() => ({}));
  if (!res.ok) {
    const err = new Error(body.message || res.statusText);
    err.status = res.status;
    throw err;
  }
  return body;
}

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function ago(iso) {
  if (!iso) return "—";
  return span(Date.now() - Date.parse(iso)) + " ago";
}

function until(iso) {
  if (!iso) return "—";
  const ms = Date.parse(iso) - Date.now();
  return ms >= 0 ? "in " + span(ms) : span(-ms) + " ago";
}

function span(ms) {
  let s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return s + "s";
  const m = Math.floor(s / 60); s %= 60;
  if (m < 60) return m + "m " + s + "s";
  const h = Math.floor(m / 60);
  if (h < 48) return h + "h " + (m % 60) + "m";
  return Math.floor(h / 24) + "d " + (h % 24) + "h";
}

function say(text, isError) {
  const box = $("#status");
  box.textContent = text || "";
  box.className = isError ? "error" : "muted";
}

// ---- session -------------------------------------------------------------------------------

async function boot() {
  try {
    state.me = await api("/dashboard/api/me");
    state.csrf = state.me.csrfToken || "";
  } catch (e) {
    return showLogin(e.status === 401 ? "" : e.message);
  }
  showApp();
}

function showLogin(message) {
  stopLive();
  clearInterval(state.timer);
  // Nothing of the last session stays in the page (a shared screen, the next user).
  state.sandboxes = [];
  for (const sel of ["#sandboxes tbody", "#users tbody", "#usage tbody tr", "#events tbody",
                     "#snapshot tbody", "#user", "#usage-asof", "#count", "#flag", "#status"]) {
    const node = $(sel);
    if (node) node.replaceChildren();
  }
  $("#detail").hidden = true;
  $("#app").hidden = true;
  $("#who").hidden = true;
  $("#login").hidden = false;
  $("#login-error").textContent = message || "";
  $("#api-key").focus();
}

async function login(event) {
  event.preventDefault();
  const input = $("#api-key");
  const key = input.value;
  input.value = ""; // do not keep the secret in the DOM
  try {
    state.csrf = (await api("/dashboard/api/csrf")).csrfToken; // the sign-in's own CSRF token
    state.me = await api("/dashboard/login", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ apiKey: key }),
    });
    state.csrf = state.me.csrfToken || "";
  } catch (e) {
    $("#login-error").textContent = e.status === 401 ? "That API key is not valid." : e.message;
    return;
  }
  showApp();
}

async function logout() {
  await api("/dashboard/logout", { method: "POST" }).catch(() => null);
  state.me = null;
  state.csrf = "";
  state.selected = null;
  showLogin("");
}

function showApp() {
  const me = state.me;
  $("#login").hidden = true;
  $("#app").hidden = false;
  $("#who").hidden = false;
  $("#user").textContent = me.user + (me.admin ? " (admin)" : "");
  document.body.classList.toggle("is-admin", me.admin);
  $("#owner-filter-box").hidden = !me.admin;
  $("#users-panel").hidden = !me.admin;
  $("#flag").textContent = me.admin ? "" : "PAUSE_RESUME: " + (me.pauseResume ? "on" : "off");
  if (me.admin) loadUsers();
  refresh();
  startLive();
  clearInterval(state.timer);
  state.timer = setInterval(tick, 1000);
}

// ---- data ----------------------------------------------------------------------------------

let refreshing = null;
let again = false;

async function refresh() {
  if (refreshing) { again = true; return refreshing; }
  refreshing = (async () => {
    do {
      again = false;
      const q = state.owner ? "?owner=" + encodeURIComponent(state.owner) : "";
      let listed;
      try {
        listed = await api("/dashboard/api/sandboxes" + q);
      } catch (e) {
        if (e.status === 401) return showLogin("Your session ended; sign in again.");
        say(e.message, true);
      }
      if (!state.me) return;  // signed out while it loaded: show nothing of that session
      if (listed) state.sandboxes = listed;
      render();
      loadUsage();
    } while (again);
  })().finally(() => { refreshing = null; });
  return refreshing;
}

function hours(seconds) {
  return (seconds / 3600).toFixed(seconds < 36 ? 3 : 2) + " h";
}

async function loadUsage() {
  const q = state.owner ? "?owner=" + encodeURIComponent(state.owner) : "";
  let usage;
  try { usage = await api("/dashboard/api/usage" + q); } catch (e) {
    $("#usage-panel").hidden = e.status === 501;  // no ledger on this deployment
    return;
  }
  if (!state.me) return;  // signed out while it loaded
  const t = usage.totals;
  const cells = [
    t.sandboxes, hours(t.runningSeconds), hours(t.pausedSeconds),
    hours(t.cpuSeconds) + " × core", (t.memoryMbSeconds / 1024 / 3600).toFixed(2) + " GiB·h",
    (t.keptByteSeconds / 2 ** 30 / 3600).toFixed(2) + " GiB·h", t.resumes, t.replayFailures,
  ];
  const row = $("#usage tbody tr");
  row.replaceChildren(...cells.map((c) => el("td", c)));
  $("#usage-asof").textContent = (usage.user === state.me.user ? "" : usage.user + ", ") +
    "as of " + new Date(usage.asOf).toLocaleTimeString();
}

async function loadUsers() {
  let users = [];
  try { users = await api("/dashboard/api/users"); } catch (e) { return say(e.message, true); }
  if (!state.me) return;  // signed out while it loaded
  const body = $("#users tbody");
  body.replaceChildren();
  const select = $("#owner-filter");
  const keep = select.value;
  select.replaceChildren(el("option", "everyone"));
  select.firstChild.value = "";
  for (const u of users) {
    const row = el("tr");
    row.dataset.user = u.name;
    row.append(el("td", u.name), el("td", u.admin ? "admin" : "user"),
               el("td", u.pauseResume ? "enabled" : "disabled", "flag"));
    body.append(row);
    const opt = el("option", u.name);
    opt.value = u.name;
    select.append(opt);
  }
  select.value = keep;
}

// ---- rendering -----------------------------------------------------------------------------

function render() {
  const body = $("#sandboxes tbody");
  body.replaceChildren();
  for (const s of state.sandboxes) body.append(row(s));
  $("#empty").hidden = state.sandboxes.length > 0;
  $("#count").textContent = state.sandboxes.length + " sandbox" +
    (state.sandboxes.length === 1 ? "" : "es");
  renderDetail();
}

function row(s) {
  const tr = el("tr");
  tr.dataset.id = s.sandboxId;
  tr.dataset.name = s.name;
  tr.dataset.state = s.state;
  if (s.sandboxId === state.selected) tr.classList.add("selected");
  const stateCell = el("td");
  stateCell.append(el("span", s.state, "state " + s.state));
  const owner = el("td", s.owner, "admin-only");
  const actions = el("td");
  actions.append(
    button("Pause", "pause", s, s.state !== "running"),
    button("Resume", "resume", s, !(s.state === "paused" || s.state === "failed")),
    button("Kill", "kill", s, s.state === "killing", "danger"),
  );
  tr.append(
    el("td", s.name, "mono"), owner, stateCell, el("td", s.template),
    el("td", span(Date.now() - Date.parse(s.createdAt)), "age"),
    el("td", s.deadline ? until(s.deadline) : "—", "deadline"),
    el("td", ago(s.lastActivity), "activity"),
    actions,
  );
  tr.addEventListener("click", (ev) => {
    if (ev.target.tagName === "BUTTON") return;
    select(s.sandboxId);
  });
  return tr;
}

function button(label, action, s, disabled, cls) {
  const b = el("button", label, cls);
  b.type = "button";
  b.dataset.action = action;
  b.disabled = disabled;
  b.addEventListener("click", () => act(s.sandboxId, s.name, action, b));
  return b;
}

function tick() {
  for (const tr of document.querySelectorAll("#sandboxes tbody tr")) {
    const s = state.sandboxes.find((x) => x.sandboxId === tr.dataset.id);
    if (!s) continue;
    tr.querySelector(".age").textContent = span(Date.now() - Date.parse(s.createdAt));
    tr.querySelector(".deadline").textContent = s.deadline ? until(s.deadline) : "—";
    tr.querySelector(".activity").textContent = ago(s.lastActivity);
  }
}

function select(id) {
  state.selected = id;
  for (const tr of document.querySelectorAll("#sandboxes tbody tr")) {
    tr.classList.toggle("selected", tr.dataset.id === id);
  }
  renderDetail();
  loadEvents();
}

function renderDetail() {
  const s = state.sandboxes.find((x) => x.sandboxId === state.selected);
  $("#detail").hidden = !s;
  if (!s) return;
  $("#detail-name").textContent = s.name;
  const badge = $("#detail-state");
  badge.textContent = s.state;
  badge.className = "state " + s.state;
  $("#detail-failure").textContent = s.failure ? "Last failure: " + s.failure : "";
  const snap = s.snapshot;
  $("#snapshot").hidden = !snap;
  $("#snapshot-none").hidden = !!snap;
  $("#snapshot-time").textContent = snap ? "captured " + snap.capturedTime : "";
  const body = $("#snapshot tbody");
  body.replaceChildren();
  if (!snap) return;
  if (snap.error) $("#snapshot-none").hidden = false;
  if (snap.error) $("#snapshot-none").textContent = "The snapshot could not be decoded.";
  for (const p of snap.processes) {
    const tr = el("tr");
    tr.append(el("td", p.cmd), el("td", JSON.stringify(p.args)), el("td", p.cwd || ""),
              el("td", p.pid), el("td", p.tag || ""));
    body.append(tr);
  }
  if (snap.processes.length === 0) {
    const tr = el("tr");
    const td = el("td", "(no processes were running)", "muted");
    td.colSpan = 5;
    tr.append(td);
    body.append(tr);
  }
}

async function loadEvents() {
  const id = state.selected;
  if (!id) return;
  let events = [];
  try {
    events = await api("/dashboard/api/sandboxes/" + encodeURIComponent(id) + "/events");
  } catch (e) {
    events = [];
    if (e.status !== 404) say("history: " + e.message, true);
  }
  if (id !== state.selected) return;
  const body = $("#events tbody");
  body.replaceChildren();
  for (const ev of events) {
    const tr = el("tr");
    tr.dataset.fact = ev.fact;
    tr.append(el("td", ev.seq ?? ""), el("td", ev.at ? new Date(ev.at).toLocaleTimeString() : ""),
              el("td", ev.fact), el("td", details(ev)));
    body.append(tr);
  }
}

function details(ev) {
  const d = ev.data || {};
  const skip = new Set(["type", "sandbox_id", "schema_version", "at"]);
  return Object.entries(d).filter(([k]) => !skip.has(k))
    .map(([k, v]) => k + "=" + (typeof v === "object" ? JSON.stringify(v) : v)).join(" ");
}

// ---- actions -------------------------------------------------------------------------------

const VERB = { pause: "Pausing", resume: "Resuming", kill: "Killing" };

// Sandboxes are addressed by id (names are per user: an admin sees several of one name).
async function act(id, name, action, btn) {
  if (action === "kill" && !confirm("Kill sandbox " + name + "?")) return;
  btn.disabled = true;
  say(VERB[action] + " " + name + "…");
  try {
    await api("/dashboard/api/sandboxes/" + encodeURIComponent(id) + "/" + action,
              { method: "POST" });
    say("");
  } catch (e) {
    say(action + " " + name + ": " + e.message, true);
  }
  await refresh();
  if (state.selected === id) loadEvents();
}

// ---- live updates --------------------------------------------------------------------------

function startLive() {
  stopLive();
  if (!state.me || !state.me.live) return;
  const q = state.owner ? "?owner=" + encodeURIComponent(state.owner) : "";
  const source = new EventSource("/dashboard/api/stream" + q);
  state.source = source;
  source.addEventListener("hello", () => { setLive(true); refresh(); });
  source.addEventListener("lagged", () => refresh());
  source.addEventListener("sandbox", (msg) => {
    const ev = JSON.parse(msg.data);
    if (ev.fact === "activity") {
      const s = state.sandboxes.find((x) => x.sandboxId === ev.sandboxId);
      if (s) { s.lastActivity = ev.at; tick(); }
      return;
    }
    refresh();
    if (state.me.admin && ev.fact === "created") loadUsers();
    if (ev.sandboxId === state.selected) loadEvents();
  });
  source.onerror = () => setLive(false);
}

function stopLive() {
  if (state.source) state.source.close();
  state.source = null;
  setLive(false);
}

function setLive(on) {
  const dot = $("#live");
  dot.className = "live " + (on ? "on" : "off");
  dot.title = on ? "live updates on" : "live updates off (reconnecting)";
}

document.addEventListener("DOMContentLoaded", () => {
  $("#login-form").addEventListener("submit", login);
  $("#logout").addEventListener("click", logout);
  $("#owner-filter").addEventListener("change", (e) => {
    state.owner = e.target.value;
    refresh();
    startLive();
  });
  boot();
});
