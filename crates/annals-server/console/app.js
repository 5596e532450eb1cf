// The Annals console: plain script, no build step, no dependency. Every request goes to the
// server's public API (/v1, /metrics) with the API key the user gave, kept in sessionStorage
// (this tab only). Everything shown from the store is put in the page as text, never as HTML.
'use strict';

const KEY = 'annals.key';
const main = document.getElementById('main');
const errorBox = document.getElementById('error');
const keyForm = document.getElementById('key-form');
const keyInput = document.getElementById('key-input');
const headBadge = document.getElementById('head-badge');
const exchangeTab = document.querySelector('nav a[data-page="exchange"]');

// What the current page runs in the background; stopped when the page changes.
let stops = [];
function onLeave(stop) { stops.push(stop); }

class ApiError extends Error {
  constructor(status, message, kind) {
    super(message);
    this.status = status;
    this.kind = kind;
  }
}

// ---- The API ----------------------------------------------------------------------------

function authHeaders() {
  const key = sessionStorage.getItem(KEY);
  return key ? { Authorization: 'Bearer ' + key } : {};
}

async function api(path, options = {}) {
  const usedKey = sessionStorage.getItem(KEY);
  const headers = Object.assign({ Accept: 'application/json' }, authHeaders(), options.headers || {});
  let response;
  try {
    response = await fetch(path, Object.assign({}, options, { headers }));
  } catch (e) {
    throw new ApiError(0, 'the server did not answer: ' + e.message, 'network');
  }
  if (!response.ok) {
    let body = null;
    try { body = await response.json(); } catch (_) { /* not JSON */ }
    const message = body && body.error ? body.error : response.status + ' ' + response.statusText;
    // A refusal of a key the user has since replaced asks for nothing.
    if (response.status === 401 && sessionStorage.getItem(KEY) === usedKey) askForKey(message);
    throw new ApiError(response.status, message, body && body.kind);
  }
  return response;
}

async function apiJson(path, options) {
  return (await api(path, options)).json();
}

function askForKey(message) {
  keyForm.hidden = false;
  const label = keyForm.querySelector('label');
  label.textContent = (sessionStorage.getItem(KEY) ? 'The key was refused (' + message + '). ' : '') +
    'This server asks for an API key. It is kept for this tab only.';
  keyInput.focus();
}

keyForm.addEventListener('submit', (e) => {
  e.preventDefault();
  sessionStorage.setItem(KEY, keyInput.value.trim());
  keyInput.value = '';
  keyForm.hidden = true;
  route();
  findExchange();
});

function showError(e) {
  // A missing or refused key is asked for in the key form, which says why; a red banner
  // beside it would greet a keyed server with an error before the key was even asked for.
  if (e instanceof ApiError && e.status === 401 && !keyForm.hidden) return;
  errorBox.hidden = false;
  errorBox.textContent = e instanceof ApiError && e.status
    ? 'The server answered ' + e.status + (e.kind ? ' (' + e.kind + ')' : '') + ': ' + e.message
    : String(e.message || e);
}

function clearError() {
  errorBox.hidden = true;
  errorBox.textContent = '';
}

// ---- Small DOM helpers -------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith('on')) node.addEventListener(name.slice(2), value);
    else if (name === 'text') node.textContent = value;
    else node.setAttribute(name, value === true ? '' : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// A column header; '#' first marks a column of numbers (aligned right).
function header(text) {
  return text.startsWith('#') ? el('th', { class: 'num', text: text.slice(1) }) : el('th', { text });
}

function labelled(text, input, cls) {
  return el('label', { class: cls }, text, input);
}

function fmt(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return '-';
  if (Math.abs(n) >= 1e6) return (n / 1e6).toFixed(2) + 'M';
  if (Math.abs(n) >= 1e4) return (n / 1e3).toFixed(1) + 'K';
  return Number.isInteger(n) ? String(n) : n.toFixed(1);
}

function bytes(n) {
  if (n === null || n === undefined) return '-';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return (i === 0 ? String(n) : n.toFixed(1)) + ' ' + units[i];
}

function time(us) {
  if (!us) return '';
  return new Date(us / 1000).toISOString().replace('T', ' ').replace('Z', '');
}

function byteSize(text) {
  return new TextEncoder().encode(text || '').length;
}

// ---- Queries: the builder's state, in the URL -------------------------------------------

function splitList(text) {
  return text.split(',').map((s) => s.trim()).filter((s) => s.length > 0);
}

// The page's parameters, after `#/page?`.
function params() {
  const hash = location.hash || '#/events';
  const at = hash.indexOf('?');
  return new URLSearchParams(at < 0 ? '' : hash.slice(at + 1));
}

function pageName() {
  const hash = location.hash || '#/events';
  const at = hash.indexOf('?');
  return (at < 0 ? hash : hash.slice(0, at)).replace(/^#\//, '') || 'events';
}

function setParams(page, values) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(values)) {
    if (v !== '' && v !== null && v !== undefined && v !== false) p.set(k, v);
  }
  const text = p.toString();
  const target = '#/' + page + (text ? '?' + text : '');
  if (location.hash !== target) location.hash = target;
  else route();
}

