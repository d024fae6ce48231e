// The berth session view: one sandbox's desktop (noVNC), terminal (xterm.js over the agent's
// PTY WebSocket), files, the editor (workpieces, their versions and proposals), timeline,
// artifacts and episode. Every request goes to this page's
// own `api/…` routes, authorized by the cookie the one-time URL set.

const base = location.pathname.endsWith('/') ? location.pathname : location.pathname + '/';
const api = base + 'api/';
const $ = (id) => document.getElementById(id);
const wsUrl = (p) => (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + p;

// What the page knows, for people debugging it and for tests.
const state = { info: null, term: null, rfb: null, artifacts: [], actions: [], playing: null, events: 0 };
window.berthSession = state;

async function getJson(url, opts) {
  const r = await fetch(url, opts);
  const body = await r.json().catch(() => null);
  if (!r.ok) {
    const e = new Error((body && body.error && body.error.message) || r.status + ' ' + r.statusText);
    e.status = r.status;
    throw e;
  }
  return body;
}

function note(id, text, error) {
  const el = $(id);
  el.textContent = text;
  el.classList.toggle('error', !!error);
}

function el(tag, props, ...children) {
  const e = document.createElement(tag);
  Object.assign(e, props || {});
  for (const c of children) e.append(c);
  return e;
}

function size(n) {
  if (n < 1024) return n + ' B';
  if (n < 1 << 20) return (n / 1024).toFixed(1) + ' KiB';
  return (n / (1 << 20)).toFixed(1) + ' MiB';
}

function goneText(info) {
  return info.gone
    ? 'The sandbox is gone (' + info.sandbox.status + '): nothing live to show.'
    : 'The sandbox is ' + info.sandbox.status + '.';
}

// Desktop -----------------------------------------------------------------------------------

async function desktop(info) {
  if (!info.desktop) {
    $('desktop-pane').hidden = true;
    return;
  }
  if (!info.running) return note('desktop-note', goneText(info));
  if (!info.vendor.novnc) {
    return note('desktop-note', 'noVNC is not installed on the controller (Debian package novnc).', true);
  }
  let RFB;
  try {
    RFB = (await import(base + 'vendor/novnc/core/rfb.js')).default;
  } catch (e) {
    return note('desktop-note', 'noVNC failed to load: ' + e.message, true);
  }
  const screen = $('desktop');
  const rfb = new RFB(screen, wsUrl(api + 'agent/vnc/websockify'));
  rfb.scaleViewport = true;
  rfb.resizeSession = false;
  rfb.addEventListener('connect', () => {
    screen.dataset.state = 'connected';
    note('desktop-note', 'Connected.');
  });
  rfb.addEventListener('disconnect', (e) => {
    screen.dataset.state = 'disconnected';
    note('desktop-note', e.detail && e.detail.clean ? 'Disconnected.' : 'The desktop connection was lost.', !e.detail.clean);
  });
  rfb.addEventListener('credentialsrequired', () => note('desktop-note', 'The desktop asks for credentials.', true));
  state.rfb = rfb;
}

// Terminal ----------------------------------------------------------------------------------

function loadScript(src) {
  return new Promise((resolve, reject) => {
    const s = el('script', { src });
    s.onload = resolve;
    s.onerror = () => reject(new Error('could not load ' + src));
    document.head.append(s);
  });
}

async function terminal(info) {
  if (!info.running) return note('terminal-note', goneText(info));
  if (!info.vendor.xterm) {
    return note('terminal-note', 'xterm.js is not installed on the controller (Debian packages node-xterm and libjs-xterm).', true);
  }
  try {
    await loadScript(base + 'vendor/xterm.js');
  } catch (e) {
    return note('terminal-note', e.message, true);
  }
  const box = $('terminal');
  const term = new window.Terminal({ cols: 100, rows: 22, scrollback: 5000 });
  term.open(box);
  try { term.fit(); } catch (_) { /* fixed size */ }
  let pty;
  try {
    pty = await getJson(api + 'agent/pty', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ cols: term.cols, rows: term.rows }),
    });
  } catch (e) {
    return note('terminal-note', 'Could not open a terminal: ' + e.message, true);
  }
  const ws = new WebSocket(wsUrl(api + 'agent/pty/' + encodeURIComponent(pty.id) + '/attach'));
  ws.binaryType = 'arraybuffer';
  const dec = new TextDecoder();
  const enc = new TextEncoder();
  ws.onopen = () => {
    box.dataset.state = 'attached';
    note('terminal-note', 'Attached to ' + pty.cmd.join(' ') + ' (' + pty.id + ').');
    term.focus();
  };
  ws.onmessage = (ev) => {
    if (typeof ev.data === 'string') {
      let m;
      try { m = JSON.parse(ev.data); } catch (_) { return; }
      if (m.exit_code !== undefined) term.write('\r\n[exited with ' + m.exit_code + ']\r\n');
      return;
    }
    term.write(dec.decode(new Uint8Array(ev.data), { stream: true }));
  };
  ws.onclose = () => {
    box.dataset.state = 'closed';
    note('terminal-note', 'The terminal closed.');
  };
  term.on('data', (d) => { if (ws.readyState === WebSocket.OPEN) ws.send(enc.encode(d)); });
  term.on('resize', (s) => {
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ resize: { cols: s.cols, rows: s.rows } }));
  });
  addEventListener('resize', () => { try { term.fit(); } catch (_) { /* fixed size */ } });
  addEventListener('pagehide', () => {
    fetch(api + 'agent/pty/' + encodeURIComponent(pty.id), { method: 'DELETE', keepalive: true });
  });
  state.term = term;
  state.pty = pty.id;
  // The terminal's text, line by line (the screen and its scrollback).
  state.termText = () => {
    const b = term._core && term._core.buffer;
    if (b && b.lines) {
      const out = [];
      for (let i = 0; i < b.lines.length; i++) out.push(b.translateBufferLineToString(i, true));
      return out.join('\n');
    }
    term.selectAll();
    const t = term.getSelection();
    term.clearSelection();
    return t;
  };
}

