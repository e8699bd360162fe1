// Building the page: every value goes in as a text node or an attribute set through the DOM.
// No HTML strings anywhere in the console (a unit test of the server greps the assets).

const SVG = 'http://www.w3.org/2000/svg';

function fill(el, attrs, children) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (typeof v === 'function' && k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** An HTML element: h('a', {href: '/nodes'}, 'Nodes'). */
export function h(tag, attrs, ...children) {
  return fill(document.createElement(tag), attrs, children);
}

/** An SVG element. */
export function s(tag, attrs, ...children) {
  return fill(document.createElementNS(SVG, tag), attrs, children);
}

/** Replaces the children of `el`. */
export function put(el, ...children) {
  el.replaceChildren();
  return fill(el, {}, children);
}

/** A table from column titles and rows of cells (each a value or a node). */
export function table(caption, heads, rows, attrs) {
  return h('div', { class: 'scroll' },
    h('table', attrs || {},
      caption ? h('caption', {}, caption) : null,
      h('thead', {}, h('tr', {}, heads.map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', {}, rows.map((r) => h('tr', {}, r.map((c) => h('td', {}, c)))))));
}

/** A labelled form field. */
export function field(label, input) {
  const id = input.id || `f-${Math.random().toString(36).slice(2, 9)}`;
  input.id = id;
  return h('div', { class: 'field' }, h('label', { for: id }, label), input);
}

/** "3 min ago" for an RFC 3339 time, with the exact time in a title. */
export function ago(rfc3339) {
  if (!rfc3339) return h('span', { class: 'muted' }, 'never');
  const t = Date.parse(rfc3339);
  if (Number.isNaN(t)) return String(rfc3339);
  const secs = Math.round((Date.now() - t) / 1000);
  let text;
  if (secs < 0) text = 'just now';
  else if (secs < 60) text = `${secs} s ago`;
  else if (secs < 3600) text = `${Math.floor(secs / 60)} min ago`;
  else if (secs < 86400) text = `${Math.floor(secs / 3600)} h ago`;
  else text = `${Math.floor(secs / 86400)} d ago`;
  return h('time', { datetime: rfc3339, title: rfc3339 }, text);
}

/** A status badge. */
export function badge(text, kind) {
  return h('span', { class: `badge badge-${kind || text}` }, text);
}

/** Shows a message in the status line (errors stay until the next message). */
export function say(text, isError) {
  const el = document.getElementById('status');
  if (!el) return;
  el.textContent = text || '';
  el.className = isError ? 'status error' : 'status';
}
