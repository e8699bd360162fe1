// The mesh map: the Domain's nodes on a circle, ordered by Project then name (deterministic,
// no simulation), and a line for each pair that talks, coloured and dashed by its path
// (direct / relay over UDP / relay over TCP). RTT on hover and focus, and every link in a
// table beside the picture. Live: `map` events replace the links they carry.

import { enc, get } from '../api.js';
import { h, put, s, say, table } from '../dom.js';
import { chosen, domains, picker, projectLabel, projectsById, throttle } from './common.js';

// The table beside the map shows this many links until asked for all.
const MAP_TABLE_ROWS = 300;
// Names are drawn beside the nodes up to this many nodes (beyond: on hover and in the table).
const MAP_LABELS_UP_TO = 60;

let state = null;

const key = (l) => `${l.a}|${l.b}`;

function kind(l) {
  if (l.path === 'direct') return 'direct';
  if (l.path === 'relay') return l.transport === 'tcp' ? 'relay-tcp' : 'relay-udp';
  return 'none';
}

function describe(l) {
  const name = (id) => (state.byId.get(id) || {}).name || id;
  const how = l.path === 'relay' ? `relay ${l.relay || '?'} over ${(l.transport || '?').toUpperCase()}` : l.path;
  const rtt = l.rtt_ms === null || l.rtt_ms === undefined ? 'RTT unknown' : `RTT ${Number(l.rtt_ms).toFixed(1)} ms`;
  return `${name(l.a)} ↔ ${name(l.b)}: ${how}, ${rtt}`;
}

function layout(nodes, projects) {
  const sorted = [...nodes].sort((x, y) =>
    String(projectLabel(projects, x.project_id)).localeCompare(String(projectLabel(projects, y.project_id)))
    || String(x.name).localeCompare(String(y.name)));
  const n = Math.max(sorted.length, 1);
  const radius = Math.max(240, n * 4.5);
  const pos = new Map();
  sorted.forEach((node, i) => {
    const a = (2 * Math.PI * i) / n - Math.PI / 2;
    pos.set(node.id, [radius * Math.cos(a), radius * Math.sin(a), a]);
  });
  return { pos, radius, sorted };
}

function linkLayer() {
  const { pos } = state.layout;
  const g = s('g', { class: 'links' });
  for (const l of state.links.values()) {
    const pa = pos.get(l.a);
    const pb = pos.get(l.b);
    if (!pa || !pb) continue;
    const text = describe(l);
    const line = s('line', {
      x1: pa[0].toFixed(1), y1: pa[1].toFixed(1), x2: pb[0].toFixed(1), y2: pb[1].toFixed(1),
      class: `link link-${kind(l)}`, tabindex: '0', 'data-a': l.a, 'data-b': l.b, 'aria-label': text,
    }, s('title', {}, text));
    const tell = () => { state.info.textContent = text; };
    line.addEventListener('mouseenter', tell);
    line.addEventListener('focus', tell);
    g.append(line);
  }
  return g;
}

function nodeLayer() {
  const { pos, sorted } = state.layout;
  const labels = sorted.length <= MAP_LABELS_UP_TO;
  const r = sorted.length > 1000 ? 3 : 7;
  return s('g', { class: 'nodes' }, sorted.map((n) => {
    const [x, y, a] = pos.get(n.id);
    const out = Math.cos(a) >= 0;
    return s('a', { href: `/nodes/${n.id}`, class: `node ${n.online ? 'online' : 'offline'}`, 'data-id': n.id },
      s('title', {}, `${n.name} (${n.mesh_ip}) ${n.online ? 'online' : 'offline'}`),
      s('circle', { cx: x.toFixed(1), cy: y.toFixed(1), r }),
      labels ? s('text', { x: (x + (out ? 10 : -10)).toFixed(1), y: (y + 4).toFixed(1), 'text-anchor': out ? 'start' : 'end' }, n.name) : null);
  }));
}

