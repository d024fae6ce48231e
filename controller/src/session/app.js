// The berth session view: one sandbox's desktop (noVNC) with the control bar (a person taking
// the controls, the clipboard, the agent's request for a person), and the panes: the browser,
// terminal (xterm.js over the agent's PTY WebSocket), files, diff, agents' runs, the editor
// (workpieces, their versions and proposals), the workspace; then timeline, artifacts and
// episode. Every request goes to this page's own `api/…` routes, authorized by the cookie the
// one-time URL set. Once the sandbox is gone, the panes show the record the controller kept.

const base = location.pathname.endsWith('/') ? location.pathname : location.pathname + '/';
const api = base + 'api/';
const $ = (id) => document.getElementById(id);
const wsUrl = (p) => (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + p;

// What the page knows, for people debugging it and for tests.
const state = {
  info: null, term: null, rfb: null, artifacts: [], actions: [], playing: null, events: 0,
  control: null, browser: null, diff: null, runs: [], workspace: null,
};
window.berthSession = state;

// An answer's error (`{"error": {"code", "message"}}`) as an Error with its status and code.
function failure(r, body) {
  const err = body && body.error;
  const e = new Error((err && err.message) || r.status + ' ' + r.statusText);
  e.status = r.status;
  e.code = err && err.code;
  return e;
}

async function getJson(url, opts) {
  const r = await fetch(url, opts);
  const body = await r.json().catch(() => null);
  if (!r.ok) throw failure(r, body);
  return body;
}

async function getText(url) {
  const r = await fetch(url);
  const text = await r.text();
  if (!r.ok) {
    let body = null;
    try { body = JSON.parse(text); } catch (_) { /* not JSON */ }
    throw failure(r, body);
  }
  return text;
}

function sendJson(url, method, body) {
  return getJson(url, { method, headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
}

// Runs `step` after `wait` ms, then again `ms` after each run ends (never two at once). `step`
// answers false to stop, or a number of ms to wait this once instead of `ms`.
function poll(step, ms, wait) {
  const run = async () => {
    let next;
    try {
      next = await step();
    } catch (e) {
      console.error(e);
      next = ms * 5;
    }
    if (next !== false) setTimeout(run, typeof next === 'number' ? next : ms);
  };
  setTimeout(run, wait || 0);
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

// HH:MM:SS, local time.
function clock(t) {
  const d = new Date(t);
  if (isNaN(d)) return String(t);
  return [d.getHours(), d.getMinutes(), d.getSeconds()].map((n) => String(n).padStart(2, '0')).join(':');
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
  try {
    ctl.RFB = (await import(base + 'vendor/novnc/core/rfb.js')).default;
  } catch (e) {
    return note('desktop-note', 'noVNC failed to load: ' + e.message, true);
  }
  connectDesktop();
}

// Connects noVNC afresh, dropping the connection there was: writable only while this page holds
// the controls (the relay keeps a connection opened before taking them view-only).
function connectDesktop() {
  const you = !!(state.control && state.control.you);
  const old = state.rfb;
  state.rfb = null;
  if (old) {
    try { old.disconnect(); } catch (_) { /* already closed */ }
  }
  const screen = $('desktop');
  screen.dataset.state = 'connecting';
  const rfb = new ctl.RFB(screen, wsUrl(api + 'agent/vnc/websockify'));
  rfb.viewOnly = !you;
  rfb.scaleViewport = true;
  rfb.resizeSession = false;
  // Only the current connection's events count (an old one's disconnect arrives late).
  const mine = (f) => (e) => { if (state.rfb === rfb) f(e); };
  // A connection that is not up within CONNECT_WAIT_MS, or is lost, is made again, waiting a
  // little longer each time (at most RETRY_MAX_MS): a desktop still starting or restarting its
  // display comes back into view on its own.
  clearTimeout(ctl.watchdog);
  ctl.watchdog = setTimeout(mine(() => {
    if (screen.dataset.state === 'connecting') retryDesktop('The desktop did not answer');
  }), CONNECT_WAIT_MS);
  rfb.addEventListener('connect', mine(() => {
    clearTimeout(ctl.watchdog);
    ctl.retries = 0;
    screen.dataset.state = 'connected';
    screen.dataset.viewOnly = String(!you);
    note('desktop-note', you ? 'Connected: you have the controls.' : 'Connected (view only).');
  }));
  rfb.addEventListener('disconnect', mine((e) => {
    clearTimeout(ctl.watchdog);
    const clean = !!(e.detail && e.detail.clean);
    screen.dataset.state = 'disconnected';
    if (clean) return note('desktop-note', 'Disconnected.');
    retryDesktop('The desktop connection was lost');
  }));
  rfb.addEventListener('credentialsrequired', mine(() => note('desktop-note', 'The desktop asks for credentials.', true)));
  state.rfb = rfb;
  ctl.rfbYou = you;
}

const CONNECT_WAIT_MS = 15000;
const RETRY_MAX_MS = 10000;

// Says why, then connects again after a wait that doubles with each retry in a row.
function retryDesktop(why) {
  const wait = Math.min(RETRY_MAX_MS, 1000 * 2 ** (ctl.retries || 0));
  ctl.retries = (ctl.retries || 0) + 1;
  note('desktop-note', why + '; connecting again in ' + Math.round(wait / 1000) + ' s.', true);
  const rfb = state.rfb;
  setTimeout(() => { if (state.rfb === rfb) connectDesktop(); }, wait);
}

// Control: a person taking the controls, the clipboard, the agent's request for a person -----

// The control calls in order: an answer is drawn only when no later call's answer was.
const ctl = { RFB: null, rfbYou: false, seq: 0, drawn: 0, renew: null, pollFailed: false, watchdog: null, retries: 0 };

async function controlCall(method, path, body) {
  const seq = ++ctl.seq;
  const c = body ? await sendJson(api + 'control' + path, method, body) : await getJson(api + 'control' + path, { method });
  if (seq > ctl.drawn) {
    ctl.drawn = seq;
    showControl(c);
  }
  return c;
}

function controlText(c) {
  if (c.you) return 'You have the controls until ' + clock(c.expires_at);
  if (!c.held) return 'The agent has the controls';
  if (c.holder === 'api_key') return 'A person using the API key has the controls';
  return 'A person in another session view has the controls';
}

function showControl(c) {
  state.control = c;
  document.body.dataset.control = c.you ? 'you' : c.held ? 'other' : 'agent';
  $('control-status').textContent = controlText(c);
  $('take-control').hidden = c.you;
  $('hand-back').hidden = !c.you;
  $('clipboard').hidden = !c.you;
  $('control-request').hidden = !c.request;
  $('request-take').hidden = c.you;
  if (c.request) $('request-text').textContent = 'The agent asks for a person: ' + c.request.reason;
  renewLater(c);
  if (ctl.RFB && ctl.rfbYou !== c.you) connectDesktop();
}

// While this page holds the controls, the lease is renewed every third of its length.
function renewLater(c) {
  if (!c.you) {
    clearTimeout(ctl.renew);
    ctl.renew = null;
    return;
  }
  if (ctl.renew) return;
  ctl.renew = setTimeout(() => {
    ctl.renew = null;
    controlAct('POST', '', {}, 'renew the controls');
  }, (c.ttl_seconds || 120) * 1000 / 3);
}

// A button's control call; its failure in #control-note.
async function controlAct(method, path, body, what) {
  try {
    await controlCall(method, path, body);
    note('control-note', '');
  } catch (e) {
    note('control-note', 'Could not ' + what + ': ' + e.message, true);
  }
}

async function refreshControl() {
  try {
    await controlCall('GET', '');
    if (ctl.pollFailed) note('control-note', '');
    ctl.pollFailed = false;
  } catch (e) {
    ctl.pollFailed = true;
    note('control-note', 'Control: ' + e.message, true);
    return 10000;
  }
}

async function clipboardSend() {
  const text = $('clipboard-text').value;
  try {
    await sendJson(api + 'agent/clipboard', 'PUT', { text });
    note('control-note', 'Pasted ' + text.length + ' characters into the sandbox.');
  } catch (e) {
    note('control-note', 'Could not paste into the sandbox: ' + e.message, true);
  }
}

async function clipboardFetch() {
  let r;
  try {
    r = await getJson(api + 'agent/clipboard');
  } catch (e) {
    return note('control-note', 'Could not copy from the sandbox: ' + e.message, true);
  }
  const text = r.text || '';
  $('clipboard-text').value = text;
  try {
    navigator.clipboard.writeText(text).catch(() => { /* not allowed here: the box has it */ });
  } catch (_) { /* no clipboard API (not a secure context) */ }
  note('control-note', r.text == null ? 'The sandbox clipboard is empty.' : 'Copied ' + text.length + ' characters from the sandbox.');
}

function controlGone() {
  $('control-status').textContent = 'The sandbox is gone';
  for (const id of ['take-control', 'hand-back', 'clipboard', 'control-request']) $(id).hidden = true;
  document.body.dataset.control = 'agent';
}

function controlBar(info) {
  state.control = info.control || null;
  if (info.gone) return controlGone();
  const take = () => controlAct('POST', '', {}, 'take the controls');
  $('take-control').onclick = take;
  $('request-take').onclick = take;
  $('hand-back').onclick = () => controlAct('DELETE', '', null, 'hand back the controls');
  $('request-decline').onclick = () => controlAct('POST', '/decline', {}, 'decline the request');
  $('clipboard-send').onclick = clipboardSend;
  $('clipboard-fetch').onclick = clipboardFetch;
  if (info.control) showControl(info.control);
  poll(refreshControl, 2000, info.control ? 2000 : 0);
  // Leaving the page hands the controls back rather than holding the agent off until expiry.
  addEventListener('pagehide', () => {
    if (state.control && state.control.you) fetch(api + 'control', { method: 'DELETE', keepalive: true });
  });
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
    pty = await sendJson(api + 'agent/pty', 'POST', { cols: term.cols, rows: term.rows });
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
  state.termText = () => termText(term);
}

// The terminal's text, line by line (the screen and its scrollback).
function termText(term) {
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

// Panes showing the sandbox live or, once it is gone, the record kept -----------------------

function recordText(what, at) {
  return 'A record: ' + what + ' when the sandbox ended' + (at ? ' (' + at + ')' : '');
}

// Marks pane `name` live or a record, and writes its note: the record's, the answer's error and
// `extra` (what the pane adds).
function paneShown(name, answer, what, extra) {
  const pane = $(name + '-pane');
  pane.dataset.record = String(!!answer.record);
  pane.dataset.state = answer.record ? 'record' : answer.error ? 'error' : 'live';
  const parts = [answer.record ? recordText(what, answer.taken_at) : '', answer.error, extra];
  note(name + '-note', parts.filter(Boolean).join(' · '), !!answer.error);
}

function paneFailed(name, what, e) {
  $(name + '-pane').dataset.state = 'error';
  note(name + '-note', what + ': ' + e.message, true);
}

// A value in a few words: '—' for none, objects as compact JSON.
function brief(v) {
  if (v === null || v === undefined || v === '') return '—';
  return typeof v === 'object' ? JSON.stringify(v) : String(v);
}

// Browser: the tabs and the active one's screenshot -----------------------------------------

const shot = { url: null, tabs: '' };

async function browserPane() {
  let b;
  try {
    b = await getJson(api + 'browser');
  } catch (e) {
    paneFailed('browser', 'Browser', e);
    return 10000;
  }
  state.browser = b;
  const tabs = b.tabs || [];
  drawTabs(tabs);
  const active = tabs.find((t) => t.active);
  const missing = active ? await browserShot(active.id) : 'No active tab.';
  paneShown('browser', b, 'the browser as it was', missing);
  return !b.record;
}

function drawTabs(tabs) {
  const sig = JSON.stringify(tabs);
  if (sig === shot.tabs) return;
  shot.tabs = sig;
  $('browser-tabs').replaceChildren(...tabs.map((t) => {
    const li = el('li', { className: t.active ? 'active' : '' },
      el('span', { className: 'title', textContent: t.title || '(untitled)' }),
      el('span', { className: 'url', textContent: t.url }));
    li.dataset.id = t.id;
    li.dataset.active = String(!!t.active);
    return li;
  }));
}

// Shows the tab's screenshot once it has loaded; answers what went wrong, or ''.
async function browserShot(tab) {
  const img = $('browser-view');
  try {
    const r = await fetch(api + 'browser/screenshot?tab=' + encodeURIComponent(tab));
    if (r.status === 404) {
      img.hidden = true;
      return 'No screenshot of this tab.';
    }
    if (!r.ok) throw failure(r, null);
    const old = shot.url;
    shot.url = URL.createObjectURL(await r.blob());
    img.src = shot.url;
    img.dataset.tab = tab;
    img.hidden = false;
    await img.decode().catch(() => { /* drawn as it can be */ });
    if (old) URL.revokeObjectURL(old);
    return '';
  } catch (e) {
    return 'Screenshot: ' + e.message;
  }
}

// Diff: each repository's commits and changed files, a file's diff on a click -----------------

async function diffPane() {
  let d;
  try {
    d = await getJson(api + 'diff');
  } catch (e) {
    return paneFailed('diff', 'Diff', e);
  }
  state.diff = d;
  const repos = d.repos || [];
  $('diff-files').replaceChildren(...repos.map(repoBlock));
  paneShown('diff', d, 'the diff as it was', repos.length ? '' : 'No repositories.');
  $('diff-pane').dataset.state = 'loaded';
}

function repoBlock(repo) {
  const about = [repo.branch ? 'on ' + repo.branch : 'no branch', repo.base_name ? 'against ' + repo.base_name : '',
    repo.head ? 'at ' + String(repo.head).slice(0, 7) : ''];
  const box = el('div', { className: 'repo' },
    el('h3', {}, el('code', { textContent: repo.path }), ' ' + about.filter(Boolean).join(' · ')));
  box.dataset.repo = repo.path;
  if (repo.error) box.append(el('p', { className: 'note error', textContent: repo.error }));
  const commits = repo.commits || [];
  if (commits.length) {
    box.append(el('table', { className: 'commits' }, ...commits.map((c) => el('tr', {},
      el('td', {}, el('code', { textContent: String(c.sha || '').slice(0, 7) })),
      el('td', { textContent: c.subject }),
      el('td', { className: 'meta', textContent: c.author + ', ' + c.at })))));
  }
  const files = repo.files || [];
  if (!files.length) box.append(el('p', { className: 'note', textContent: 'No changed files.' }));
  box.append(el('ul', { className: 'files' }, ...files.map((f) => fileItem(repo, f))));
  return box;
}

function fileItem(repo, f) {
  const counted = f.added != null || f.removed != null;
  const badge = f.binary ? 'binary' : f.bytes != null ? size(f.bytes) : '';
  const btn = el('button', { type: 'button', className: 'file' },
    el('span', { className: 'status ' + f.status, textContent: f.status }),
    el('code', { className: 'path', textContent: f.path }),
    counted ? el('span', { className: 'added', textContent: '+' + (f.added || 0) }) : '',
    counted ? el('span', { className: 'removed', textContent: '−' + (f.removed || 0) }) : '',
    badge ? el('span', { className: 'badge', textContent: badge }) : '');
  const li = el('li', {}, btn);
  li.dataset.repo = repo.path;
  li.dataset.path = f.path;
  li.dataset.status = f.status;
  btn.onclick = () => toggleFileDiff(li);
  return li;
}

// The file's diff below it: loaded on the first click (again only after a failure), then shown
// or hidden.
async function toggleFileDiff(li) {
  const had = li.querySelector('.file-diff');
  if (had && !had.classList.contains('failed')) {
    had.hidden = !had.hidden;
    return;
  }
  if (had) had.remove();
  const box = el('div', { className: 'file-diff' }, el('p', { className: 'note', textContent: 'Loading…' }));
  li.append(box);
  const q = 'repo=' + encodeURIComponent(li.dataset.repo) + '&path=' + encodeURIComponent(li.dataset.path);
  try {
    box.replaceChildren(...fileDiff(await getJson(api + 'diff/file?' + q), q, box));
  } catch (e) {
    box.classList.add('failed');
    box.replaceChildren(el('p', { className: 'note error', textContent: 'The diff of ' + li.dataset.path + ': ' + e.message }));
  }
}

// A huge diff arrives as its first and last lines; the whole is read by range on demand.
function hugeDiff(d, q, box) {
  const p = d.preview || { head: '', tail: '', omitted_bytes: d.bytes };
  const load = el('button', { type: 'button', className: 'load-diff', textContent: 'Load the whole diff (' + size(d.bytes) + ')' });
  load.addEventListener('click', async () => {
    load.disabled = true;
    let text = '';
    let read = 0;
    try {
      while (read < d.bytes) {
        const part = await getJson(api + 'diff/file?' + q + '&offset=' + read);
        if (!part.diff) break;
        text += part.diff;
        read += new TextEncoder().encode(part.diff).length;
        load.textContent = 'Loading… ' + size(read) + ' of ' + size(d.bytes);
      }
      box.replaceChildren(...fileDiff({ ...d, huge: false, preview: null, diff: text }));
    } catch (e) {
      load.disabled = false;
      load.textContent = 'Loading failed (' + e.message + '): try again';
    }
  });
  const gap = el('p', { className: 'note skipped gap', textContent: '… ' + size(p.omitted_bytes) + ' not shown …' });
  return [el('p', { className: 'note', textContent: size(d.bytes) + ' of diff: its first and last lines' }),
    ...fileDiff({ ...d, huge: false, diff: p.head }), gap, ...fileDiff({ ...d, huge: false, diff: p.tail, inHunk: true }), load];
}

function fileDiff(d, q, box) {
  const said = (t) => [el('p', { className: 'note skipped', textContent: t })];
  if (d.binary) return said('binary file: not shown');
  if (d.huge) return hugeDiff(d, q, box);
  if (!d.diff) return said('No change in the text.');
  const pre = el('pre', { className: 'diff' });
  // A huge diff's tail starts inside a hunk.
  let inHunk = !!d.inHunk;
  for (const line of d.diff.replace(/\n$/, '').split('\n')) {
    if (line.startsWith('diff ')) inHunk = false;
    if (line.startsWith('@@')) inHunk = true;
    const kind = line.startsWith('@@') ? 'hunk' : !inHunk ? 'meta' : line[0] === '+' ? 'add' : line[0] === '-' ? 'del' : 'ctx';
    pre.append(el('span', { className: kind, textContent: line + '\n' }));
  }
  return d.truncated ? [pre, ...said('The diff is cut short here.')] : [pre];
}

// Agents: the runs, their last lines, the whole output on demand -----------------------------

let runItems = new Map(); // run id → { li, sig }

async function runsPane() {
  let r;
  try {
    r = await getJson(api + 'runs');
  } catch (e) {
    paneFailed('agents', 'Runs', e);
    return 15000;
  }
  state.runs = r.runs || [];
  drawRuns(state.runs);
  paneShown('agents', r, "the agents' runs as they were", state.runs.length ? '' : 'No runs yet.');
  return !r.record;
}

// Redraws only the runs that changed; a run whose whole output is loaded keeps it.
function drawRuns(runs) {
  const next = new Map();
  const items = runs.map((run) => {
    const sig = JSON.stringify(run);
    const had = runItems.get(run.id);
    let li = had && had.li;
    if (!had || had.sig !== sig) {
      if (li && li.dataset.whole === 'true') {
        li.querySelector('.run-head').replaceWith(runHead(run));
      } else {
        const fresh = runItem(run);
        if (li) li.replaceWith(fresh);
        li = fresh;
      }
    }
    next.set(run.id, { li, sig });
    return li;
  });
  runItems = next;
  const ul = $('runs');
  if (items.length !== ul.children.length || items.some((li, i) => ul.children[i] !== li)) ul.replaceChildren(...items);
}

function runHead(run) {
  const cmd = Array.isArray(run.command) ? run.command.join(' ') : String(run.command);
  const times = ['by ' + run.started_by, 'started ' + run.started_at, run.ended_at ? 'ended ' + run.ended_at : '',
    run.exit_code != null ? 'exit code ' + run.exit_code : ''];
  return el('div', { className: 'run-head' },
    el('code', { className: 'command', textContent: cmd }),
    el('span', { className: 'status', textContent: run.status }),
    el('span', { className: 'meta', textContent: times.filter(Boolean).join(' · ') }));
}

function runItem(run) {
  const pre = el('pre', { className: 'output', textContent: (run.tail || []).join('\n') });
  const li = el('li', { className: 'run' }, runHead(run), pre);
  li.dataset.run = run.id;
  if (run.preview) li.append(outputLoader(run, li, pre));
  return li;
}

function outputLoader(run, li, pre) {
  const said = el('span', { className: 'note', textContent: 'last lines of ' + run.bytes + ' bytes' });
  const btn = el('button', { type: 'button', className: 'load-output', textContent: 'Load the whole output' });
  btn.onclick = async () => {
    btn.disabled = true;
    try {
      pre.textContent = await getText(api + 'runs/' + encodeURIComponent(run.id) + '/output');
      li.dataset.whole = 'true';
      said.textContent = 'the whole output';
      btn.hidden = true;
    } catch (e) {
      said.textContent = 'Could not load the output: ' + e.message;
      btn.disabled = false;
    }
  };
  return el('div', { className: 'toolbar' }, said, btn);
}

// Workspace: what the sandbox is made of ---------------------------------------------------

async function workspacePane() {
  let w;
  try {
    w = await getJson(api + 'workspace');
  } catch (e) {
    return paneFailed('workspace', 'Workspace', e);
  }
  state.workspace = w;
  const dl = $('workspace');
  dl.replaceChildren();
  for (const [key, label, value] of workspaceRows(w)) {
    const dd = el('dd', { textContent: value });
    dd.dataset.key = key;
    dl.append(el('dt', { textContent: label }), dd);
  }
  paneShown('workspace', w, 'the workspace as it was');
}

// [key, label, text] for each fact; lists one item a line.
function workspaceRows(w) {
  const lines = (xs, f) => (xs && xs.length ? xs.map(f).join('\n') : '—');
  const lease = w.lease && [w.lease.id, w.lease.thread_id ? 'thread ' + w.lease.thread_id : '',
    'until ' + w.lease.expires_at].filter(Boolean).join(' · ');
  return [
    ['id', 'id', brief(w.id)],
    ['profile', 'profile', brief(w.profile)],
    ['image_ref', 'image', brief(w.image_ref)],
    ['status', 'status', brief(w.status)],
    ['created_at', 'created', brief(w.created_at)],
    ['expires_at', 'expires', brief(w.expires_at)],
    ['screen', 'screen', brief(w.screen)],
    ['lease', 'lease', brief(lease)],
    ['labels', 'labels', lines(Object.entries(w.labels || {}), ([k, v]) => k + '=' + v)],
    ['workdir', 'working directory', brief(w.workdir)],
    ['repositories', 'repositories', lines(w.repositories, (r) => r.path + (r.remote ? ' ← ' + r.remote : ''))],
    ['secrets', 'secrets', lines(w.secrets, String)],
    ['credentials', 'credentials', lines(w.credentials, (c) => c.host + ' (' + c.header + ')')],
    ['egress', 'egress', brief(w.egress)],
    ['limits', 'limits', brief(w.limits)],
    ['endpoints', 'endpoints', lines(Object.entries(w.endpoints || {}).filter(([, u]) => u), ([k, u]) => k + ': ' + u)],
  ];
}

function panes() {
  $('diff-refresh').onclick = diffPane;
  poll(browserPane, 2000);
  poll(runsPane, 5000);
  diffPane();
  workspacePane();
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
  controlBar(info);
  panes();
  await Promise.all([desktop(info), terminal(info), filesPane(info)]);
}

main();