// Files -------------------------------------------------------------------------------------

let cwd = '~';
let home = '~';

function setCwd(path) {
  cwd = path;
  $('cwd').textContent = path;
}

async function listInto(ul, path) {
  const r = await getJson(api + 'agent/fs/list?path=' + encodeURIComponent(path));
  const entries = r.entries.slice().sort((a, b) => {
    const da = a.type === 'dir', db = b.type === 'dir';
    return da === db ? a.name.localeCompare(b.name) : (da ? -1 : 1);
  });
  ul.replaceChildren();
  for (const e of entries) {
    const li = el('li', { className: 'entry ' + e.type });
    li.dataset.path = e.path;
    if (e.type === 'dir') {
      const sub = el('ul');
      const btn = el('button', { type: 'button', textContent: '▸ ' + e.name + '/' });
      btn.onclick = async () => {
        setCwd(e.path);
        if (li.classList.toggle('open')) {
          btn.textContent = '▾ ' + e.name + '/';
          try { await listInto(sub, e.path); } catch (err) { sub.replaceChildren(el('li', { textContent: err.message })); }
        } else {
          btn.textContent = '▸ ' + e.name + '/';
          sub.replaceChildren();
        }
      };
      li.append(btn, sub);
    } else {
      const a = el('a', {
        href: api + 'agent/files?path=' + encodeURIComponent(e.path),
        textContent: e.name,
        download: e.name,
      });
      li.append(a, el('span', { className: 'size', textContent: size(e.size) }));
    }
    ul.append(li);
  }
  return r;
}

async function refreshFiles() {
  try {
    const r = await listInto($('tree'), home);
    if (home === '~') { home = r.path; setCwd(r.path); }
    note('files-note', '');
  } catch (e) {
    note('files-note', 'Could not list ' + home + ': ' + e.message, true);
  }
}

async function upload(files) {
  for (const f of files) {
    const path = cwd.replace(/\/$/, '') + '/' + f.name;
    note('upload-status', 'Uploading ' + f.name + '…');
    try {
      const r = await getJson(api + 'agent/files?path=' + encodeURIComponent(path), { method: 'PUT', body: f });
      note('upload-status', 'Uploaded ' + r.path + ' (' + r.bytes + ' bytes).');
    } catch (e) {
      note('upload-status', 'Upload of ' + f.name + ' failed: ' + e.message, true);
    }
  }
  await refreshFiles();
}

