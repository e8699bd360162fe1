// Who is signed in and what they may do: /v1/auth/whoami (sessions and tokens), or for a
// server without sign-in /v1/operator-tokens/self. The console hides what a person may not
// do; the API refuses it anyway.

import { ApiError, bearer, get } from './api.js';

const RANK = { auditor: 1, member: 2, admin: 3 };
// The least role each need takes (the route table's Need): audit is its own right.
const NEED = { read: 1, operate: 2, admin: 3 };

export const session = { who: null, config: { enabled: false, issuer: null } };

function fromToken(t) {
  const role = { 'read-only': 'auditor', operator: 'member', admin: 'admin' }[t.scope] || 'auditor';
  const scope = t.project_id ? { kind: 'project', id: t.project_id } : { kind: 'platform', id: null };
  return { via: 'token', id: t.id, name: t.name, person: null, roles: [{ role, scope }], csrf: false };
}

export async function loadSession() {
  try {
    session.config = await get('/v1/auth/config');
  } catch {
    session.config = { enabled: false, issuer: null };
  }
  session.who = null;
  try {
    session.who = await get('/v1/auth/whoami');
  } catch (e) {
    if (!(e instanceof ApiError)) throw e;
    if (e.status === 404 && bearer()) session.who = fromToken(await get('/v1/operator-tokens/self'));
    else if (e.status !== 401 && e.status !== 404) throw e;
  }
  return session.who;
}

function covers(scope, target, projects) {
  if (scope.kind === 'platform') return true;
  if (!target) return false;
  if (scope.kind === 'domain') {
    if (target.domain) return scope.id === target.domain;
    const p = target.project && projects.get(target.project);
    return Boolean(p && p.domain_id === scope.id);
  }
  return scope.kind === 'project' && target.project === scope.id;
}

/**
 * Whether the signed-in person may do `need` ('read', 'operate', 'admin', 'audit') on a
 * target ({project} or {domain}; none: anywhere). `projects` maps project ids to projects.
 */
export function can(need, target, projects) {
  const who = session.who;
  if (!who) return false;
  const known = projects || new Map();
  return (who.roles || []).some((r) => {
    const rank = RANK[r.role] || 0;
    const ok = need === 'audit' ? r.role === 'admin' || r.role === 'auditor' : rank >= (NEED[need] || 9);
    if (!ok) return false;
    if (!target) return true;
    return covers(r.scope, target, known);
  });
}

export function displayName(who) {
  if (!who) return '';
  if (who.person) return who.person.email || who.person.name || who.person.subject;
  return who.name || who.id;
}
