// The API client: same origin, the session cookie (with the CSRF header on writes) or an
// operator token kept for this tab only (sessionStorage) and sent as a bearer token.

const TOKEN_KEY = 'plexsphere-operator-token';
const CSRF_COOKIE = '__Host-plexsphere-csrf';
export const CSRF_HEADER = 'X-Plexsphere-CSRF';

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function bearer() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setBearer(token) {
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
}

export function csrfToken() {
  for (const part of document.cookie.split(';')) {
    const [k, ...v] = part.trim().split('=');
    if (k === CSRF_COOKIE) return decodeURIComponent(v.join('='));
  }
  return null;
}

/** The headers every request carries: the bearer token, or the CSRF value on writes. */
export function authHeaders(method) {
  const headers = { Accept: 'application/json' };
  const t = bearer();
  if (t) headers.Authorization = `Bearer ${t}`;
  else if (method !== 'GET' && method !== 'HEAD') {
    const c = csrfToken();
    if (c) headers[CSRF_HEADER] = c;
  }
  return headers;
}

export async function api(method, path, body) {
  const headers = authHeaders(method);
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const resp = await fetch(path, {
    method,
    headers,
    credentials: 'same-origin',
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await resp.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch { data = null; }
  }
  if (!resp.ok) {
    const code = (data && data.code) || `http_${resp.status}`;
    const msg = (data && data.message) || `${method} ${path} answered ${resp.status}`;
    throw new ApiError(resp.status, code, msg);
  }
  return data;
}

export const get = (path) => api('GET', path);
export const post = (path, body) => api('POST', path, body === undefined ? {} : body);
export const put = (path, body) => api('PUT', path, body);

/** The items of a `{"items": [...]}` list, or the array itself. */
export function items(data) {
  if (Array.isArray(data)) return data;
  return (data && data.items) || [];
}

export const enc = encodeURIComponent;