async function filesPane(info) {
  if (!info.running) {
    $('upload-input').disabled = true;
    return note('files-note', goneText(info));
  }
  $('upload-input').onchange = (ev) => { upload(Array.from(ev.target.files)); ev.target.value = ''; };
  $('files-refresh').onclick = refreshFiles;
  const drop = $('drop');
  drop.ondragover = (ev) => { ev.preventDefault(); drop.classList.add('over'); };
  drop.ondragleave = () => drop.classList.remove('over');
  drop.ondrop = (ev) => {
    ev.preventDefault();
    drop.classList.remove('over');
    upload(Array.from(ev.dataTransfer.files));
  };
  await refreshFiles();
}

// Timeline ----------------------------------------------------------------------------------

let fromSeq = 0;

function summary(ev) {
  const skip = new Set(['seq', 'at', 'kind']);
  return Object.entries(ev)
    .filter(([k]) => !skip.has(k))
    .map(([k, v]) => k + '=' + (typeof v === 'string' ? v : JSON.stringify(v)))
    .join(' ')
    .slice(0, 300);
}

async function timeline() {
  let delay = 1000;
  try {
    const page = await getJson(api + 'events?from_seq=' + fromSeq);
    const ol = $('timeline');
    for (const ev of page.events) {
      ol.append(el('li', {},
        el('time', { textContent: ev.at }),
        el('span', { className: 'kind', textContent: ev.kind }),
        el('span', { textContent: summary(ev) })));
      if (String(ev.kind).startsWith('artifact.')) artifacts();
    }
    state.events += page.events.length;
    if (page.events.length) ol.scrollTop = ol.scrollHeight;
    fromSeq = page.next_seq;
    note('timeline-note', state.events + ' events');
  } catch (e) {
    note('timeline-note', 'Timeline: ' + e.message, true);
    delay = 5000;
  }
  setTimeout(timeline, delay);
}

// Artifacts and the episode -----------------------------------------------------------------

let artifactKey = '';

async function artifacts() {
  let list;
  try {
    list = (await getJson(api + 'artifacts')).artifacts;
  } catch (e) {
    return note('artifacts-note', 'Artifacts: ' + e.message, true);
  }
  const key = list.map((a) => a.id).join(',');
  if (key === artifactKey) return;
  artifactKey = key;
  state.artifacts = list;
  const ul = $('artifacts');
  ul.replaceChildren();
  note('artifacts-note', list.length ? '' : 'No artifacts yet.');
  for (const a of list) {
    const li = el('li', {},
      el('a', { href: api + 'artifacts/' + encodeURIComponent(a.id), textContent: a.name, download: a.name }),
      el('span', { className: 'meta', textContent: a.content_type + ', ' + size(a.size) + ', ' + a.created_at }));
    li.dataset.id = a.id;
    if (a.content_type === 'video/mp4') {
      const play = el('button', { type: 'button', textContent: 'Play' });
      play.onclick = () => playArtifact(a, true);
      li.append(play);
    }
    ul.append(li);
  }
  if (!state.playing) {
    const video = list.find((a) => a.content_type === 'video/mp4');
    if (video) playArtifact(video, false);
  }
}

// The recording an artifact holds, when it holds one.
function recordingOf(a) {
  return a.kind === 'recording' ? a.source || null : null;
}

function playArtifact(a, start) {
  const v = $('player');
  state.playing = a;
  v.hidden = false;
  v.src = api + 'artifacts/' + encodeURIComponent(a.id);
  if (start) v.play().catch(() => { /* the user presses play */ });
  episode();
}

async function episode() {
  let actions;
  try {
    actions = (await getJson(api + 'episode')).actions || [];
  } catch (e) {
    return note('episode-note', 'Episode: ' + e.message, e.status !== 404);
  }
  state.actions = actions;
  const ol = $('actions');
  ol.replaceChildren();
  for (const [i, a] of actions.entries()) {
    const li = el('li', { textContent: (a.at || '') + ' ' + actionLabel(a) + (a.media_ms != null ? ' @' + (a.media_ms / 1000).toFixed(2) + 's' : '') });
    li.dataset.index = i;
    ol.append(li);
  }
  note('episode-note', actions.length ? actions.length + ' actions' : 'No actions logged.');
  drawMarkers();
}

