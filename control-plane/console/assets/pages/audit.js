// The audit log of a Domain (/v1/audit: `AuditPage`, oldest first, paged with `after=`),
// shown a page at a time; a check of the chain (/v1/audit/verify).

import { enc, get, items, post } from '../api.js';
import { h, put, say, table } from '../dom.js';
import { chosen, domains, picker } from './common.js';

// Rows fetched per page.
const AUDIT_PAGE = 200;

// A person is stored keyed (docs/audit.md): the page shows the first characters of the key.
function actor(a) {
  if (!a) return '';
  const person = a.email_key || a.subject_key;
  return [a.kind, a.name || a.ref, person ? `person ${person.slice(0, 12)}` : null]
    .filter(Boolean).join(' ');
}

function detail(d) {
  if (d === null || d === undefined) return '';
  return h('code', { class: 'detail' }, typeof d === 'string' ? d : JSON.stringify(d));
}

export async function show(main, ctx) {
  const doms = await domains();
  const options = doms.map((d) => [d.id, d.slug]);
  const domain = chosen(ctx, 'domain', options);
  if (!domain) {
    put(main, h('h1', {}, 'Audit log'), h('p', {}, 'You see no Domain.'));
    return;
  }
  const after = /^[0-9]+$/.test(ctx.query.get('after') || '') ? ctx.query.get('after') : null;
  const data = await get(`/v1/audit?domain=${enc(domain)}&limit=${AUDIT_PAGE}${after ? `&after=${after}` : ''}`);
  const rows = items(data.entries);
  const result = h('p', { id: 'verify-result', role: 'status' });
  put(main,
    h('h1', {}, 'Audit log'),
    options.length > 1 ? picker('Domain', options, domain, (d) => ctx.go(`/audit?domain=${enc(d)}`)) : null,
    h('p', {},
      h('button', {
        type: 'button',
        onclick: async () => {
          try {
            const v = await post('/v1/audit/verify', { domain });
            result.textContent = v.ok ? `The chain verifies: ${v.rows} rows.`
              : `The chain is broken: ${(v.problems || []).map((p) => `row ${p.seq} ${p.kind}`).join('; ')}`;
            result.className = v.ok ? 'ok' : 'error';
          } catch (e) {
            say(`Verifying failed: ${e.message}`, true);
          }
        },
      }, 'Verify the chain'), ' ', result),
    rows.length
      ? table(null, ['#', 'When', 'Who', 'Action', 'Target', 'Detail'], rows.map((r) => [
        r.seq, r.at, actor(r.actor), r.action, r.target, detail(r.detail)]), { id: 'audit' })
      : h('p', { class: 'muted' }, 'No audit rows.'),
    data.next_after !== null && data.next_after !== undefined
      ? h('p', {}, h('a', { href: `/audit?domain=${enc(domain)}&after=${data.next_after}` }, 'Next rows'))
      : null);
}
