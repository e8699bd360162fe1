// The console's shell: the navigation, the client-side routes (every path that is not the
// API's serves index.html), the sign-in state and the live event stream.

import { ApiError, post, setBearer, bearer } from './api.js';
import { h, put, say } from './dom.js';
import { onEvent, startEvents } from './events.js';
import { can, displayName, loadSession, session } from './session.js';
import * as nodes from './pages/nodes.js';
import * as node from './pages/node.js';
import * as map from './pages/map.js';
import * as tokens from './pages/tokens.js';
import * as resources from './pages/resources.js';
import * as relays from './pages/relays.js';
import * as audit from './pages/audit.js';
import * as policy from './pages/policy.js';
import * as signin from './pages/signin.js';

// [path pattern, page module, title, need shown in the navigation (null: not in it)]
const ROUTES = [
  [/^\/(nodes\/?)?$/, nodes, 'Nodes', 'read', '/nodes'],
  [/^\/nodes\/([0-9a-f-]{36})$/, node, 'Node', null, null],
  [/^\/map$/, map, 'Map', 'read', '/map'],
  [/^\/tokens$/, tokens, 'Tokens', 'read', '/tokens'],
  [/^\/resources$/, resources, 'Resources', 'read', '/resources'],
  [/^\/relays$/, relays, 'Relays', 'read', '/relays'],
  [/^\/audit$/, audit, 'Audit log', 'audit', '/audit'],
  [/^\/policy$/, policy, 'Policy', 'read', '/policy'],
  [/^\/sign-in$/, signin, 'Sign in', null, null],
];

let current = null;

function nav() {
  const here = location.pathname;
  const links = ROUTES.filter((r) => r[3] && can(r[3])).map(([re, , title, , href]) =>
    h('a', { href, 'aria-current': re.test(here) ? 'page' : null }, title));
  put(document.getElementById('nav'), links);
  const who = session.who;
  const box = document.getElementById('who');
  if (!who) {
    put(box, here === '/sign-in' ? null : h('a', { href: '/sign-in' }, 'Sign in'));
    return;
  }
  put(box,
    h('span', { class: 'me', title: `${who.via}: ${who.id}` }, displayName(who)),
    h('button', { type: 'button', onclick: signOut }, 'Sign out'));
}

async function signOut() {
  try {
    if (bearer()) setBearer(null);
    else await post('/v1/auth/sign-out');
  } catch (e) {
    say(`Signing out failed: ${e.message}`, true);
    return;
  }
  session.who = null;
  go('/sign-in');
}

export async function render() {
  const path = location.pathname;
  const main = document.getElementById('main');
  const route = ROUTES.find(([re]) => re.test(path));
  if (current && current.leave) current.leave();
  current = null;
  nav();
  if (!route) {
    put(main, h('h1', {}, 'Not found'), h('p', {}, 'No page here. ', h('a', { href: '/' }, 'Go to the nodes.')));
    return;
  }
  const [re, page, title] = route;
  document.title = `${title} · plexsphere`;
  if (!session.who && page !== signin) {
    go(`/sign-in?return_to=${encodeURIComponent(path + location.search)}`, true);
    return;
  }
  current = page;
  put(main, h('h1', {}, title), h('p', { class: 'muted' }, 'Loading…'));
  try {
    await page.show(main, { params: path.match(re).slice(1), query: new URLSearchParams(location.search), go });
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) {
      session.who = null;
      go('/sign-in', true);
      return;
    }
    put(main, h('h1', {}, title), h('p', { class: 'error', role: 'alert' }, e.message));
  }
}

export function go(path, replace) {
  if (replace) history.replaceState(null, '', path);
  else history.pushState(null, '', path);
  say('');
  render();
  const main = document.getElementById('main');
  if (main) main.focus({ preventScroll: true });
}

// Same-origin links move without a reload; everything else (the issuer) navigates.
document.addEventListener('click', (e) => {
  const a = e.target instanceof Element ? e.target.closest('a[href]') : null;
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin || url.pathname.startsWith('/v1/') || a.hasAttribute('download')) return;
  e.preventDefault();
  go(url.pathname + url.search);
});
window.addEventListener('popstate', () => render());

onEvent((ev) => {
  if (current && current.event) current.event(ev);
});

(async () => {
  try {
    await loadSession();
  } catch (e) {
    say(`Could not reach the API: ${e.message}`, true);
  }
  if (session.who) startEvents();
  await render();
})();
