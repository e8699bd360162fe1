// What several pages share: the Projects and Domains the caller sees, and pickers for them.

import { enc, get, items } from '../api.js';
import { field, h, put } from '../dom.js';

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

/**
 * The Project a per-Project page shows (`?project=`, else the first the caller sees), with
 * the Projects and the picker's options; `null` (and the page says so) when the caller sees none.
 */
export async function projectOfPage(main, ctx, title) {
  const projects = await projectsById();
  const options = [...projects.values()].map((p) => [p.id, projectLabel(projects, p.id)]);
  const project = chosen(ctx, 'project', options);
  if (!project) {
    put(main, h('h1', {}, title), h('p', {}, 'You see no Project.'));
    return null;
  }
  return { projects, project, options };
}

/** The Project picker of a per-Project page at `path` (plain text when there is one Project). */
export function projectChoice(state, path) {
  const { projects, project, options } = state;
  return options.length > 1
    ? picker('Project', options, project, (p) => state.go(`${path}?project=${enc(p)}`))
    : h('p', {}, `Project ${projectLabel(projects, project)}`);
}
