// The berth session view: one sandbox's desktop (noVNC), terminal (xterm.js over the agent's
// PTY WebSocket), files, timeline, artifacts and episode. Every request goes to this page's
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
  await Promise.all([desktop(info), terminal(info), filesPane(info)]);
}

main();
