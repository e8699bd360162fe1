// The real OpenID Provider of the end-to-end tests: the certified `oidc-provider` package, on
// loopback HTTP, with the test users, the console's and plexctl's clients, plain-HTML
// interaction pages (tests/src/oidc.rs posts them headlessly) and a loopback-only test API to
// rotate its signing keys and to sign tokens with them.
//
//   node provider.mjs --port 0 --keys KEYS.json \
//     --console-client-id plexsphere-console --console-client-secret SECRET \
//     [--console-redirect URI]... --cli-client-id plexctl [--modules DIR]
//
// Prints `listening on http://127.0.0.1:PORT` once it serves. The issuer is that URL.
// The console client also accepts any https loopback `.../v1/auth/callback` on any port, so a
// test can start the provider before the control plane whose port it does not know yet.
// plexctl's client is public and native (loopback redirects on any port, RFC 8252) and may use
// the device authorization grant.
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';

function parseArgs(argv) {
  const out = { port: 0, consoleRedirects: [], modules: [] };
  for (let i = 0; i < argv.length; i += 1) {
    const flag = argv[i];
    const value = argv[i + 1];
    if (value === undefined) throw new Error(`${flag} needs a value`);
    i += 1;
    switch (flag) {
      case '--port': out.port = Number(value); break;
      case '--keys': out.keys = value; break;
      case '--console-client-id': out.consoleId = value; break;
      case '--console-client-secret': out.consoleSecret = value; break;
      case '--console-redirect': out.consoleRedirects.push(value); break;
      case '--cli-client-id': out.cliId = value; break;
      case '--modules': out.modules.push(value); break;
      default: throw new Error(`unknown flag ${flag}`);
    }
  }
  for (const [k, flag] of [['keys', '--keys'], ['consoleId', '--console-client-id'],
    ['consoleSecret', '--console-client-secret'], ['cliId', '--cli-client-id']]) {
    if (!out[k]) throw new Error(`${flag} is required`);
  }
  return out;
}

const args = parseArgs(process.argv.slice(2));
const here = path.dirname(fileURLToPath(import.meta.url));

// oidc-provider and jose come from the first of: --modules DIRs, this directory (a local
// `npm ci`), the cache scripts/deps.sh fills.
async function load(name) {
  const dirs = [...args.modules, here, '/var/cache/plexsphere/oidc-provider'];
  for (const dir of dirs) {
    try {
      const resolved = createRequire(path.join(dir, 'package.json')).resolve(name);
      return await import(pathToFileURL(resolved).href);
    } catch (e) {
      if (e.code !== 'MODULE_NOT_FOUND' && e.code !== 'ERR_MODULE_NOT_FOUND') throw e;
    }
  }
  throw new Error(`${name} is not installed in ${dirs.join(', ')}; run scripts/deps.sh`);
}
const { default: Provider } = await load('oidc-provider');
const jose = await load('jose');

// The test users. Password: `<name>-password`.
const USERS = {
  alice: { email: 'alice@example.test', name: 'Alice Example', groups: ['ops'] },
  bob: { email: 'bob@example.test', name: 'Bob Example', groups: ['dev'] },
  mallory: { email: 'mallory@example.test', name: 'Mallory Example', groups: [] },
};

function newKeys() {
  const rsa = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ format: 'jwk' });
  const ec = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey.export({ format: 'jwk' });
  return {
    keys: [
      { ...rsa, kid: `rs-${crypto.randomBytes(6).toString('hex')}`, alg: 'RS256', use: 'sig' },
      { ...ec, kid: `es-${crypto.randomBytes(6).toString('hex')}`, alg: 'ES256', use: 'sig' },
    ],
  };
}

function loadOrCreateKeys(file) {
  if (fs.existsSync(file)) return JSON.parse(fs.readFileSync(file, 'utf8'));
  const jwks = newKeys();
  fs.writeFileSync(file, JSON.stringify(jwks), { mode: 0o600 });
  return jwks;
}

const esc = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const page = (title, body) => `<!DOCTYPE html><html><head><meta charset="utf-8"><title>${esc(title)}</title></head><body><h1>${esc(title)}</h1>${body}</body></html>`;

