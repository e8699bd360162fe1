// A Domain's access policy: view; for admins edit, validate, preview the reachability diff
// (a dry run) and apply it, against the version they read (409 when it moved).

import { enc, get, post, put as putApi } from '../api.js';
import { field, h, put, say } from '../dom.js';
import { can } from '../session.js';
import { chosen, domains, picker } from './common.js';

function problems(list) {
  return h('ul', { class: 'problems' }, list.map((p) => h('li', {}, `line ${p.line}, column ${p.column}: ${p.message} (${p.kind})`)));
}

export async function show(main, ctx) {
  const doms = await domains();
  const options = doms.map((d) => [d.id, d.slug]);
  const domain = chosen(ctx, 'domain', options);
  if (!domain) {
    put(main, h('h1', {}, 'Access policy'), h('p', {}, 'You see no Domain.'));
    return;
  }
  const pol = await get(`/v1/domains/${enc(domain)}/policy`);
  const admin = can('admin', { domain });
  const text = h('textarea', { rows: 16, spellcheck: 'false', readonly: admin ? null : true, class: 'code' });
  text.value = pol.document;
  const out = h('div', { id: 'policy-result', 'aria-live': 'polite' });
  let previewed = null;
  const applyBtn = h('button', { type: 'button', disabled: true, class: 'danger' }, 'Apply');

  const validate = async () => {
    const v = await post(`/v1/domains/${enc(domain)}/policy/validate`, { document: text.value });
    put(out, v.valid ? h('p', { class: 'ok' }, 'The document is valid and its tests pass.') : [h('p', { class: 'error' }, 'The document has problems:'), problems(v.errors)]);
    return v.valid;
  };
  const change = (dryRun) => putApi(`/v1/domains/${enc(domain)}/policy`, { document: text.value, expected_version: pol.version, dry_run: dryRun });
  const preview = async () => {
    try {
      if (!(await validate())) return;
      const c = await change(true);
      previewed = text.value;
      applyBtn.disabled = false;
      put(out, h('p', { class: 'ok' }, `Valid. Applying makes version ${c.version}; what changes in who reaches whom:`),
        c.diff.length ? h('pre', { class: 'diff' }, c.diff.join('\n')) : h('p', {}, 'Nothing changes in who reaches whom.'));
    } catch (e) {
      put(out, h('p', { class: 'error' }, e.message));
    }
  };
  applyBtn.addEventListener('click', async () => {
    if (previewed !== text.value) { say('The document changed since the preview: preview again.', true); applyBtn.disabled = true; return; }
    try {
      const c = await change(false);
      say(`Policy version ${c.version} applied.`);
      ctx.go(`/policy?domain=${enc(domain)}`, true);
    } catch (e) {
      put(out, h('p', { class: 'error' }, e.message));
    }
  });
  text.addEventListener('input', () => { applyBtn.disabled = true; });

  put(main,
    h('h1', {}, 'Access policy'),
    options.length > 1 ? picker('Domain', options, domain, (d) => ctx.go(`/policy?domain=${enc(d)}`)) : null,
    h('p', { class: 'muted' }, `Version ${pol.version} by ${pol.author}, ${pol.created_at}. ${pol.summary || ''}`),
    field(admin ? 'Policy document (edit, then preview before applying)' : 'Policy document (read only)', text),
    h('p', { class: 'actions' },
      h('button', { type: 'button', onclick: () => validate().catch((e) => put(out, h('p', { class: 'error' }, e.message))) }, 'Validate'),
      admin ? h('button', { type: 'button', onclick: preview }, 'Preview changes') : null,
      admin ? applyBtn : null),
    out);
}