// A logged action in a few words: its source and what it did (Anthropic's `action`, OpenAI's
// `type`, or the native input's first action), with where it clicked or what it typed.
function actionLabel(a) {
  let act = a.action;
  if (act && Array.isArray(act.actions)) act = act.actions[0];
  if (!act || typeof act !== 'object') return String(act || a.source || 'action');
  const what = act.action || act.type || 'action';
  const at = act.coordinate ? ' ' + act.coordinate.join(',') : (act.x != null ? ' ' + act.x + ',' + act.y : '');
  const text = typeof act.text === 'string' ? ' "' + act.text.slice(0, 24) + '"' : '';
  return (a.source ? a.source + ': ' : '') + what + at + text;
}

// The actions of the recording being played, with their media times.
function playingActions() {
  const rec = state.playing && recordingOf(state.playing);
  return state.actions
    .map((a, i) => ({ a, i }))
    .filter(({ a }) => a.media_ms != null && (!rec || !a.recording || a.recording === rec));
}

function drawMarkers() {
  const v = $('player');
  const bar = $('markers');
  bar.replaceChildren();
  const dur = v.duration;
  if (!state.playing || !isFinite(dur) || dur <= 0) return;
  bar.hidden = false;
  for (const { a, i } of playingActions()) {
    const m = el('button', { type: 'button', className: 'marker', title: actionLabel(a) + ' @' + (a.media_ms / 1000).toFixed(2) + 's' });
    m.style.left = Math.min(100, (a.media_ms / 1000 / dur) * 100) + '%';
    m.dataset.index = i;
    m.onclick = () => { v.currentTime = a.media_ms / 1000; };
    bar.append(m);
  }
}

function highlight() {
  const t = $('player').currentTime * 1000;
  let current = null;
  for (const { a, i } of playingActions()) if (a.media_ms <= t) current = i;
  for (const n of document.querySelectorAll('.marker, #actions li')) {
    n.classList.toggle('current', current !== null && Number(n.dataset.index) === current);
  }
}

// Editor: workpieces, their versions rendered, proposals with before / after -----------------

const wp = { list: [], current: null, version: null };
state.workpieces = wp;

function pagesOf(url, n) {
  const box = el('div', { className: 'pages' });
  if (!n) box.append(el('span', { className: 'note', textContent: 'No rendered pages.' }));
  for (let i = 1; i <= n; i++) {
    box.append(el('img', { src: url + i, alt: 'page ' + i, loading: 'lazy', title: 'page ' + i }));
  }
  return box;
}

// A sheet's cells as a table; with `other` (the version it is compared with), the cells that
// differ are marked.
function sheetTable(content, other) {
  const rows = content.rows || [];
  const was = {};
  for (const r of (other && other.rows) || []) for (const c of r.cells || []) was[c.ref] = c;
  const differs = (c, ref) => other && JSON.stringify([c && c.value, c && c.formula]) !==
    JSON.stringify([was[ref] && was[ref].value, was[ref] && was[ref].formula]);
  const t = el('table', { className: 'sheet-table' });
  const cols = new Set();
  for (const r of rows) for (const c of r.cells || []) cols.add(c.ref.replace(/[0-9]+$/, ''));
  const order = [...cols].sort((a, b) => a.length - b.length || a.localeCompare(b));
  const head = el('tr', {}, el('th', { textContent: content.sheet || '' }));
  for (const c of order) head.append(el('th', { textContent: c }));
  t.append(head);
  for (const r of rows) {
    const tr = el('tr', {}, el('th', { textContent: String(r.row) }));
    const byCol = {};
    for (const c of r.cells || []) byCol[c.ref.replace(/[0-9]+$/, '')] = c;
    for (const c of order) {
      const cell = byCol[c];
      const shown = cell ? (cell.value === null || cell.value === undefined ? '' : String(cell.value)) : '';
      const td = el('td', { textContent: shown, title: cell && cell.formula ? cell.formula : '' });
      if (differs(cell, c + r.row)) td.className = 'changed';
      tr.append(td);
    }
    t.append(tr);
  }
  return t;
}