function queryFromParams(p) {
  let items = [];
  try { items = JSON.parse(p.get('q') || '[]'); } catch (_) { items = []; }
  if (!Array.isArray(items)) items = [];
  return items.map((i) => ({ types: i.types || [], tags: i.tags || [] }));
}

// The builder: items OR-ed, each with its types and tags.
function queryBuilder(items, onChange) {
  const box = el('fieldset', {}, el('legend', { text: 'Query: events matching any item (none: every event)' }));
  const list = el('div');
  box.append(list);
  function draw() {
    list.replaceChildren();
    items.forEach((item, i) => {
      const types = el('input', { class: 'wide', value: item.types.join(', '), 'aria-label': 'Types of item ' + (i + 1), placeholder: 'any type' });
      const tags = el('input', { class: 'wide', value: item.tags.join(', '), 'aria-label': 'Tags of item ' + (i + 1), placeholder: 'no tag required' });
      types.addEventListener('input', () => { item.types = splitList(types.value); });
      tags.addEventListener('input', () => { item.tags = splitList(tags.value); });
      list.append(el('div', { class: 'item' },
        labelled('Types (one of, comma-separated)', types),
        labelled('Tags (all of, comma-separated)', tags),
        el('button', { type: 'button', onclick: () => { items.splice(i, 1); draw(); onChange(); } }, 'Remove')));
    });
  }
  draw();
  box.append(el('button', { type: 'button', onclick: () => { items.push({ types: [], tags: [] }); draw(); } }, 'Add item'));
  return box;
}

function queryJson(items) {
  return { items: items.filter((i) => i.types.length || i.tags.length).map((i) => {
    const out = {};
    if (i.types.length) out.types = i.types;
    if (i.tags.length) out.tags = i.tags;
    return out;
  }) };
}

