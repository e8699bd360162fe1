// The live stream /v1/console/events (server-sent events) read through fetch, so a bearer
// token works as well as the cookie. Reconnects with Last-Event-ID after a bounded backoff;
// a `snapshot` event tells the page to fetch again.

import { authHeaders } from './api.js';

const listeners = new Set();
const BACKOFF_MS = [1000, 2000, 5000, 10000, 30000];
let started = false;
let lastId = null;
let connections = 0;

export function onEvent(fn) {
  listeners.add(fn);
  return () => listeners.delete(fn);
}

function dispatch(ev) {
  for (const fn of [...listeners]) {
    try { fn(ev); } catch (e) { console.error('console event handler failed', e); }
  }
}

function parseBlock(block) {
  let type = 'message';
  let id = null;
  const data = [];
  for (const line of block.split('\n')) {
    if (!line || line.startsWith(':')) continue;
    const i = line.indexOf(':');
    const k = i < 0 ? line : line.slice(0, i);
    const v = i < 0 ? '' : line.slice(i + 1).replace(/^ /, '');
    if (k === 'event') type = v;
    else if (k === 'data') data.push(v);
    else if (k === 'id') id = v;
  }
  if (id !== null) lastId = id;
  let payload = null;
  if (data.length) {
    try { payload = JSON.parse(data.join('\n')); } catch { payload = data.join('\n'); }
  }
  // The `snapshot` every connection starts with: on the first connection the page has just
  // fetched everything, so pages skip it; after a reconnect it means "fetch again".
  const initial = type === 'snapshot' && connections === 1 && Boolean(payload && payload.reason === 'connected');
  return { type, id, data: payload, initial };
}

async function runOnce() {
  const headers = authHeaders('GET');
  headers.Accept = 'text/event-stream';
  if (lastId) headers['Last-Event-ID'] = lastId;
  const resp = await fetch('/v1/console/events', { headers, credentials: 'same-origin' });
  if (!resp.ok || !resp.body) return false;
  connections += 1;
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return true;
    buf += value.replace(/\r\n?/g, '\n');
    let cut;
    while ((cut = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      dispatch(parseBlock(block));
    }
  }
}

export function startEvents() {
  if (started) return;
  started = true;
  (async () => {
    let fails = 0;
    for (;;) {
      let ok = false;
      try { ok = await runOnce(); } catch { ok = false; }
      fails = ok ? 0 : Math.min(fails + 1, BACKOFF_MS.length);
      const wait = BACKOFF_MS[Math.max(0, fails - 1)];
      await new Promise((r) => setTimeout(r, wait));
    }
  })();
}
