// One node: its row, candidates, NAT type, and each peer's path, RTT and last handshake
// (/v1/nodes/{id}/paths). Revoke for those who may operate on its Project.

import { ApiError, enc, get, post } from '../api.js';
import { ago, badge, h, put, say, table } from '../dom.js';
import { can } from '../session.js';
import { projectLabel, projectsById, throttle } from './common.js';

let state = null;

function pathText(p) {
  if (p.path === 'relay') return `relay ${p.relay || '?'} (${(p.transport || '?').toUpperCase()})`;
  return p.path || 'none';
}

function rtt(ms) {
  return ms === null || ms === undefined ? '—' : `${Number(ms).toFixed(1)} ms`;
}

function natText(nat) {
  if (!nat) return 'unknown';
  const m = typeof nat.mapping === 'string' ? nat.mapping : JSON.stringify(nat.mapping);
  return `${m}${nat.udp_blocked ? ', UDP blocked' : ''}`;
}

async function revoke() {
  const n = state.node;
  if (!window.confirm(`Revoke ${n.name || n.hostname}? It leaves the mesh and cannot come back with its credential.`)) return;
  try {
    await post(`/v1/nodes/${enc(n.id)}/revoke`);
    say(`${n.name || n.hostname} was revoked.`);
    await state.reload();
  } catch (e) {
    say(`Revoking failed: ${e.message}`, true);
  }
}

function draw() {
  const { main, node: n, paths, projects } = state;
  const candidates = (paths && paths.candidates) || n.candidates || [];
  const peers = (paths && paths.peers) || [];
  const mayRevoke = n.status !== 'revoked' && can('operate', { project: n.project_id }, projects);
  put(main,
    h('p', {}, h('a', { href: '/nodes' }, '← Nodes')),
    h('h1', {}, n.name || n.hostname),
    h('dl', { class: 'facts' },
      h('dt', {}, 'Status'), h('dd', { id: 'node-status' }, badge(n.status)),
      h('dt', {}, 'Mesh IP'), h('dd', {}, h('code', {}, n.mesh_ip)),
      h('dt', {}, 'Hostname'), h('dd', {}, n.hostname),
      h('dt', {}, 'Project'), h('dd', {}, projectLabel(projects, n.project_id)),
      h('dt', {}, 'Version'), h('dd', {}, n.plexd_version),
      h('dt', {}, 'Last seen'), h('dd', {}, ago(n.last_seen_at)),
      h('dt', {}, 'Tags'), h('dd', {}, (n.tags || []).map((t) => h('span', { class: 'tag' }, t))),
      h('dt', {}, 'NAT'), h('dd', {}, natText((paths && paths.nat) || n.nat)),
      h('dt', {}, 'Home relay'), h('dd', {}, (paths && paths.home_relay) || n.home_relay || '—')),
    mayRevoke ? h('button', { type: 'button', class: 'danger', onclick: revoke }, 'Revoke node') : null,
    h('h2', {}, 'Candidates'),
    candidates.length
      ? table(null, ['Kind', 'Address'], candidates.map((c) => [c.kind, h('code', {}, c.address)]))
      : h('p', { class: 'muted' }, 'No candidates reported.'),
    h('h2', {}, 'Peers'),
    peers.length
      ? table(null, ['Peer', 'Path', 'Endpoint', 'RTT', 'Last handshake', 'Updated'],
        peers.map((p) => [
          h('a', { href: `/nodes/${p.peer_node_id}` }, p.peer_name || p.peer_node_id),
          h('span', { class: `path path-${p.path}${p.transport ? `-${p.transport}` : ''}` }, pathText(p)),
          p.endpoint ? h('code', {}, p.endpoint) : '—',
          rtt(p.rtt_ms), ago(p.last_handshake_at), ago(p.updated_at)]), { id: 'peers' })
      : h('p', { class: 'muted' }, paths ? 'No peer paths reported yet.' : 'This control plane does not report paths.'));
}

export async function show(main, ctx) {
  const id = ctx.params[0];
  state = { main, id };
  state.reload = async () => {
    const [node, projects] = await Promise.all([get(`/v1/nodes/${enc(id)}`), projectsById()]);
    let paths = null;
    try {
      paths = await get(`/v1/nodes/${enc(id)}/paths`);
    } catch (e) {
      if (!(e instanceof ApiError) || e.status !== 404 || e.code === 'not_found_node') throw e;
    }
    if (!state || state.id !== id) return;
    Object.assign(state, { node, paths, projects });
    draw();
  };
  await state.reload();
  state.refetch = throttle(() => state && state.reload().catch((e) => say(e.message, true)), 1000);
}

export function event(ev) {
  if (!state) return;
  const d = ev.data || {};
  const mine = (x) => x && (x.id === state.id || x.node_id === state.id || x.a === state.id || x.b === state.id);
  if ((ev.type === 'snapshot' && !ev.initial) || (ev.type === 'node' && mine(d))
    || (ev.type === 'map' && [].concat(d.links || d).some(mine))) state.refetch();
}

export function leave() {
  state = null;
}