function shellQuote(text) {
  return "'" + text.replace(/'/g, "'\\''") + "'";
}

// ---- Events ------------------------------------------------------------------------------

async function eventsPage() {
  const p = params();
  const items = queryFromParams(p);
  const opts = {
    from: p.get('from') || '', after: p.get('after') || '',
    limit: p.get('limit') || '50', backwards: p.get('backwards') === '1',
  };
  const from = el('input', { type: 'number', min: '0', value: opts.from, 'aria-label': 'From position' });
  const after = el('input', { type: 'number', min: '0', value: opts.after, 'aria-label': 'After position' });
  const limit = el('input', { type: 'number', min: '1', max: '1000', value: opts.limit, 'aria-label': 'Limit' });
  const backwards = el('input', { type: 'checkbox', checked: opts.backwards });
  const submit = () => setParams('events', {
    q: JSON.stringify(items), from: from.value, after: after.value, limit: limit.value,
    backwards: backwards.checked ? '1' : '',
  });
  const form = el('form', { onsubmit: (e) => { e.preventDefault(); submit(); } },
    queryBuilder(items, submit),
    el('div', { class: 'row' },
      labelled('From (inclusive)', from), labelled('After (exclusive)', after),
      labelled('Limit', limit), labelled('Backwards', backwards, 'inline'),
      el('button', { type: 'submit', class: 'primary' }, 'Read'),
      el('a', { href: '#/live?' + new URLSearchParams({ q: JSON.stringify(items) }) }, 'Follow live')));
  const results = el('div', { 'aria-live': 'polite' });
  main.replaceChildren(el('h2', { text: 'Events' }), form, results);

  const query = queryJson(items);
  const options = {};
  if (opts.from !== '') options.from = Number(opts.from);
  if (opts.after !== '') options.after = Number(opts.after);
  options.limit = Math.min(Math.max(Number(opts.limit) || 50, 1), 1000);
  if (opts.backwards) options.backwards = true;
  const path = '/v1/read?query=' + encodeURIComponent(JSON.stringify(query)) +
    '&options=' + encodeURIComponent(JSON.stringify(options));
  const events = await apiJson(path);
  const base = location.origin + '/v1';
  results.append(
    el('p', { class: 'muted', text: events.length + (events.length === 1 ? ' event' : ' events') +
      (events.length === options.limit ? ' (a page; more may follow)' : '') }),
    eventTable(events, items),
    pager(events, options, items),
    el('details', { class: 'commands' }, el('summary', { text: 'The same read as a command' }),
      el('pre', { text: 'curl -sG ' + shellQuote(base + '/read') + ' --data-urlencode ' +
        shellQuote('query=' + JSON.stringify(query)) + ' --data-urlencode ' +
        shellQuote('options=' + JSON.stringify(options)) }),
      el('pre', { text: 'annals read --url ' + shellQuote(location.origin) + ' --query ' +
        shellQuote(JSON.stringify(query)) +
        (options.from !== undefined ? ' --from ' + options.from : '') +
        (options.after !== undefined ? ' --after ' + options.after : '') +
        ' --limit ' + options.limit + (options.backwards ? ' --backwards' : '') })));
}

// The next page: after the last position going forwards, before it going backwards.
function pager(events, options, items) {
  if (events.length < options.limit) return el('span');
  const last = events[events.length - 1].position;
  const next = options.backwards
    ? { from: String(last - 1), after: '' }
    : { from: '', after: String(last) };
  if (options.backwards && last <= 1) return el('span');
  return el('p', {}, el('button', { type: 'button', onclick: () => setParams('events', {
    q: JSON.stringify(items), from: next.from, after: next.after, limit: String(options.limit),
    backwards: options.backwards ? '1' : '' }) }, 'Next page'));
}

// Narrows the query: every item gains the tag (or the type).
function narrowed(items, what, value) {
  const base = items.length ? items : [{ types: [], tags: [] }];
  return base.map((i) => what === 'tag'
    ? { types: i.types, tags: i.tags.includes(value) ? i.tags : i.tags.concat([value]) }
    : { types: [value], tags: i.tags });
}

function chip(text, onclick, title) {
  return el('button', { type: 'button', class: 'chip', title, onclick: (e) => { e.stopPropagation(); onclick(); } }, text);
}

function eventTable(events, items) {
  const body = el('tbody');
  for (const event of events) {
    const row = el('tr', { class: 'event', tabindex: '0', 'aria-expanded': 'false' },
      el('td', { class: 'num', text: event.position }),
      el('td', {}, chip(event.type, () => setParams('events', { q: JSON.stringify(narrowed(items, 'type', event.type)) }), 'Narrow to this type')),
      el('td', {}, (event.tags || []).map((t) => chip(t, () => setParams('events', { q: JSON.stringify(narrowed(items, 'tag', t)) }), 'Narrow to this tag'))),
      el('td', { class: 'hide-narrow', text: time(event.appendedAt) }),
      el('td', { class: 'num hide-narrow', text: event.erased ? 'erased' : byteSize(event.data) }));
    if (event.erased) row.classList.add('erased');
    const toggle = () => {
      const open = row.nextSibling && row.nextSibling.classList && row.nextSibling.classList.contains('detail');
      if (open) { row.nextSibling.remove(); row.setAttribute('aria-expanded', 'false'); return; }
      row.after(el('tr', { class: 'detail' }, el('td', { colspan: '5' }, eventDetail(event))));
      row.setAttribute('aria-expanded', 'true');
    };
    row.addEventListener('click', toggle);
    row.addEventListener('keydown', (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); toggle(); } });
    body.append(row);
  }
  return el('table', {},
    el('thead', {}, el('tr', {}, el('th', { class: 'num', text: 'Position' }), el('th', { text: 'Type' }),
      el('th', { text: 'Tags' }), el('th', { class: 'hide-narrow', text: 'Appended (UTC)' }),
      el('th', { class: 'num hide-narrow', text: 'Bytes' }))),
    body);
}

function eventDetail(event) {
  if (event.erased) {
    return el('div', { class: 'muted', text: 'The data subject of this event was erased: its data and metadata are gone; its position, type and tags remain.' });
  }
  let data = event.data;
  let kind = 'data (text)';
  try {
    data = JSON.stringify(JSON.parse(event.data), null, 2);
    kind = 'data (JSON)';
  } catch (_) { /* shown as text */ }
  const parts = [el('div', { class: 'muted', text: kind }), el('pre', { class: 'data', text: data })];
  if (event.id) parts.push(el('div', { class: 'muted', text: 'id ' + event.id }));
  if (event.metadata !== undefined) {
    parts.push(el('div', { class: 'muted', text: 'metadata' }),
      el('pre', { text: JSON.stringify(event.metadata, null, 2) }));
  }
  parts.push(el('div', { class: 'muted schema-version', text: 'schema: ' + checkedAgainst(event) }));
  return el('div', {}, parts);
}

// Which version of its type's schema an event was checked against when it was appended, as
// reads give it.
function checkedAgainst(event) {
  const against = event.schema;
  if (!against) return 'not checked (its type had no schema then, or its enforcement was off)';
  return 'checked against version ' + against.version + (against.enforcement === 'warn' ? ' (warn: stored whether it fit or not)' : '');
}

// ---- Live --------------------------------------------------------------------------------

const LIVE_KEPT = 500;

