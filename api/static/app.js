// The dashboard: reads the REST API the page is served by and follows /v1/watch.
// No framework and no build step; the bearer token lives only in this tab's sessionStorage.

const TOKEN_KEY = "kvsi.token";
const PAGE_SIZE = 25;
// Events arrive by the hundred per second on a busy fleet; redraw at most this often.
const REFRESH_MS = 1000;
const RETRY_MAX_MS = 10000;
// The heatmap reads one session view per column, so it has few columns and redraws slowly.
const HEATMAP_SESSIONS = 10;
const HEATMAP_MS = 5000;
const LINE_POINTS = 120;
// The line takes a reading this often, changes or not, so time runs on at a steady pace.
const LINE_TICK_MS = 1000;
// What the API accepts as a session id, and so as an id prefix (api/params.py).
const SESSION_ID = /^[\x21-\x2E\x30-\x7E]{1,256}$/;

const $ = (id) => document.getElementById(id);

const view = {
  cursors: [null], // cursor of each page seen so far; the last is the current page's
  order: "last_seen", // the API's order of the session list: "last_seen" or "blocks"
  prefix: null, // the session id prefix searched for, or null for every session
  sessions: [],
  nextCursor: null,
  pagesAsked: 0, // pages asked for so far: only the latest answer is drawn
  activeRow: null, // session id of the table row that takes the focus (roving tabindex)
  openSession: null,
  held: new Map(), // "pod/rank" -> blocks of the open session: its view, then the feed's
  line: [], // [seconds, resident blocks] of the open session, oldest first
  lineTimer: null,
  workers: [], // "pod/rank" of every worker, the heatmap's rows
  lastEventId: null,
  events: 0,
  stream: null,
};

class Unauthorized extends Error {}

function headers() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

// Relative URLs, so the page works behind a proxy that serves the API under a prefix.
async function api(path, params = {}) {
  const url = new URL(path, document.baseURI);
  for (const [k, v] of Object.entries(params)) if (v != null) url.searchParams.set(k, v);
  const response = await fetch(url, { headers: headers() });
  if (response.status === 401) throw new Unauthorized((await response.json()).detail);
  if (response.status === 404) return null;
  if (!response.ok) throw new Error(`${path}: ${response.status} ${await response.text()}`);
  return response.json();
}

function askForToken(reason) {
  sessionStorage.removeItem(TOKEN_KEY);
  $("token-error").textContent = reason;
  $("token-form").hidden = false;
  $("token").focus();
  setFeed("locked", "waiting for a bearer token");
}

function setFeed(state, text) {
  $("feed").dataset.state = state;
  $("feed-text").textContent = text;
}