async function showVersion() {
  const w = wp.current;
  const view = $('wp-view');
  const shown = (wp.shown = (wp.shown || 0) + 1);
  view.replaceChildren();
  if (!w) return;
  const v = w.versions.find((x) => x.version === wp.version) || w.versions[w.versions.length - 1];
  const url = api + 'workpieces/' + w.id + '/versions/' + v.version + '/pages/';
  $('wp-download').href = api + 'artifacts/' + v.artifact_id;
  $('wp-meta').textContent = w.kind + ' · ' + w.path + ' · version ' + v.version + ' of ' + w.latest_version +
    ' by ' + v.author + ' · ' + size(v.size) + (w.record ? ' · a record: the sandbox has ended' : '') +
    (w.missing ? ' · the file is gone from the sandbox' : '');
  view.append(pagesOf(url, v.preview_pages));
  if (w.kind === 'sheet') {
    try {
      const c = await getJson(api + 'workpieces/' + w.id + '/content?version=' + v.version);
      if (shown === wp.shown) view.append(sheetTable(c));
    } catch (e) {
      view.append(el('p', { className: 'note', textContent: 'Cells: ' + e.message }));
    }
  }
}

function proposalItem(w, p) {
  const li = el('li', { className: 'proposal' });
  li.dataset.status = p.status;
  li.dataset.id = p.id;
  const head = el('div', { className: 'head' },
    el('span', { className: 'status', textContent: p.status + (p.stale ? ' (stale)' : '') }),
    el('span', { textContent: p.summary }),
    el('span', { className: 'note', textContent: 'against version ' + p.base_version +
      (p.result_version ? ' → version ' + p.result_version : '') }));
  li.append(head);
  const ops = el('ol', { className: 'ops', start: 0 });
  for (const op of p.operations) {
    const { op: name, ...rest } = op;
    ops.append(el('li', {}, el('b', { textContent: name }), ' ' + JSON.stringify(rest)));
  }
  li.append(ops);
  const before = api + 'workpieces/' + w.id + '/versions/' + p.base_version + '/pages/';
  const baseV = w.versions.find((x) => x.version === p.base_version);
  li.append(el('div', { className: 'compare' },
    el('div', {}, el('h4', { textContent: 'Before (version ' + p.base_version + ')' }),
      pagesOf(before, baseV ? baseV.preview_pages : 0)),
    el('div', {}, el('h4', { textContent: 'After' }),
      pagesOf(api + 'workpieces/' + w.id + '/proposals/' + p.id + '/pages/', p.preview_pages))));
  if (w.kind === 'sheet') {
    // A sheet's change is in its cells: both tables, the changed cells marked.
    const tables = el('div', { className: 'compare' });
    li.append(tables);
    Promise.all([
      getJson(api + 'workpieces/' + w.id + '/content?version=' + p.base_version),
      getJson(api + 'workpieces/' + w.id + '/proposals/' + p.id + '/content'),
    ]).then(([before, after]) => {
      tables.append(el('div', {}, el('h4', { textContent: 'Cells before' }), sheetTable(before)),
        el('div', {}, el('h4', { textContent: 'Cells after (changed marked)' }), sheetTable(after, before)));
    }).catch((e) => tables.append(el('p', { className: 'note', textContent: 'Cells: ' + e.message })));
  }
  if (p.status === 'pending') {
    const accept = el('button', { type: 'button', className: 'accept', textContent: 'Accept' });
    const reject = el('button', { type: 'button', className: 'reject', textContent: 'Reject' });
    const decide = async (how) => {
      accept.disabled = reject.disabled = true;
      try {
        await getJson(api + 'workpieces/' + w.id + '/proposals/' + p.id + '/' + how, { method: 'POST' });
        note('editor-note', 'Proposal ' + p.id + ' ' + how + 'ed.');
      } catch (e) {
        note('editor-note', 'Could not ' + how + ' ' + p.id + ': ' + e.message, true);
      }
      await loadWorkpiece(w.id, true);
    };
    accept.addEventListener('click', () => decide('accept'));
    reject.addEventListener('click', () => decide('reject'));
    li.append(el('div', { className: 'toolbar' }, accept, reject));
  }
  return li;
}