async function livePage() {
  const p = params();
  const items = queryFromParams(p);
  const after = el('input', { type: 'number', min: '0', value: p.get('after') || '', 'aria-label': 'After position', placeholder: 'the head' });
  const status = el('span', { class: 'muted', 'aria-live': 'polite' });
  const rate = el('span', { class: 'muted' });
  const pause = el('button', { type: 'button' }, 'Pause');
  const body = el('tbody');
  const form = el('form', { onsubmit: (e) => { e.preventDefault(); setParams('live', { q: JSON.stringify(items), after: after.value }); } },
    queryBuilder(items, () => {}),
    el('div', { class: 'row' }, labelled('After position (empty: from now on)', after),
      el('button', { type: 'submit', class: 'primary' }, 'Follow'), pause, status, rate));
  main.replaceChildren(el('h2', { text: 'Live' }), form,
    el('table', {}, el('thead', {}, el('tr', {}, el('th', { class: 'num', text: 'Position' }),
      el('th', { text: 'Type' }), el('th', { text: 'Tags' }), el('th', { class: 'hide-narrow', text: 'Appended (UTC)' }),
      el('th', { class: 'num hide-narrow', text: 'Bytes' }))), body));

  let start = p.get('after');
  if (start === null || start === '') start = String((await apiJson('/v1/head')).head);
  const query = queryJson(items);
  const controller = new AbortController();
  onLeave(() => controller.abort());
  let paused = false;
  let pending = [];
  let received = 0;
  const times = [];
  pause.addEventListener('click', () => {
    paused = !paused;
    pause.textContent = paused ? 'Resume' : 'Pause';
    status.textContent = paused ? 'paused (events are counted, not shown)' : 'following';
  });
  // Rows are added once per frame, newest on top, and only the latest LIVE_KEPT are kept.
  let drawing = false;
  function draw() {
    drawing = false;
    if (paused || pending.length === 0) { pending = []; return; }
    const batch = pending.slice(-LIVE_KEPT);
    pending = [];
    const rows = batch.reverse().map((e) => el('tr', {},
      el('td', { class: 'num', text: e.position }), el('td', { text: e.type }),
      el('td', { text: (e.tags || []).join(', ') }), el('td', { class: 'hide-narrow', text: time(e.appendedAt) }),
      el('td', { class: 'num hide-narrow', text: e.erased ? 'erased' : byteSize(e.data) })));
    body.prepend(...rows);
    while (body.childElementCount > LIVE_KEPT) body.lastElementChild.remove();
  }
  const timer = setInterval(() => {
    const now = Date.now();
    while (times.length && now - times[0][0] > 5000) times.shift();
    const count = times.reduce((n, t) => n + t[1], 0);
    rate.textContent = fmt(count / 5) + ' events/s; ' + received + ' received';
  }, 500);
  onLeave(() => clearInterval(timer));
  status.textContent = 'following after position ' + start;
  const path = '/v1/subscribe?query=' + encodeURIComponent(JSON.stringify(query)) + '&after=' + encodeURIComponent(start);
  const response = await api(path, { signal: controller.signal, headers: { Accept: 'application/x-ndjson' } });
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffered = '';
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffered += decoder.decode(value, { stream: true });
      const lines = buffered.split('\n');
      buffered = lines.pop();
      let n = 0;
      for (const line of lines) {
        if (!line.trim()) continue;
        const event = JSON.parse(line);
        if (event.error) { showError(new ApiError(200, event.error, event.kind)); continue; }
        pending.push(event);
        n += 1;
      }
      received += n;
      times.push([Date.now(), n]);
      if (pending.length > LIVE_KEPT) pending = pending.slice(-LIVE_KEPT);
      if (!drawing) { drawing = true; requestAnimationFrame(draw); }
    }
    status.textContent = 'the server ended the stream';
  } catch (e) {
    if (e.name !== 'AbortError') throw e;
  }
}

// ---- Store -------------------------------------------------------------------------------

// Prometheus text: name{labels} -> value.
function parseMetrics(text) {
  const out = new Map();
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const space = line.lastIndexOf(' ');
    out.set(line.slice(0, space), Number(line.slice(space + 1)));
  }
  return out;
}

function metric(m, name) { return m.has(name) ? m.get(name) : null; }

function sumPrefix(m, prefix) {
  let total = 0;
  for (const [k, v] of m) if (k === prefix || k.startsWith(prefix + '{')) total += v;
  return total;
}

// The quantile of a Prometheus histogram, by its buckets.
function histogramQuantile(m, name, q) {
  const buckets = [];
  for (const [k, v] of m) {
    const match = k.match(new RegExp('^' + name + '_bucket\\{.*le="([^"]+)"\\}$'));
    if (match) buckets.push([match[1] === '+Inf' ? Infinity : Number(match[1]), v]);
  }
  buckets.sort((a, b) => a[0] - b[0]);
  const total = buckets.length ? buckets[buckets.length - 1][1] : 0;
  if (!total) return null;
  const found = buckets.find((b) => b[1] >= q * total);
  return found ? found[0] : null;
}

