// The relays the control plane knows and their health (/v1/relays).

import { get, items } from '../api.js';
import { ago, badge, h, put, table } from '../dom.js';

export async function show(main) {
  const list = items(await get('/v1/relays'));
  put(main,
    h('h1', {}, 'Relays'),
    list.length
      ? table(null, ['Name', 'URL', 'Transports', 'Health', 'Last check', 'Detail'], list.map((r) => [
        r.name, h('code', {}, r.url), (r.transports || []).join(', '),
        badge(r.healthy ? 'healthy' : 'unhealthy'), ago(r.last_check_at), r.detail || '']), { id: 'relays' })
      : h('p', { class: 'muted' }, 'No relays configured.'));
}
