// Bootstrap tokens of a Project: list, issue (the token's text is shown once, kept in this
// page only, never stored: a reload forgets it), revoke.

import { enc, get, items, post } from '../api.js';
import { ago, badge, field, h, put, say, table } from '../dom.js';
import { can } from '../session.js';
import { projectChoice, projectOfPage } from './common.js';

let state = null;

function issuedBox(t) {
  const code = h('code', { id: 'issued-token' }, t.token);
  const copy = h('button', {
    type: 'button',
    onclick: async () => {
      try {
        await navigator.clipboard.writeText(t.token);
        say('The token was copied.');
      } catch {
        const range = document.createRange();
        range.selectNodeContents(code);
        const sel = window.getSelection();
        sel.removeAllRanges();
        sel.addRange(range);
        say('Copying is not allowed here: the token is selected, copy it with the keyboard.');
      }
    },
  }, 'Copy');
  return h('section', { class: 'once', 'aria-labelledby': 'once-title' },
    h('h2', { id: 'once-title' }, 'New bootstrap token'),
    h('p', { class: 'warning' }, 'This is the only time the token is shown. Copy it now: it is not stored in the console and a reload forgets it. Anyone holding it can add a node to this Project until it expires or is used up.'),
    h('p', {}, code, ' ', copy),
    h('p', { class: 'muted' }, `Expires ${t.expires_at}; ${t.max_uses} use(s).`));
}

function issueForm() {
  const env = h('input', { name: 'env', value: 'prod', required: true, pattern: '[a-z0-9]{1,16}', autocomplete: 'off' });
  const ttl = h('input', { name: 'ttl', type: 'number', value: '3600', min: '60', max: '2592000', required: true });
  const uses = h('input', { name: 'uses', type: 'number', value: '1', min: '1', max: '1000', required: true });
  return h('form', {
    class: 'inline',
    onsubmit: async (e) => {
      e.preventDefault();
      try {
        const t = await post(`/v1/projects/${enc(state.project)}/bootstrap-tokens`, {
          kind: 'node', env_prefix: env.value, ttl_secs: Number(ttl.value), max_uses: Number(uses.value),
        });
        state.issued = t;
        await reload();
        say('Token issued.');
      } catch (err) {
        say(`Issuing failed: ${err.message}`, true);
      }
    },
  },
  field('Environment prefix', env), field('Lifetime (seconds)', ttl), field('Uses', uses),
  h('button', { type: 'submit' }, 'Issue token'));
}

async function revoke(t) {
  try {
    await post(`/v1/bootstrap-tokens/${enc(t.id)}/revoke`);
    say(`Token ${t.id} revoked.`);
    await reload();
  } catch (e) {
    say(`Revoking failed: ${e.message}`, true);
  }
}

function draw() {
  const { main, projects, project, list } = state;
  const operate = can('operate', { project }, projects);
  put(main,
    h('h1', {}, 'Bootstrap tokens'),
    projectChoice(state, '/tokens'),
    state.issued ? issuedBox(state.issued) : null,
    operate ? issueForm() : null,
    list.length
      ? table(null, ['Id', 'Status', 'Uses', 'Created', 'Expires', ''], list.map((t) => [
        h('code', {}, t.id), badge(t.status), `${t.uses}/${t.max_uses}`, ago(t.created_at), t.expires_at,
        operate && t.status === 'active'
          ? h('button', { type: 'button', class: 'danger', onclick: () => revoke(t), 'aria-label': `Revoke token ${t.id}` }, 'Revoke')
          : '']), { id: 'tokens' })
      : h('p', { class: 'muted' }, 'No tokens.'));
}

async function reload() {
  const list = items(await get(`/v1/projects/${enc(state.project)}/bootstrap-tokens`));
  if (!state) return;
  state.list = list.sort((a, b) => String(b.created_at).localeCompare(String(a.created_at)));
  draw();
}

export async function show(main, ctx) {
  const page = await projectOfPage(main, ctx, 'Bootstrap tokens');
  if (!page) return;
  state = { main, ...page, go: ctx.go, issued: null, list: [] };
  await reload();
}

export function leave() {
  state = null;
}