function card(title, value, bad) {
  return el('div', { class: 'card' + (bad ? ' bad' : '') }, el('div', { class: 'muted', text: title }), el('div', { class: 'value', text: value }));
}

function chart(title, series) {
  const canvas = el('canvas', { width: '600', height: '120', role: 'img', 'aria-label': title });
  const box = el('div', {}, el('h3', { text: title }), canvas);
  box.redraw = () => {
    // Drawn at the size shown, so that text is not stretched.
    if (canvas.clientWidth > 0 && canvas.width !== canvas.clientWidth) canvas.width = canvas.clientWidth;
    const ctx = canvas.getContext('2d');
    const w = canvas.width;
    const h = canvas.height;
    ctx.clearRect(0, 0, w, h);
    const max = Math.max(1, ...series.map((s) => s[1]));
    ctx.fillStyle = '#57606a';
    ctx.font = '12px sans-serif';
    if (!series.length) {
      // A rate needs two samples of the counters; the second is taken shortly.
      ctx.fillText('collecting: the first rate appears with the next sample', 4, h / 2);
      canvas.setAttribute('aria-label', title + ': collecting');
      return;
    }
    ctx.fillText(fmt(max) + '/s', 4, 12);
    ctx.strokeStyle = '#0b5cad';
    ctx.lineWidth = 2;
    ctx.beginPath();
    series.forEach((s, i) => {
      const x = (i / Math.max(1, series.length - 1)) * w;
      const y = h - (s[1] / max) * (h - 16);
      if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
    canvas.setAttribute('aria-label', title + ': ' + (series.length ? fmt(series[series.length - 1][1]) + ' per second now' : 'no data yet'));
  };
  return box;
}

// Samples of the counters since the page opened: [time, appended, read], the last 5 minutes.
const rateSamples = [];

async function storePage() {
  const cards = el('div', { class: 'cards' });
  const appends = [];
  const reads = [];
  const appendChart = chart('Events appended per second (last 5 minutes)', appends);
  const readChart = chart('Events read per second (last 5 minutes)', reads);
  main.replaceChildren(el('h2', { text: 'Store' }), cards, appendChart, readChart);
  async function refresh() {
    const text = await (await api('/metrics', { headers: { Accept: 'text/plain' } })).text();
    const m = parseMetrics(text);
    const now = Date.now();
    rateSamples.push([now, sumPrefix(m, 'annals_events_appended_total'), sumPrefix(m, 'annals_events_read_total')]);
    while (rateSamples.length && now - rateSamples[0][0] > 300000) rateSamples.shift();
    appends.length = 0;
    reads.length = 0;
    for (let i = 1; i < rateSamples.length; i++) {
      const [t0, a0, r0] = rateSamples[i - 1];
      const [t1, a1, r1] = rateSamples[i];
      const dt = Math.max(0.001, (t1 - t0) / 1000);
      appends.push([t1, Math.max(0, (a1 - a0) / dt)]);
      reads.push([t1, Math.max(0, (r1 - r0) / dt)]);
    }
    let durability = '-';
    for (const k of m.keys()) {
      const match = k.match(/^annals_durability_info\{class="([^"]+)"\}$/);
      if (match) durability = match[1];
    }
    const poisoned = metric(m, 'annals_poisoned') === 1;
    const diskFull = metric(m, 'annals_disk_full') === 1;
    const unready = metric(m, 'annals_ready') === 0;
    const diskFree = metric(m, 'annals_disk_free_bytes');
    const fsyncs = metric(m, 'annals_fsyncs_total');
    const groups = metric(m, 'annals_groups_total');
    const groupAppends = metric(m, 'annals_group_appends_sum');
    const p99 = histogramQuantile(m, 'annals_fsync_seconds', 0.99);
    const p50 = histogramQuantile(m, 'annals_fsync_seconds', 0.5);
    cards.replaceChildren(
      card('Head position', fmt(metric(m, 'annals_head_position'))),
      card('State', poisoned ? 'POISONED: appends refused until reopened'
        : diskFull ? 'DISK FULL: appends refused until there is room; reads go on'
        : unready ? 'NOT READY: see /ready for why' : 'healthy',
        poisoned || diskFull || unready),
      card('Disk free', diskFree === null ? '-' : bytes(diskFree), diskFull),
      card('Durability', durability),
      card('Segments', fmt(metric(m, 'annals_segments')) + ' (' + bytes(metric(m, 'annals_segment_bytes')) + ')'),
      card('Index', bytes(metric(m, 'annals_index_bytes'))),
      card('fsyncs', fmt(fsyncs)),
      card('fsync p50 / p99', p50 === null ? '-' : (p50 * 1e6).toFixed(0) + ' / ' + (p99 * 1e6).toFixed(0) + ' us'),
      card('Appends per group', groups ? (groupAppends / groups).toFixed(1) : '-'),
      card('Subscribers', fmt(metric(m, 'annals_subscribers'))),
      card('Queue depth', fmt(metric(m, 'annals_queue_depth'))));
    if (metric(m, 'annals_backup_shipped_position') !== null) {
      let backupState = 'shipping';
      for (const k of m.keys()) {
        const match = k.match(/^annals_backup_state\{state="([^"]+)"\}$/);
        if (match && m.get(k) === 1) backupState = match[1];
      }
      const lag = metric(m, 'annals_backup_lag_positions');
      const lagSeconds = metric(m, 'annals_backup_lag_seconds');
      cards.append(
        card('Backup', backupState + ', shipped through ' + fmt(metric(m, 'annals_backup_shipped_position')), backupState !== 'shipping'),
        card('Backup lag', fmt(lag) + ' positions, ' + (lagSeconds === null ? '-' : lagSeconds.toFixed(1) + ' s'), lagSeconds !== null && lagSeconds > 5),
        card('Backup shipped', bytes(metric(m, 'annals_backup_bytes_shipped_total')) + ', ' + fmt(metric(m, 'annals_backup_failures_total')) + ' failures'));
    }
    // A read replica: whether it can read the backup it follows, and how far behind it is.
    if (metric(m, 'annals_replica_lag_positions') !== null) {
      let replicaState = 'following';
      for (const k of m.keys()) {
        const match = k.match(/^annals_replica_state\{state="([^"]+)"\}$/);
        if (match && m.get(k) === 1) replicaState = match[1];
      }
      const failing = replicaState !== 'following';
      const lagSeconds = metric(m, 'annals_replica_lag_seconds');
      const pollAge = metric(m, 'annals_replica_last_poll_age_seconds');
      cards.append(
        card('Replica', failing ? 'FAILING: its backup cannot be read; retrying (see /ready)' : 'following its backup', failing),
        card('Replica lag', fmt(metric(m, 'annals_replica_lag_positions')) + ' positions, ' + lagSeconds.toFixed(1) + ' s', failing || lagSeconds > 5),
        card('Replica last poll', pollAge.toFixed(1) + ' s ago, ' + fmt(metric(m, 'annals_replica_failures_total')) + ' failures', pollAge > 30));
    }
    if (metric(m, 'annals_scrub_damaged_segments') > 0) {
      cards.append(card('Scrub', fmt(metric(m, 'annals_scrub_damaged_segments')) + ' damaged segments (see /health)', true));
    }
    if (metric(m, 'annals_database_commits_total') !== null) {
      cards.append(card('Database commits', fmt(metric(m, 'annals_database_commits_total'))),
        card('Database conflicts', fmt(metric(m, 'annals_database_conflicts_total'))),
        card('Unknown outcomes', fmt(metric(m, 'annals_database_unknown_outcomes_total')), metric(m, 'annals_database_unknown_outcomes_total') > 0));
    }
    appendChart.redraw();
    readChart.redraw();
  }
  await refresh();
  // The charts need a second sample for their first rate: it is taken soon after the first.
  const soon = rateSamples.length < 2 ? setTimeout(() => refresh().catch(showError), 500) : null;
  const timer = setInterval(() => refresh().catch(showError), 2000);
  onLeave(() => { clearTimeout(soon); clearInterval(timer); });
}

// ---- Read models -------------------------------------------------------------------------

async function readModelsPage() {
  const table = el('tbody');
  main.replaceChildren(el('h2', { text: 'Read models' }),
    el('table', {}, el('thead', {}, el('tr', {}, ['Name', '#Position', '#Lag', 'Status', '#Applied', '#Checkpoint', ''].map(header))), table));
  async function refresh() {
    const { readModels } = await apiJson('/v1/readmodels');
    table.replaceChildren();
    if (!readModels.length) {
      table.append(el('tr', {}, el('td', { colspan: '7', class: 'muted', text: 'This server keeps no read models (see [[read_models]] in the server configuration).' })));
    }
    for (const m of readModels) {
      const status = m.error ? 'error: ' + m.error : (m.running ? (m.lag === 0 ? 'up to date' : 'catching up') : 'stopped');
      table.append(el('tr', {},
        el('td', { text: m.name }), el('td', { class: 'num', text: m.position }), el('td', { class: 'num', text: m.lag }),
        el('td', { text: status }), el('td', { class: 'num', text: m.eventsApplied }), el('td', { class: 'num', text: m.checkpointPosition }),
        el('td', {}, el('button', { type: 'button', onclick: async () => {
          try {
            await api('/v1/admin/readmodels/' + encodeURIComponent(m.name) + '/rebuild', { method: 'POST' });
            await refresh();
          } catch (e) { showError(e); }
        } }, 'Rebuild'))));
    }
  }
  await refresh();
  const timer = setInterval(() => refresh().catch(showError), 2000);
  onLeave(() => clearInterval(timer));
}

// ---- Snapshots ---------------------------------------------------------------------------

function age(seconds) {
  if (seconds < 120) return Math.round(seconds) + ' s';
  if (seconds < 7200) return Math.round(seconds / 60) + ' min';
  if (seconds < 172800) return Math.round(seconds / 3600) + ' h';
  return Math.round(seconds / 86400) + ' d';
}

async function snapshotsPage() {
  const summary = el('p', { class: 'muted' });
  const table = el('tbody');
  main.replaceChildren(el('h2', { text: 'Snapshots' }), summary,
    el('table', {}, el('thead', {}, el('tr', {}, ['Model', '#Version', '#Snapshots', '#Newest position', 'Oldest', '#Bytes', ''].map(header))), table));
  async function refresh() {
    const list = await apiJson('/v1/admin/snapshots?limit=0');
    summary.textContent = fmt(list.count) + ' decisions\u2019 snapshots, ' + bytes(list.bytes) + ' (' + bytes(list.storedBytes) + ' where they are kept)';
    table.replaceChildren();
    if (!list.models.length) {
      table.append(el('tr', {}, el('td', { colspan: '7', class: 'muted', text: 'No snapshots: decisions save them through annals::snapshot or POST /v1/snapshots.' })));
    }
    for (const m of list.models) {
      table.append(el('tr', {},
        el('td', { text: m.model }), el('td', { class: 'num', text: m.version }), el('td', { class: 'num', text: fmt(m.count) }),
        el('td', { class: 'num', text: m.newestPosition }), el('td', { text: age(m.oldestAgeSeconds) }),
        el('td', { class: 'num', text: bytes(m.bytes) }),
        el('td', {}, el('button', { type: 'button', onclick: async () => {
          try {
            await api('/v1/admin/snapshots?model=' + encodeURIComponent(m.model) + '&version=' + m.version, { method: 'DELETE' });
            await refresh();
          } catch (e) { showError(e); }
        } }, 'Remove'))));
    }
  }
  await refresh();
  const timer = setInterval(() => refresh().catch(showError), 5000);
  onLeave(() => clearInterval(timer));
}

// ---- Schemas -----------------------------------------------------------------------------

async function schemasPage() {
  const summary = el('p', { class: 'muted' });
  const table = el('tbody');
  const shown = el('div');
  main.replaceChildren(el('h2', { text: 'Schemas' }), summary,
    el('table', {}, el('thead', {}, el('tr', {}, ['Type', '#Versions', '#Newest', '#Position', 'Draft', 'Enforcement'].map(header))), table),
    shown);
  const list = await apiJson('/v1/schemas');
  summary.textContent = 'Types without a schema are ' + (list.unknownTypes === 'refuse' ? 'refused' : 'taken') + '. Register a version with annals schema put TYPE FILE.';
  if (!list.types.length) {
    table.append(el('tr', {}, el('td', { colspan: '6', class: 'muted', text: 'No type has a schema.' })));
  }
  for (const t of list.types.filter((t) => t.versions.length)) {
    const newest = t.versions[t.versions.length - 1];
    const row = el('tr', { class: 'event', tabindex: '0' },
      el('td', { text: t.type }), el('td', { class: 'num', text: t.versions.length }),
      el('td', { class: 'num', text: newest.version }), el('td', { class: 'num', text: newest.position }),
      el('td', { text: newest.draft }), el('td', { text: t.enforcement }));
    const show = async () => {
      try {
        const full = await apiJson('/v1/schemas/' + encodeURIComponent(t.type));
        shown.replaceChildren(el('h3', { text: t.type }), el('div', {},
          full.versions.slice().reverse().map((v) => el('div', {},
            el('div', { class: 'muted', text: 'version ' + v.version + ', position ' + v.position + ', ' + v.draft + ', ' + fmt(v.checkedEvents) + ' stored events checked (' + v.check + ')' }),
            el('pre', { class: 'data', text: JSON.stringify(v.schema, null, 2) })))));
      } catch (e) { showError(e); }
    };
    row.addEventListener('click', show);
    row.addEventListener('keydown', (e) => { if (e.key === 'Enter') show(); });
    table.append(row);
  }
}

// ---- Exchange ----------------------------------------------------------------------------

async function exchangePage() {
  const status = await apiJson('/v1/exchange');
  const { symbols } = await apiJson('/v1/exchange/symbols');
  const p = params();
  const symbol = p.get('symbol') || (symbols.length ? String(symbols[0].symbol) : '');
  const pick = el('select', { 'aria-label': 'Symbol', onchange: () => setParams('exchange', { symbol: pick.value }) },
    symbols.map((s) => el('option', { value: String(s.symbol), selected: String(s.symbol) === symbol }, 'symbol ' + s.symbol)));
  const ladder = el('tbody');
  const trades = el('tbody');
  main.replaceChildren(el('h2', { text: 'Exchange' }),
    el('p', { class: 'muted', text: 'Mode ' + status.mode + ' (' + status.durability + '); ' + fmt(status.commands) + ' commands, ' + fmt(status.trades) + ' trades' }),
    el('div', { class: 'row' }, labelled('Symbol', pick)),
    el('h3', { text: 'Order book' }),
    el('table', { class: 'ladder' }, el('thead', {}, el('tr', {}, ['#Bid orders', '#Bid qty', '', '#Price', '', '#Ask qty', '#Ask orders'].map(header))), ladder),
    el('h3', { text: 'Recent trades' }),
    el('table', {}, el('thead', {}, el('tr', {}, ['#Position', '#Price', '#Qty', 'Taker'].map(header))), trades));
  if (!symbol) return;
  async function refresh() {
    const book = await apiJson('/v1/exchange/symbols/' + encodeURIComponent(symbol) + '/depth?levels=10');
    const most = Math.max(1, ...book.bids.map((l) => l.qty), ...book.asks.map((l) => l.qty));
    const bar = (qty) => el('div', { class: 'bar', 'data-width': qty });
    const rows = [];
    for (const a of book.asks.slice().reverse()) {
      rows.push(el('tr', {}, el('td'), el('td'), el('td'), el('td', { class: 'num ask', text: a.price }),
        el('td', { class: 'ask' }, bar(a.qty)), el('td', { class: 'num ask', text: a.qty }), el('td', { class: 'num', text: a.orders })));
    }
    for (const b of book.bids) {
      rows.push(el('tr', {}, el('td', { class: 'num', text: b.orders }), el('td', { class: 'num bid', text: b.qty }),
        el('td', { class: 'bid' }, bar(b.qty)), el('td', { class: 'num bid', text: b.price }), el('td'), el('td'), el('td')));
    }
    if (!rows.length) rows.push(el('tr', {}, el('td', { colspan: '7', class: 'muted', text: 'The book is empty.' })));
    ladder.replaceChildren(...rows);
    for (const node of ladder.querySelectorAll('.bar')) node.style.width = (100 * Number(node.dataset.width) / most) + '%';
    try {
      const recent = await apiJson('/v1/exchange/symbols/' + encodeURIComponent(symbol) + '/trades?limit=20');
      trades.replaceChildren(...recent.trades.map((t) => el('tr', {}, el('td', { class: 'num', text: t.position }),
        el('td', { class: 'num', text: t.price }), el('td', { class: 'num', text: t.qty }), el('td', { text: t.takerSide }))));
    } catch (e) {
      if (e.kind !== 'not_journaled') throw e;
      trades.replaceChildren(el('tr', {}, el('td', { colspan: '4', class: 'muted', text: e.message })));
    }
  }
  await refresh();
  const timer = setInterval(() => refresh().catch(showError), 1000);
  onLeave(() => clearInterval(timer));
}

// ---- Routing -----------------------------------------------------------------------------

const pages = {
  events: eventsPage, live: livePage, store: storePage, readmodels: readModelsPage, snapshots: snapshotsPage, schemas: schemasPage,
  exchange: exchangePage,
};

async function route() {
  for (const stop of stops) stop();
  stops = [];
  clearError();
  const name = pages[pageName()] ? pageName() : 'events';
  for (const a of document.querySelectorAll('nav a')) {
    if (a.dataset.page === name) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  main.replaceChildren(el('p', { class: 'muted', text: 'Loading...' }));
  try {
    await pages[name]();
  } catch (e) {
    showError(e);
    const text = e instanceof ApiError && e.status === 401
      ? 'This server asks for an API key: give it above.'
      : 'Nothing to show: see the message above.';
    if (main.textContent === 'Loading...') main.replaceChildren(el('p', { class: 'muted', text }));
  }
}

// The Exchange tab is shown only when the server hosts an exchange and answers for it.
async function findExchange() {
  try {
    await apiJson('/v1/exchange');
    exchangeTab.hidden = false;
  } catch (_) {
    exchangeTab.hidden = true;
  }
}

async function headLoop() {
  try {
    const { head } = await apiJson('/v1/head');
    headBadge.textContent = 'head ' + head;
  } catch (_) { headBadge.textContent = ''; }
}

window.addEventListener('hashchange', route);
route();
findExchange();
headLoop();
setInterval(headLoop, 3000);
