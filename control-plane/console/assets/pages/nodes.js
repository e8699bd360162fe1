// Nodes: online or offline, last seen, version, mesh IP, name, tags, Project. Live: a
// `node` event refetches (at most once a second). Long lists show NODES_PAGE rows at a time.

import { get, items } from '../api.js';
import { ago, badge, field, h, put, table } from '../dom.js';
import { projectLabel, projectsById, throttle } from './common.js';

const NODES_PAGE = 500;
let state = null;

function row(n, projects) {
  return [
    h('a', { href: `/nodes/${n.id}` }, n.name || n.hostname),
    badge(n.status),
    ago(n.last_seen_at),
    n.plexd_version,
    h('code', {}, n.mesh_ip),
    (n.tags || []).map((t) => h('span', { class: 'tag' }, t)),
    projectLabel(projects, n.project_id),
  ];
}

function draw() {
  const { main, nodes, projects, filter, shown } = state;
  const f = filter.trim().toLowerCase();
  const match = f ? nodes.filter((n) =>
    [n.name, n.hostname, n.mesh_ip, n.status, n.plexd_version, projectLabel(projects, n.project_id), ...(n.tags || [])]
      .some((v) => v && String(v).toLowerCase().includes(f))) : nodes;
  const online = nodes.filter((n) => n.status === 'online').length;
  const input = h('input', { type: 'search', value: filter, autocomplete: 'off', placeholder: 'name, IP, tag, project' });
  input.addEventListener('input', (e) => {
    state.filter = e.target.value;
    state.shown = NODES_PAGE;
    const pos = e.target.selectionStart;
    draw();
    const again = main.querySelector('input[type=search]');
    again.focus();
    again.setSelectionRange(pos, pos);
  });
  put(main,
    h('h1', {}, 'Nodes'),
    h('p', { class: 'summary' }, `${nodes.length} nodes, ${online} online`),
    field('Filter', input),
    table(null, ['Name', 'Status', 'Last seen', 'Version', 'Mesh IP', 'Tags', 'Project'],
      match.slice(0, shown).map((n) => row(n, projects)), { id: 'nodes' }),
    match.length > shown
      ? h('button', { type: 'button', onclick: () => { state.shown += NODES_PAGE; draw(); } },
        `Show more (${match.length - shown} not shown)`)
      : null);
}

async function load() {
  const [list, projects] = await Promise.all([get('/v1/nodes'), projectsById()]);
  const nodes = items(list).sort((a, b) =>
    String(a.name || a.hostname).localeCompare(String(b.name || b.hostname)));
  return { nodes, projects };
}

export async function show(main) {
  const data = await load();
  state = { main, ...data, filter: '', shown: NODES_PAGE };
  draw();
  performance.mark('plexsphere:nodes-rendered');
  state.refetch = throttle(async () => {
    if (!state) return;
    const fresh = await load();
    if (!state) return;
    Object.assign(state, fresh);
    const focused = document.activeElement && document.activeElement.matches('input[type=search]');
    draw();
    if (focused) main.querySelector('input[type=search]').focus();
  }, 1000);
}

export function event(ev) {
  if (state && (ev.type === 'node' || (ev.type === 'snapshot' && !ev.initial))) state.refetch();
}

export function leave() {
  state = null;
}