function isLoopbackCallback(value) {
  try {
    const u = new URL(value);
    return u.protocol === 'https:' && ['127.0.0.1', 'localhost', '[::1]'].includes(u.hostname)
      && u.pathname === '/v1/auth/callback' && u.search === '' && u.hash === '';
  } catch {
    return false;
  }
}

let jwks = loadOrCreateKeys(args.keys);
let issuer; // set once listening
let provider;
let handler;

function buildProvider() {
  const p = new Provider(issuer, {
    clients: [
      {
        client_id: args.consoleId,
        client_secret: args.consoleSecret,
        client_name: 'plexsphere console',
        redirect_uris: args.consoleRedirects.length ? args.consoleRedirects : ['https://127.0.0.1/v1/auth/callback'],
        grant_types: ['authorization_code'],
        response_types: ['code'],
        token_endpoint_auth_method: 'client_secret_basic',
        id_token_signed_response_alg: 'RS256',
      },
      {
        client_id: args.cliId,
        client_name: 'plexctl',
        application_type: 'native',
        token_endpoint_auth_method: 'none',
        redirect_uris: ['http://127.0.0.1/callback'],
        grant_types: ['authorization_code', 'urn:ietf:params:oauth:grant-type:device_code'],
        response_types: ['code'],
        id_token_signed_response_alg: 'ES256',
      },
    ],
    jwks,
    cookies: { keys: [crypto.randomBytes(32).toString('hex')] },
    scopes: ['openid', 'email', 'profile', 'groups'],
    claims: {
      openid: ['sub'],
      email: ['email', 'email_verified'],
      profile: ['name'],
      groups: ['groups'],
    },
    conformIdTokenClaims: false,
    pkce: { required: () => true },
    features: {
      devInteractions: { enabled: false },
      deviceFlow: {
        enabled: true,
        userCodeInputSource: async (ctx, form, out, err) => {
          ctx.body = page('Enter the code', `${err ? `<p class="error">${esc(err.message || err.name)}</p>` : ''}${form}<button type="submit" form="op.deviceInputForm">Continue</button>`);
        },
        userCodeConfirmSource: async (ctx, form, client, deviceInfo, userCode) => {
          ctx.body = page('Confirm the device', `<p>${esc(client.clientName || client.clientId)} shows the code <code>${esc(userCode)}</code></p>${form}<button type="submit" form="op.deviceConfirmForm">Continue</button>`);
        },
        successSource: async (ctx) => {
          ctx.body = page('Signed in', '<p id="device-success">You can close this page.</p>');
        },
      },
    },
    interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
    findAccount: async (ctx, sub) => {
      const user = USERS[sub];
      if (!user) return undefined;
      return {
        accountId: sub,
        claims: async () => ({ sub, email: user.email, email_verified: true, name: user.name, groups: user.groups }),
      };
    },
    renderError: async (ctx, out) => {
      ctx.type = 'html';
      ctx.body = page('Error', `<pre id="error">${esc(JSON.stringify(out))}</pre>`);
    },
  });
  const allowed = p.Client.prototype.redirectUriAllowed;
  p.Client.prototype.redirectUriAllowed = function redirectUriAllowed(value) {
    if (allowed.call(this, value)) return true;
    return this.clientId === args.consoleId && isLoopbackCallback(value);
  };
  return p;
}

async function readForm(req) {
  const chunks = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size > 64 * 1024) throw new Error('form too large');
    chunks.push(chunk);
  }
  const body = Buffer.concat(chunks).toString('utf8');
  if ((req.headers['content-type'] || '').startsWith('application/json')) return JSON.parse(body || '{}');
  return Object.fromEntries(new URLSearchParams(body));
}

function send(res, status, type, body) {
  res.writeHead(status, { 'content-type': type, 'cache-control': 'no-store' });
  res.end(body);
}