function ago(ts) {
  if (ts == null) return "never";
  const seconds = Math.max(0, Date.now() / 1000 - ts);
  return seconds < 60 ? `${seconds.toFixed(1)} s ago` : `${Math.round(seconds / 60)} min ago`;
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function bar(fraction, label) {
  const meter = document.createElement("meter");
  meter.min = 0;
  meter.max = 1;
  meter.value = fraction;
  meter.setAttribute("aria-label", label);
  return meter;
}

// -- fleet ---------------------------------------------------------------------------------

async function loadFleet() {
  const body = await api("v1/pods");
  const tbody = $("fleet").tBodies[0];
  tbody.replaceChildren();
  view.workers = body.pods.map((w) => `${w.pod}/${w.dp_rank}`);
  for (const w of body.pods) {
    const row = tbody.insertRow();
    row.dataset.pod = w.pod;
    row.dataset.state = w.state;
    cell(row, w.pod);
    cell(row, String(w.dp_rank));
    cell(row, w.state, `state state-${w.state}`);
    cell(row, String(w.blocks), "num blocks");
    cell(row, String(w.sessions), "num");
    cell(row, String(w.last_seq ?? "–"), "num seq");
    cell(row, ago(w.last_event_at));
    cell(row, `${w.lag_batches} (${w.lag_seconds.toFixed(1)} s)`, "num lag");
    cell(row, String(w.gaps), "num");
    cell(row, String(w.replays), "num");
    cell(row, String(w.restarts), "num");
    cell(row, String(w.batches_lost), "num");
    cell(row, w.state_detail ?? "");
  }
}

// -- sessions ------------------------------------------------------------------------------

// One page at a time, in the order and with the prefix the API was asked for: the table
// never holds more than the page it shows.
async function loadSessions() {
  const cursor = view.cursors[view.cursors.length - 1];
  const params = { limit: PAGE_SIZE, cursor, order: view.order, prefix: view.prefix };
  const asked = ++view.pagesAsked;
  const body = await api("v1/sessions", params);
  if (asked !== view.pagesAsked) return; // a later question (sort, search, page) wins
  view.sessions = body.sessions;
  view.nextCursor = body.next_cursor;
  drawSessions();
}

function drawSessions() {
  const tbody = $("sessions").tBodies[0];
  const hadFocus = tbody.contains(document.activeElement);
  tbody.replaceChildren();
  for (const s of view.sessions) {
    const row = tbody.insertRow();
    row.dataset.session = s.session_id;
    row.tabIndex = -1;
    cell(row, s.session_id, "session");
    cell(row, String(s.blocks), "num blocks");
    cell(row, String(s.pods), "num");
    cell(row, ago(s.last_seen));
  }
  // The row that had the focus keeps it through a redraw, wherever the page moved it.
  const rows = [...tbody.rows];
  const active = rows.find((r) => r.dataset.session === view.activeRow) ?? rows[0];
  if (active) activate(active, hadFocus);
  const order = view.order === "blocks" ? "most blocks first" : "most recently seen first";
  const only = view.prefix == null ? "" : `, ids starting with “${view.prefix}”`;
  $("page-label").textContent = `page ${view.cursors.length}, ${order}${only}`;
  $("next-page").disabled = view.nextCursor == null;
  $("first-page").disabled = view.cursors.length === 1;
}

// Roving tabindex: one row of the table is in the tab order; the arrow keys move it.
function activate(row, focus) {
  for (const r of row.parentElement.rows) r.tabIndex = r === row ? 0 : -1;
  view.activeRow = row.dataset.session;
  if (focus) row.focus();
}

function onRowKey(event) {
  const row = event.target.closest("tr");
  if (!row) return;
  const rows = [...row.parentElement.rows];
  const at = rows.indexOf(row);
  const moves = { ArrowDown: at + 1, ArrowUp: at - 1, Home: 0, End: rows.length - 1 };
  if (event.key in moves) {
    event.preventDefault();
    activate(rows[Math.max(0, Math.min(rows.length - 1, moves[event.key]))], true);
  } else if (event.key === "Enter" || event.key === " ") {
    event.preventDefault();
    guarded(() => openSession(row.dataset.session));
  }
}

function onRowClick(event) {
  const row = event.target.closest("tbody tr");
  if (!row) return;
  activate(row, false);
  guarded(() => openSession(row.dataset.session));
}

function firstPage() {
  view.cursors = [null];
  view.activeRow = null;
  return guarded(loadSessions);
}

// The box searches by id prefix; an id that exists as typed also opens its session. It is
// asked for by itself only when the first page of matches can neither show nor rule it out.
async function search(event) {
  event.preventDefault();
  const text = $("search").value.trim();
  if (text && !SESSION_ID.test(text)) {
    $("search-result").textContent =
      "A session id is 1 to 256 printable ASCII characters, without spaces or “/”.";
    return;
  }
  view.prefix = text || null;
  await firstPage();
  if (!text) {
    $("search-result").textContent = "";
    return;
  }
  const listed = view.sessions.some((s) => s.session_id === text);
  const found =
    !listed && view.nextCursor != null
      ? await guarded(() => api(`v1/sessions/${encodeURIComponent(text)}`))
      : null;
  $("search-result").textContent =
    view.sessions.length === 0
      ? `No session starts with ${text} (never seen, or aged out).`
      : `Sessions whose id starts with ${text}.`;
  if (listed || found) await guarded(() => openSession(text, found));
}

function sortBy() {
  view.order = $("sort").value;
  return firstPage();
}

// -- heatmap: workers x the sessions holding the most blocks fleet-wide ----------------------

async function loadHeatmap() {
  const busiest = await api("v1/sessions", { order: "blocks", limit: HEATMAP_SESSIONS });
  if (document.hidden) {
    dirty.heatmap = true; // hidden while the busiest were read: the rest waits to be shown
    return;
  }
  const ids = busiest.sessions.map((s) => s.session_id);
  const views = await Promise.all(ids.map((id) => api(`v1/sessions/${encodeURIComponent(id)}`)));
  const shown = views.filter((v) => v != null);
  const head = $("heatmap").tHead.rows[0];
  head.replaceChildren(document.createElement("th"));
  head.cells[0].textContent = "worker";
  head.cells[0].scope = "col";
  for (const s of shown) {
    const th = document.createElement("th");
    th.scope = "col";
    th.textContent = s.session_id;
    head.append(th);
  }
  const most = Math.max(1, ...shown.flatMap((s) => s.pods.map((w) => w.blocks)));
  const tbody = $("heatmap").tBodies[0];
  tbody.replaceChildren();
  for (const worker of view.workers) {
    const row = tbody.insertRow();
    const th = document.createElement("th");
    th.scope = "row";
    th.textContent = worker;
    row.append(th);
    for (const s of shown) {
      const held = s.pods.find((w) => `${w.pod}/${w.dp_rank}` === worker)?.blocks ?? 0;
      const td = cell(row, held ? String(held) : "", "num heat");
      td.style.setProperty("--heat", String(held / most));
      td.title = `${s.session_id} on ${worker}: ${held} blocks`;
    }
  }
  $("heatmap").dataset.draws = String(Number($("heatmap").dataset.draws ?? 0) + 1);
}

// -- one session ---------------------------------------------------------------------------

async function openSession(id, body) {
  const opening = view.openSession !== id;
  view.openSession = id;
  const data = body ?? (await api(`v1/sessions/${encodeURIComponent(id)}`));
  if (view.openSession !== id) return; // another session was opened meanwhile
  if (data == null) {
    $("search-result").textContent = `Session ${id} aged out.`;
    return closeSession();
  }
  view.held = new Map(data.pods.map((w) => [`${w.pod}/${w.dp_rank}`, w.blocks]));
  drawSession(data);
  if (opening) {
    view.line = [];
    clearInterval(view.lineTimer);
    view.lineTimer = setInterval(sampleLine, LINE_TICK_MS);
    sampleLine();
  }
  const section = $("session");
  if (section.hidden) {
    section.hidden = false;
    $("session-title").scrollIntoView({ block: "nearest" });
    $("close-session").focus();
  }
}

// A residency change of the open session: that worker's blocks now, as the feed says.
function heldChanged(data) {
  view.held.set(`${data.pod}/${data.dp_rank}`, data.blocks);
}

function sampleLine() {
  let total = 0;
  for (const n of view.held.values()) total += n;
  view.line.push([Date.now() / 1000, total]);
  view.line = view.line.slice(-LINE_POINTS);
  const first = view.line[0][0];
  const span = Math.max(1, view.line[view.line.length - 1][0] - first);
  // A quarter of headroom: a level line stays visible below the chart's top edge.
  const top = 1.25 * Math.max(1, ...view.line.map(([, n]) => n));
  const points = view.line.map(([t, n]) => `${(600 * (t - first)) / span},${116 - (112 * n) / top}`);
  // One reading is a level, not a point: draw it across the chart.
  if (points.length === 1) points.push(`600,${points[0].split(",")[1]}`);
  $("session-line").querySelector("polyline").setAttribute("points", points.join(" "));
  const counts = view.line.map(([, n]) => n);
  $("session-range").textContent =
    `${view.line.length} readings, ${Math.min(...counts)} to ${Math.max(...counts)} blocks`;
}

function drawSession(s) {
  $("session-id").textContent = s.session_id;
  $("session-total").textContent = String(s.total_blocks);
  $("session-seen").textContent = ago(s.last_seen);
  const most = Math.max(1, ...s.pods.map((w) => w.blocks));
  const tbody = $("session-pods").tBodies[0];
  tbody.replaceChildren();
  const media = new Map();
  for (const w of s.pods) {
    const row = tbody.insertRow();
    row.dataset.pod = w.pod;
    row.dataset.rank = String(w.dp_rank);
    cell(row, w.pod);
    cell(row, String(w.dp_rank));
    cell(row, w.state ?? "removed", `state state-${w.state}`);
    cell(row, String(w.blocks), "num blocks");
    row.insertCell().append(bar(w.blocks / most, `${w.pod} rank ${w.dp_rank}: ${w.blocks} blocks`));
    cell(row, String(w.lost_blocks), "num");
    for (const [medium, n] of Object.entries(w.by_medium)) {
      media.set(medium, (media.get(medium) ?? 0) + n);
    }
  }
  const largest = Math.max(1, ...media.values());
  const list = $("session-media");
  list.replaceChildren();
  for (const [medium, n] of [...media].sort()) {
    const item = document.createElement("li");
    item.dataset.medium = medium;
    const label = document.createElement("span");
    label.textContent = `${medium} `;
    const count = document.createElement("span");
    count.className = "num blocks";
    count.textContent = String(n);
    item.append(label, bar(n / largest, `${medium}: ${n} blocks`), count);
    list.append(item);
  }
}

// Escape or Close: the session view goes, the focus returns to its row (else the search).
function backToTable() {
  closeSession();
  const row = [...$("sessions").tBodies[0].rows].find((r) => r.tabIndex === 0);
  if (row) row.focus();
  else $("search").focus();
}

function closeSession() {
  view.openSession = null;
  clearInterval(view.lineTimer);
  view.lineTimer = null;
  $("session").hidden = true;
}

// -- live updates --------------------------------------------------------------------------

// Redraws are batched: an event marks what it touched and one timer refreshes it.
const dirty = { fleet: false, sessions: false, session: false, heatmap: false };
let refreshTimer = null;
let heatmapTimer = null;

function touch(event, data) {
  dirty.fleet = true;
  if (event === "residency") {
    // Only the first page moves under the reader; later pages stay put while read.
    if (view.cursors.length === 1) dirty.sessions = true;
    if (data.session_id === view.openSession) {
      heldChanged(data);
      dirty.session = true;
    }
  }
  if (event === "worker" && view.openSession) dirty.session = true;
  if (event === "reset") Object.assign(dirty, { fleet: true, sessions: true, session: true });
  refreshTimer ??= setTimeout(refresh, REFRESH_MS);
  if (event === "residency" || event === "reset") {
    heatmapTimer ??= setTimeout(() => {
      heatmapTimer = null;
      if (document.hidden) {
        dirty.heatmap = true; // read when the tab shows again
        return;
      }
      guarded(loadHeatmap);
    }, HEATMAP_MS);
  }
}

// A tab in the background reads nothing: the busiest-sessions order costs the API a read of
// every residency, and an operator may leave the page open for days.
document.addEventListener("visibilitychange", () => {
  if (document.hidden) return;
  if (dirty.heatmap) {
    dirty.heatmap = false;
    guarded(loadHeatmap);
  }
  if (dirty.fleet || dirty.sessions || dirty.session) refresh();
});

async function refresh() {
  refreshTimer = null;
  if (document.hidden) return; // dirty flags kept: the visibilitychange handler reads
  const jobs = [];
  if (dirty.fleet) jobs.push(loadFleet());
  if (dirty.sessions) jobs.push(loadSessions());
  if (dirty.session && view.openSession) jobs.push(openSession(view.openSession));
  Object.assign(dirty, { fleet: false, sessions: false, session: false });
  await guarded(() => Promise.all(jobs));
}

// EventSource cannot send an Authorization header, so the stream is read with fetch().
async function follow() {
  let wait = 500;
  for (;;) {
    const controller = new AbortController();
    view.stream = controller;
    try {
      const extra = view.lastEventId ? { "Last-Event-ID": view.lastEventId } : {};
      const response = await fetch(new URL("v1/watch", document.baseURI), {
        headers: { ...headers(), ...extra, Accept: "text/event-stream" },
        signal: controller.signal,
      });
      if (response.status === 401) {
        askForToken((await response.json()).detail);
        return;
      }
      if (!response.ok) throw new Error(`watch: ${response.status}`);
      setFeed("live", "live");
      wait = 500;
      // A reconnect may have missed changes the resume did not cover: re-read what is shown.
      touch("reset", {});
      await readEvents(response.body);
      setFeed("reconnecting", "the change feed ended; reconnecting…");
    } catch (error) {
      if (controller.signal.aborted) return;
      setFeed("reconnecting", `change feed lost (${error.message}); retrying…`);
    }
    await new Promise((resolve) => setTimeout(resolve, wait));
    wait = Math.min(RETRY_MAX_MS, wait * 2);
  }
}

async function readEvents(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replaceAll("\r\n", "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      dispatch(buffer.slice(0, end));
      buffer = buffer.slice(end + 2);
    }
  }
}

