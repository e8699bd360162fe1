// Signing in: through the issuer (a real link to /v1/auth/sign-in, the server redirects), or
// with an operator token kept for this tab only (automation, a control plane without an issuer).

import { setBearer } from '../api.js';
import { field, h, put } from '../dom.js';
import { startEvents } from '../events.js';
import { loadSession, session } from '../session.js';

function safeReturn(q) {
  const r = q.get('return_to') || '/';
  return r.startsWith('/') && !r.startsWith('//') && !r.startsWith('/\\') ? r : '/';
}

export async function show(main, ctx) {
  const back = safeReturn(ctx.query);
  if (session.who) {
    ctx.go(back, true);
    return;
  }
  const cfg = session.config || {};
  const token = h('input', { type: 'password', autocomplete: 'off', required: true, pattern: 'pxop_.+' });
  const err = h('p', { class: 'error', role: 'alert' });
  put(main,
    h('h1', {}, 'Sign in'),
    cfg.enabled
      ? h('p', {}, h('a', { class: 'button primary', id: 'sign-in-issuer', href: `/v1/auth/sign-in?return_to=${encodeURIComponent(back)}` },
        `Sign in with ${cfg.issuer || 'your identity provider'}`))
      : h('p', { class: 'muted' }, 'Sign-in through an identity provider is not set up on this control plane.'),
    h('details', { open: cfg.enabled ? null : true },
      h('summary', {}, 'Use an operator token'),
      h('form', {
        onsubmit: async (e) => {
          e.preventDefault();
          setBearer(token.value.trim());
          try {
            await loadSession();
          } catch (x) {
            session.who = null;
            err.textContent = x.message;
          }
          if (!session.who) {
            setBearer(null);
            if (!err.textContent) err.textContent = 'The token was refused: check it was copied whole and is not revoked.';
            return;
          }
          startEvents();
          ctx.go(back, true);
        },
      },
      h('p', { class: 'muted' }, 'The token stays in this browser tab only and is forgotten when the tab closes.'),
      field('Operator token', token),
      h('button', { type: 'submit' }, 'Use token'),
      err)));
}