// The interaction pages: a login form, then a consent form.
async function interaction(req, res, uid, action) {
  const details = await provider.interactionDetails(req, res);
  if (details.uid !== uid) throw new Error('interaction mismatch');
  const { prompt, params } = details;
  if (req.method === 'GET') {
    if (prompt.name === 'login') {
      return send(res, 200, 'text/html', page('Sign in', `<form method="post" action="/interaction/${esc(uid)}/login"><label>User <input name="login" autocomplete="username"></label><label>Password <input name="password" type="password"></label><button type="submit">Sign in</button></form>`));
    }
    return send(res, 200, 'text/html', page('Allow access', `<p>${esc(params.client_id)} asks for ${esc(params.scope)}</p><form method="post" action="/interaction/${esc(uid)}/confirm"><input type="hidden" name="confirm" value="yes"><button type="submit">Allow</button></form>`));
  }
  const form = await readForm(req);
  if (action === 'login') {
    const user = USERS[form.login];
    if (!user || form.password !== `${form.login}-password`) {
      return send(res, 200, 'text/html', page('Sign in', `<p class="error">Wrong user or password.</p><form method="post" action="/interaction/${esc(uid)}/login"><label>User <input name="login"></label><label>Password <input name="password" type="password"></label><button type="submit">Sign in</button></form>`));
    }
    return provider.interactionFinished(req, res, { login: { accountId: form.login } }, { mergeWithLastSubmission: false });
  }
  if (action === 'confirm') {
    const { accountId } = details.session;
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId, clientId: params.client_id });
    const missing = prompt.details;
    if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
    if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
    if (missing.missingResourceScopes) {
      for (const [indicator, scopes] of Object.entries(missing.missingResourceScopes)) {
        grant.addResourceScope(indicator, scopes.join(' '));
      }
    }
    const grantId = await grant.save();
    return provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
  }
  throw new Error(`unknown interaction action ${action}`);
}

// The loopback-only test API.
//   POST /test/rotate-keys            new RS256 and ES256 keys; the old ones leave the JWKS.
//   POST /test/sign {header, claims, key: "current"|"foreign"|"none"}
//        a compact JWS over `claims` with the provider's current key of header.alg, with a key
//        the provider never published ("foreign"), or unsigned (`alg: none`).
async function testApi(req, res, what) {
  if (req.method !== 'POST') return send(res, 405, 'text/plain', 'POST only');
  const body = await readForm(req);
  if (what === 'rotate-keys') {
    jwks = newKeys();
    fs.writeFileSync(args.keys, JSON.stringify(jwks), { mode: 0o600 });
    provider = buildProvider();
    handler = provider.callback();
    return send(res, 200, 'application/json', JSON.stringify({ kids: jwks.keys.map((k) => k.kid) }));
  }
  if (what === 'sign') {
    const header = { typ: 'JWT', alg: 'RS256', ...(body.header || {}) };
    const claims = body.claims || {};
    if (body.key === 'none') {
      const enc = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
      return send(res, 200, 'application/jwt', `${enc({ ...header, alg: 'none' })}.${enc(claims)}.`);
    }
    let jwk;
    if (body.key === 'foreign') {
      const k = newKeys().keys.find((x) => x.alg === header.alg);
      jwk = k;
      header.kid = header.kid ?? jwks.keys.find((x) => x.alg === header.alg)?.kid;
    } else {
      jwk = jwks.keys.find((x) => x.alg === header.alg);
      header.kid = header.kid ?? jwk?.kid;
    }
    if (!jwk) return send(res, 400, 'text/plain', `no key for ${header.alg}`);
    const key = await jose.importJWK(jwk, header.alg);
    const jwt = await new jose.CompactSign(Buffer.from(JSON.stringify(claims))).setProtectedHeader(header).sign(key);
    return send(res, 200, 'application/jwt', jwt);
  }
  return send(res, 404, 'text/plain', 'no such test endpoint');
}

const server = http.createServer(async (req, res) => {
  try {
    const url = new URL(req.url, issuer);
    const inter = url.pathname.match(/^\/interaction\/([^/]+)(?:\/(login|confirm))?$/);
    if (inter) return await interaction(req, res, inter[1], inter[2]);
    const test = url.pathname.match(/^\/test\/([a-z-]+)$/);
    if (test) return await testApi(req, res, test[1]);
    return handler(req, res);
  } catch (e) {
    if (!res.headersSent) send(res, 400, 'text/html', page('Error', `<pre id="error">${esc(e.message)}</pre>`));
    else res.end();
    return undefined;
  }
});

server.listen(args.port, '127.0.0.1', () => {
  const { port } = server.address();
  issuer = `http://127.0.0.1:${port}`;
  provider = buildProvider();
  handler = provider.callback();
  process.stdout.write(`listening on ${issuer}\n`);
});

for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => server.close(() => process.exit(0)));