async function loadWorkpiece(id, latest) {
  // Only the newest load draws (a refresh and a choice may overlap).
  const load = (wp.load = (wp.load || 0) + 1);
  let w;
  let proposals;
  try {
    w = await getJson(api + 'workpieces/' + id);
    proposals = (await getJson(api + 'workpieces/' + id + '/proposals')).proposals;
  } catch (e) {
    return note('editor-note', 'Workpiece ' + id + ': ' + e.message, true);
  }
  if (load !== wp.load) return;
  wp.current = w;
  if (latest || !wp.version || !w.versions.some((x) => x.version === wp.version)) wp.version = w.latest_version;
  const sel = $('wp-version');
  sel.replaceChildren(...w.versions.map((v) => el('option', {
    value: v.version, textContent: 'version ' + v.version + ' (' + v.author + ')', selected: v.version === wp.version,
  })));
  $('wp-open').disabled = !state.info.running || !state.info.desktop;
  await showVersion();
  $('wp-proposals').replaceChildren(...proposals.map((p) => proposalItem(w, p)));
  if (!proposals.length) $('wp-proposals').append(el('li', { className: 'note', textContent: 'No proposals.' }));
}

async function editor(info, onlyChanged) {
  let list;
  try {
    list = (await getJson(api + 'workpieces')).workpieces;
  } catch (e) {
    return note('editor-note', 'Workpieces: ' + e.message, true);
  }
  // Redrawn only when a workpiece, version or proposal count changed (a reviewer keeps their place).
  const sig = JSON.stringify(list.map((w) => [w.id, w.latest_version, w.pending_proposals,
    w.versions.map((v) => v.preview_pages)]));
  if (onlyChanged && sig === wp.sig) return;
  wp.sig = sig;
  wp.list = list;
  const sel = $('wp-select');
  const chosen = wp.current && wp.current.id;
  sel.replaceChildren(...wp.list.map((w) => el('option', {
    value: w.id, textContent: w.title + ' (' + w.kind + ', ' + w.pending_proposals + ' pending)', selected: w.id === chosen,
  })));
  if (!wp.list.length) {
    $('wp-view').replaceChildren();
    $('wp-proposals').replaceChildren();
    return note('editor-note', 'No workpieces yet: a run makes them with workpiece_create.');
  }
  note('editor-note', info.running ? '' : 'The sandbox has ended: versions and proposals are the record kept.');
  await loadWorkpiece(chosen || wp.list[0].id, false);
}

function editorControls(info) {
  $('wp-select').addEventListener('change', (e) => loadWorkpiece(e.target.value, true));
  $('wp-version').addEventListener('change', (e) => { wp.version = Number(e.target.value); showVersion(); });
  $('wp-open').addEventListener('click', async () => {
    if (!wp.current) return;
    try {
      const r = await getJson(api + 'workpieces/' + wp.current.id + '/open', { method: 'POST' });
      note('editor-note', 'Opened ' + r.opened + ' in ' + r.editor + ' on the desktop.');
    } catch (e) {
      note('editor-note', 'Could not open it: ' + e.message, true);
    }
  });
  editor(info);
  setInterval(() => editor(info, true), 5000);
}

// Start -------------------------------------------------------------------------------------

async function main() {
  let info;
  try {
    info = await getJson(api + 'info');
  } catch (e) {
    $('sb-status').textContent = 'Cannot load this session: ' + e.message;
    return;
  }
  state.info = info;
  const sb = info.sandbox;
  document.title = 'berth · ' + sb.id;
  $('sb-id').textContent = sb.id;
  $('sb-status').textContent = sb.profile + ' · ' + sb.status;
  const viewer = sb.viewer || {};
  if (viewer.url && viewer.kind && viewer.kind !== 'novnc' && viewer.kind !== 'none') {
    const link = $('ide-link');
    link.href = viewer.url;
    link.textContent = 'Open the IDE (' + viewer.kind + ')';
    link.hidden = false;
  }
  const v = $('player');
  v.addEventListener('loadedmetadata', drawMarkers);
  v.addEventListener('timeupdate', highlight);
  timeline();
  artifacts();
  setInterval(artifacts, 5000);
  editorControls(info);
  await Promise.all([desktop(info), terminal(info), filesPane(info)]);
}

main();
