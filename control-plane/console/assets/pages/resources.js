// Resources of a Project with their phases, live: `resource` events refetch.

import { enc, get, items } from '../api.js';
import { ago, badge, h, put, say, table } from '../dom.js';
import { projectChoice, projectOfPage, throttle } from './common.js';

let state = null;

function phase(r) {
  const p = r.provisioning || {};
  return p.phase || p.state || 'unknown';
}

function draw() {
  const { main, list } = state;
  put(main,
    h('h1', {}, 'Resources'),
    projectChoice(state, '/resources'),
    list.length
      ? table(null, ['Id', 'Kind', 'Phase', 'Node', 'Created'], list.map((r) => [
        h('code', {}, r.id), r.kind, badge(phase(r), String(phase(r)).toLowerCase()),
        r.node_id ? h('a', { href: `/nodes/${r.node_id}` }, r.node_id) : '—', ago(r.created_at)]), { id: 'resources' })
      : h('p', { class: 'muted' }, 'No resources.'));
}

async function reload() {
  const list = items(await get(`/v1/projects/${enc(state.project)}/resources`));
  if (!state) return;
  state.list = list;
  draw();
}

export async function show(main, ctx) {
  const page = await projectOfPage(main, ctx, 'Resources');
  if (!page) return;
  state = { main, ...page, go: ctx.go, list: [] };
  await reload();
  state.refetch = throttle(() => state && reload().catch((e) => say(e.message, true)), 1000);
}

export function event(ev) {
  if (state && (ev.type === 'resource' || (ev.type === 'snapshot' && !ev.initial))) state.refetch();
}

export function leave() {
  state = null;
}