function dispatch(block) {
  const fields = { event: "message", data: "" };
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    fields[name] = name === "data" && fields.data ? `${fields.data}\n${value}` : value;
  }
  if (fields.id) view.lastEventId = fields.id;
  if (!fields.data) return;
  view.events += 1;
  $("feed").dataset.events = String(view.events);
  setFeed("live", `live: ${view.events} changes seen`);
  if (fields.event === "overflow") return; // the server closes the stream; follow() resumes
  touch(fields.event, JSON.parse(fields.data));
}

// -- wiring --------------------------------------------------------------------------------

async function guarded(load) {
  try {
    return await load();
  } catch (error) {
    if (error instanceof Unauthorized) askForToken(error.message);
    else setFeed("error", error.message);
    return null;
  }
}

async function start() {
  $("token-form").hidden = true;
  view.stream?.abort();
  const loaded = await guarded(() => Promise.all([loadFleet(), loadSessions()]));
  if (loaded) {
    guarded(loadHeatmap);
    follow();
  }
}

$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("token").value);
  $("token").value = "";
  start();
});
$("search-form").addEventListener("submit", search);
$("sort").addEventListener("change", sortBy);
$("sessions").tBodies[0].addEventListener("keydown", onRowKey);
$("sessions").tBodies[0].addEventListener("click", onRowClick);
$("close-session").addEventListener("click", backToTable);
$("next-page").addEventListener("click", () => {
  view.cursors.push(view.nextCursor);
  view.activeRow = null;
  guarded(loadSessions);
});
$("first-page").addEventListener("click", firstPage);
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && !$("session").hidden) backToTable();
  if (event.key === "/" && document.activeElement?.tagName !== "INPUT") {
    event.preventDefault();
    $("search").focus();
  }
});

start();