function linkTable() {
  const all = [...state.links.values()];
  const rows = state.allRows ? all : all.slice(0, MAP_TABLE_ROWS);
  const name = (id) => (state.byId.get(id) || {}).name || id;
  return h('div', { id: 'map-table' },
    table('Links', ['Node', 'Node', 'Path', 'Relay', 'Transport', 'RTT'], rows.map((l) => [
      name(l.a), name(l.b), h('span', { class: `path path-${kind(l)}` }, l.path), l.relay || '—',
      l.transport || '—', l.rtt_ms === null || l.rtt_ms === undefined ? '—' : `${Number(l.rtt_ms).toFixed(1)} ms`,
    ]), { id: 'links' }),
    rows.length < all.length
      ? h('button', { type: 'button', onclick: () => { state.allRows = true; redrawLinks(); } }, `Show all ${all.length} links`)
      : null);
}

function redrawLinks() {
  const svg = state.main.querySelector('svg.map');
  if (!svg) return;
  svg.querySelector('g.links').replaceWith(linkLayer());
  state.main.querySelector('#map-table').replaceWith(linkTable());
}

function legend() {
  return h('ul', { class: 'legend' },
    [['direct', 'direct'], ['relay-udp', 'relay over UDP'], ['relay-tcp', 'relay over TCP'], ['none', 'no path']]
      .map(([k, t]) => h('li', {}, s('svg', { width: 36, height: 10, 'aria-hidden': 'true' },
        s('line', { x1: 0, y1: 5, x2: 36, y2: 5, class: `link link-${k}` })), ` ${t}`)));
}

function draw(domainOptions) {
  const { main, nodes, projects, domain } = state;
  state.layout = layout(nodes, projects);
  const pad = 110;
  const w = state.layout.radius + pad;
  state.info = h('p', { id: 'link-info', class: 'info', 'aria-live': 'polite' }, 'Hover or focus a line for its path and RTT.');
  put(main,
    h('h1', {}, 'Mesh map'),
    domainOptions.length > 1 ? picker('Domain', domainOptions, domain, (d) => state.go(`/map?domain=${enc(d)}`)) : null,
    h('p', { class: 'summary' }, `${nodes.length} nodes, ${state.links.size} links`),
    legend(),
    h('div', { class: 'map-wrap' },
      s('svg', { class: 'map', viewBox: `${-w} ${-w} ${2 * w} ${2 * w}`, role: 'img', 'aria-label': `Mesh map of ${nodes.length} nodes; the links are listed in the table below` },
        linkLayer(), nodeLayer()),
      state.info),
    linkTable());
}

export async function show(main, ctx) {
  const [doms, projects] = await Promise.all([domains(), projectsById()]);
  const options = doms.map((d) => [d.id, d.slug]);
  const domain = chosen(ctx, 'domain', options);
  if (!domain) {
    put(main, h('h1', {}, 'Mesh map'), h('p', {}, 'You see no Domain.'));
    return;
  }
  state = { main, projects, domain, go: ctx.go, allRows: false };
  state.reload = async () => {
    const m = await get(`/v1/mesh/map?domain=${enc(domain)}`);
    if (!state || state.domain !== domain) return;
    state.nodes = m.nodes || [];
    state.byId = new Map(state.nodes.map((n) => [n.id, n]));
    state.links = new Map((m.links || []).map((l) => [key(l), l]));
    draw(options);
  };
  await state.reload();
  performance.mark('plexsphere:map-rendered');
  state.refetch = throttle(() => state && state.reload().catch((e) => say(e.message, true)), 1000);
}

export function event(ev) {
  if (!state || !state.links) return;
  const d = ev.data || {};
  if (d.domain && d.domain !== state.domain) return;
  if (ev.type === 'map') {
    let unknown = false;
    for (const l of d.links || []) {
      if (!state.byId.has(l.a) || !state.byId.has(l.b)) { unknown = true; continue; }
      state.links.set(key(l), l);
    }
    if (unknown) state.refetch();
    else redrawLinks();
  } else if (ev.type === 'node') {
    const known = state.byId.get(d.id);
    if (d.removed || !known || !d.node || d.node.name !== known.name || d.node.project_id !== known.project_id) {
      state.refetch();
      return;
    }
    Object.assign(known, d.node);
    const a = state.main.querySelector(`svg.map a.node[data-id="${CSS.escape(String(d.id))}"]`);
    if (a) a.setAttribute('class', `node ${known.online ? 'online' : 'offline'}`);
  } else if (ev.type === 'snapshot' && !ev.initial) {
    state.refetch();
  }
}

export function leave() {
  state = null;
}
