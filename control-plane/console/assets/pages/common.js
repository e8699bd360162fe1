// What several pages share: the Projects and Domains the caller sees, and pickers for them.

import { get, items } from '../api.js';
import { field, h } from '../dom.js';

export async function projectsById() {
  const list = items(await get('/v1/projects'));
  return new Map(list.map((p) => [p.id, p]));
}

export async function domains() {
  return items(await get('/v1/domains'));
}

export function projectLabel(projects, id) {
  const p = projects.get(id);
  if (!p) return id;
  return p.display_name || p.slug;
}

/** A <select> of `options` ([value, label]) that calls `onchange(value)`. */
export function picker(label, options, selected, onchange) {
  const sel = h('select', { onchange: (e) => onchange(e.target.value) },
    options.map(([v, t]) => h('option', { value: v, selected: v === selected }, t)));
  return field(label, sel);
}

/** The `?key=` of the URL, else the first option. */
export function chosen(ctx, key, options) {
  const want = ctx.query.get(key);
  if (want && options.some(([v]) => v === want)) return want;
  return options.length ? options[0][0] : null;
}

/** Calls `fn` at most once per `ms` (the last call wins): live refetches. */
export function throttle(fn, ms) {
  let timer = null;
  return () => {
    if (timer) return;
    timer = setTimeout(() => { timer = null; fn(); }, ms);
  };
}
