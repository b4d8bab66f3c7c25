// AppSync's authorization modes besides API keys, against a real herald:
// aws-amplify's Events client with authMode userPool, oidc, lambda, iam and
// apiKey (clients/amplify_auth.mjs, configured offline with keys and tokens
// made here), then raw frames for hostile tokens, per-namespace modes, and a
// JWKS server and Lambda authorizer run here on loopback that answer, stall
// or are down.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { generateKeyPairSync, sign as cryptoSign } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import WebSocket from 'ws';
import { signRequest } from '@aws-amplify/core/internals/aws-client-utils';
import { startHerald, freePort, within } from '../lib/herald.mjs';
import { metric } from '../lib/raw.mjs';

const fixture = (name) => fileURLToPath(new URL(`../../tests/fixtures/${name}`, import.meta.url));
const client = fileURLToPath(new URL('../clients/amplify_auth.mjs', import.meta.url));
const TLS = { tls_cert: fixture('tls-test-cert.pem'), tls_key: fixture('tls-test-key.pem') };

const POOL = 'us-east-1_HeraldTest';
const COGNITO_ISS = `https://cognito-idp.us-east-1.amazonaws.com/${POOL}`;
const OIDC_ISS = 'https://oidc.herald.test';
const IAM = { id: 'AKIDHERALDTEST', secret: 'herald/test+secret' };
const API_KEY = 'da2-herald-auth';

// ----- keys, tokens --------------------------------------------------------------

const rsa = generateKeyPairSync('rsa', { modulusLength: 2048 });
const rsa2 = generateKeyPairSync('rsa', { modulusLength: 2048 });
const ec = generateKeyPairSync('ec', { namedCurve: 'P-256' });
const stranger = generateKeyPairSync('rsa', { modulusLength: 2048 });
const jwk = (pair, kid) => ({ ...pair.publicKey.export({ format: 'jwk' }), kid, use: 'sig' });
const b64url = (o) => Buffer.from(typeof o === 'string' ? o : JSON.stringify(o)).toString('base64url');
const now = () => Math.floor(Date.now() / 1000);

function jwt(header, claims, pair) {
  const data = `${b64url(header)}.${b64url(claims)}`;
  let sig = '';
  if (header.alg === 'RS256') sig = cryptoSign('sha256', Buffer.from(data), pair.privateKey).toString('base64url');
  if (header.alg === 'ES256')
    sig = cryptoSign('sha256', Buffer.from(data), { key: pair.privateKey, dsaEncoding: 'ieee-p1363' }).toString('base64url');
  return `${data}.${sig}`;
}
const cognitoClaims = (extra = {}) => ({
  sub: 'u-1',
  iss: COGNITO_ISS,
  client_id: 'client-web',
  token_use: 'access',
  'cognito:groups': ['readers'],
  username: 'ann',
  iat: now(),
  exp: now() + 600,
  ...extra,
});
const cognito = (extra, kid = 'rsa-1', pair = rsa) => jwt({ alg: 'RS256', kid, typ: 'JWT' }, cognitoClaims(extra), pair);
const oidcClaims = (extra = {}) => ({ sub: 'o-1', iss: OIDC_ISS, aud: 'herald-tests', iat: now(), exp: now() + 600, ...extra });
const oidc = (extra) => jwt({ alg: 'ES256', kid: 'ec-1' }, oidcClaims(extra), ec);

// ----- the JWKS server and the Lambda authorizer ----------------------------------

const jwksHits = { cognito: 0, oidc: 0 };
let cognitoKeys = [jwk(rsa, 'rsa-1')];
const lambdaCalls = [];

function listen(handler) {
  const server = http.createServer(handler);
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

let jwksServer;
let lambdaServer;
const stalled = new Set();

async function startServers() {
  jwksServer = await listen((req, res) => {
    if (req.url === '/cognito/jwks.json') {
      jwksHits.cognito++;
      return res.end(JSON.stringify({ keys: cognitoKeys }));
    }
    if (req.url === '/oidc/jwks.json') {
      jwksHits.oidc++;
      return res.end(JSON.stringify({ keys: [jwk(ec, 'ec-1')] }));
    }
    if (req.url === '/many/jwks.json') {
      // A thousand keys, ours first: Herald keeps a bounded number.
      const filler = Array.from({ length: 1000 }, (_, i) => jwk(ec, `filler-${i}`));
      return res.end(JSON.stringify({ keys: [jwk(rsa, 'rsa-1'), ...filler] }));
    }
    if (req.url === '/huge/jwks.json') {
      // Over Herald's size bound: refused, never half-read.
      return res.end(JSON.stringify({ keys: Array.from({ length: 5000 }, (_, i) => jwk(rsa, `k-${i}`)) }));
    }
    if (req.url === '/slow/jwks.json') {
      stalled.add(res);
      return; // never answers
    }
    res.statusCode = 404;
    res.end();
  });
  lambdaServer = await listen((req, res) => {
    let body = '';
    req.on('data', (d) => (body += d));
    req.on('end', () => {
      const call = JSON.parse(body);
      lambdaCalls.push(call);
      const token = call.authorizationToken;
      if (token === 'lambda-slow') {
        stalled.add(res);
        return;
      }
      res.setHeader('content-type', 'application/json');
      if (token === 'lambda-ok') return res.end(JSON.stringify({ isAuthorized: true, ttlOverride: 300, handlerContext: { user: 'lam' } }));
      if (token === 'lambda-500') {
        res.statusCode = 500;
        return res.end('{}');
      }
      res.end(JSON.stringify({ isAuthorized: false }));
    });
  });
}

const appConfig = (overrides = {}) => ({
  id: 'auth',
  key: 'auth-key',
  secret: 'auth-secret',
  api_keys: [API_KEY],
  auth_providers: [
    {
      type: 'AMAZON_COGNITO_USER_POOLS',
      user_pool_id: POOL,
      app_id_client_regex: 'client-[a-z]+',
      jwks_url: `http://127.0.0.1:${jwksServer.address().port}/cognito/jwks.json`,
      clock_skew: 5,
    },
    {
      type: 'OPENID_CONNECT',
      issuer: OIDC_ISS,
      client_id: 'herald-tests',
      jwks_url: `http://127.0.0.1:${jwksServer.address().port}/oidc/jwks.json`,
    },
    { type: 'AWS_LAMBDA', authorizer_url: `http://127.0.0.1:${lambdaServer.address().port}/authorize`, timeout_ms: 1500 },
    { type: 'AWS_IAM', access_keys: [{ access_key_id: IAM.id, secret_access_key: IAM.secret }], regions: ['us-east-1'] },
  ],
  namespaces: [
    { name: 'default' },
    { name: 'admins', subscribe_auth_modes: ['AMAZON_COGNITO_USER_POOLS'], publish_auth_modes: ['AWS_IAM'] },
  ],
  ...overrides,
});

/** Run the Amplify client; resolves with { code, out }. */
function runClient(h, env) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [client], {
      env: { ...process.env, HERALD_PORT: String(h.port), NODE_EXTRA_CA_CERTS: fixture('tls-test-cert.pem'), ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (out += d));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`amplify client timed out:\n${out}`));
    }, 45000);
    child.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, out });
    });
  });
}

// ----- raw Events sockets -----------------------------------------------------------

/** Open /event/realtime with `headers` in the header- subprotocol; resolves with the first answer. */
async function connectRaw(h, headers, ms = 5000) {
  const ws = new WebSocket(`ws://127.0.0.1:${h.port}/event/realtime`, [
    'aws-appsync-event-ws',
    `header-${b64url(headers)}`,
  ]);
  const messages = [];
  const waiters = [];
  ws.on('message', (d) => {
    const m = JSON.parse(String(d));
    if (m.type === 'ka') return;
    const w = waiters.shift();
    if (w) w(m);
    else messages.push(m);
  });
  ws.on('error', () => {});
  await within(new Promise((r, j) => (ws.once('open', r), ws.once('error', j))), 'the upgrade');
  const next = (what) =>
    messages.length ? Promise.resolve(messages.shift()) : within(new Promise((r) => waiters.push(r)), what, ms);
  ws.send(JSON.stringify({ type: 'connection_init' }));
  const first = await next('the answer to connection_init');
  return { ws, first, next, send: (m) => ws.send(JSON.stringify(m)) };
}

const host = (h) => `127.0.0.1:${h.port}`;

async function refusedWith(h, headers) {
  const c = await connectRaw(h, { host: host(h), ...headers });
  c.ws.close();
  assert.equal(c.first.type, 'connection_error', JSON.stringify(c.first));
  assert.equal(c.first.errors[0].errorType, 'UnauthorizedException');
  return c.first.errors[0].message;
}

/** A SigV4-signed POST /event as Amplify signs it. */
async function signedPost(h, body, key = IAM) {
  const url = new URL(`http://127.0.0.1:${h.port}/event`);
  const signed = signRequest(
    { method: 'POST', url, headers: { 'content-type': 'application/json; charset=UTF-8' }, body: JSON.stringify(body) },
    { credentials: { accessKeyId: key.id, secretAccessKey: key.secret }, signingRegion: 'us-east-1', signingService: 'appsync' },
  );
  const { host: _signedHost, ...headers } = signed.headers; // fetch sets the same Host itself
  const r = await fetch(url, { method: 'POST', headers, body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}

// ----- the tests ----------------------------------------------------------------------

before(startServers);
after(() => {
  for (const res of stalled) res.destroy();
  jwksServer?.close();
  lambdaServer?.close();
});

describe('aws-amplify Events client, each authMode', () => {
  let h;
  before(async () => {
    h = await startHerald({ ...TLS, apps: [appConfig()] });
  });
  after(() => h?.stop());

  for (const [mode, env] of [
    ['userPool', () => ({ AUTH_TOKEN: cognito() })],
    ['oidc', () => ({ AUTH_TOKEN: oidc() })],
    ['lambda', () => ({ AUTH_TOKEN: 'lambda-ok' })],
    ['iam', () => ({ AWS_KEY_ID: IAM.id, AWS_SECRET: IAM.secret })],
    ['apiKey', () => ({ API_KEY })],
  ]) {
    test(`${mode}: connect, subscribe, publish over WebSocket and HTTPS`, async () => {
      const { code, out } = await runClient(h, { AUTH_MODE: mode, ...env() });
      assert.equal(code, 0, out);
    });
  }

  test('refused: an expired Cognito token, a denied Lambda token, an unknown IAM key', async () => {
    for (const env of [
      { AUTH_MODE: 'userPool', AUTH_TOKEN: cognito({ exp: now() - 3600 }) },
      { AUTH_MODE: 'lambda', AUTH_TOKEN: 'lambda-deny' },
      { AUTH_MODE: 'iam', AWS_KEY_ID: 'AKIDNOBODY', AWS_SECRET: 'x' },
    ]) {
      const { code, out } = await runClient(h, { ...env, EXPECT: 'refused' });
      assert.equal(code, 0, `${env.AUTH_MODE}: ${out}`);
    }
  });
});

describe('raw frames: hostile tokens, namespaces, the authorizer and the JWKS', () => {
  let h;
  before(async () => {
    h = await startHerald({ apps: [appConfig()] });
  });
  after(() => h?.stop());

  test('an unknown kid fetches the JWKS again (key rotation), at most once per interval', async () => {
    cognitoKeys = [jwk(rsa, 'rsa-1')];
    const first = await connectRaw(h, { host: host(h), Authorization: cognito() });
    assert.equal(first.first.type, 'connection_ack');
    first.ws.close();
    const hitsBefore = jwksHits.cognito;
    // The pool rotates: a token signed with the new key fetches the JWKS again.
    cognitoKeys = [jwk(rsa, 'rsa-1'), jwk(rsa2, 'rsa-2')];
    const ok = await connectRaw(h, { host: host(h), Authorization: cognito({}, 'rsa-2', rsa2) });
    assert.equal(ok.first.type, 'connection_ack');
    ok.ws.close();
    assert.equal(jwksHits.cognito, hitsBefore + 1);
    // Unknown kids in a burst right after: refused, and no fetch storm.
    for (let i = 0; i < 5; i++) await refusedWith(h, { Authorization: cognito({}, `bogus-${i}`, stranger) });
    assert.equal(jwksHits.cognito, hitsBefore + 1);
  });

  test('a good token connects; expired, unknown-key, other-audience, alg:none and oversized ones do not', async () => {
    const ok = await connectRaw(h, { host: host(h), Authorization: cognito() });
    assert.equal(ok.first.type, 'connection_ack');
    ok.ws.close();
    assert.match(await refusedWith(h, { Authorization: cognito({ exp: now() - 60 }) }), /expired/);
    assert.match(await refusedWith(h, { Authorization: cognito({}, 'rsa-1', stranger) }), /signature/);
    assert.match(await refusedWith(h, { Authorization: cognito({}, 'no-such-kid', stranger) }), /unknown key/);
    assert.match(await refusedWith(h, { Authorization: cognito({ client_id: 'other-app' }) }), /app client/);
    assert.match(await refusedWith(h, { Authorization: oidc({ aud: 'someone-else' }) }), /audience/);
    assert.match(await refusedWith(h, { Authorization: oidc({ nbf: now() + 3600 }) }), /not valid yet/);
    const none = `${b64url({ alg: 'none' })}.${b64url(cognitoClaims())}.`;
    assert.match(await refusedWith(h, { Authorization: none }), /"none"/);
    const hs = jwt({ alg: 'HS256', kid: 'rsa-1' }, cognitoClaims(), rsa);
    assert.match(await refusedWith(h, { Authorization: hs }), /HS256/);
    // An oversized token is refused by the header's own bound (or the
    // upgrade's header limit): never verified, never accepted.
    const big = cognito({ pad: 'x'.repeat(20000) });
    const c = await connectRaw(h, { host: host(h), Authorization: big }).catch((e) => ({ failed: e }));
    if (!c.failed) {
      assert.equal(c.first.type, 'connection_error');
      c.ws.close();
    }
  });

  test('the GraphQL API: an OIDC token on the socket and on the publish mutation; a bad one refused', async () => {
    const headers = { host: host(h), Authorization: oidc() };
    const url = `ws://127.0.0.1:${h.port}/graphql?header=${encodeURIComponent(Buffer.from(JSON.stringify(headers)).toString('base64'))}&payload=e30=`;
    const ws = new WebSocket(url, ['graphql-ws']);
    const messages = [];
    const waiters = [];
    ws.on('message', (d) => {
      const m = JSON.parse(String(d));
      if (m.type === 'ka') return;
      const w = waiters.shift();
      if (w) w(m);
      else messages.push(m);
    });
    await within(new Promise((r, j) => (ws.once('open', r), ws.once('error', j))), 'the GraphQL upgrade');
    const next = (what) => (messages.length ? Promise.resolve(messages.shift()) : within(new Promise((r) => waiters.push(r)), what));
    ws.send(JSON.stringify({ type: 'connection_init' }));
    assert.equal((await next('connection_ack')).type, 'connection_ack');
    const data = JSON.stringify({
      query: 'subscription S($name: String!) { subscribe(name: $name) { name data } }',
      variables: { name: 'oidc-room' },
    });
    ws.send(JSON.stringify({ type: 'start', id: 'g1', payload: { data, extensions: { authorization: headers } } }));
    assert.equal((await next('start_ack')).type, 'start_ack');
    const mutation = {
      query: 'mutation P($name: String!, $data: AWSJSON!) { publish(name: $name, data: $data) { name data } }',
      variables: { name: 'oidc-room', data: '{"via":"oidc"}' },
    };
    const post = (authorization) =>
      fetch(`http://127.0.0.1:${h.port}/graphql`, {
        method: 'POST',
        headers: { authorization, 'content-type': 'application/json' },
        body: JSON.stringify(mutation),
      });
    const r = await post(oidc());
    assert.equal(r.status, 200, await r.clone().text());
    const m = await next('data');
    assert.equal(m.payload.data.subscribe.data, '{"via":"oidc"}');
    const bad = await post(oidc({ aud: 'someone-else' }));
    assert.equal(bad.status, 401);
    assert.equal(bad.headers.get('x-amzn-errortype'), 'UnauthorizedException');
    // A start with an expired token of its own: a GraphQL error, the socket stays.
    const expired = { host: host(h), Authorization: oidc({ exp: now() - 3600 }) };
    ws.send(JSON.stringify({ type: 'start', id: 'g2', payload: { data, extensions: { authorization: expired } } }));
    const e = await next('error');
    assert.equal(e.type, 'error');
    assert.equal(e.payload.errors[0].errorType, 'UnauthorizedException');
    ws.close();
  });

  test('per namespace and operation: Cognito may subscribe to admins but not publish; IAM may publish', async () => {
    const c = await connectRaw(h, { host: host(h), Authorization: cognito() });
    assert.equal(c.first.type, 'connection_ack');
    c.send({ type: 'subscribe', id: 'a1', channel: '/admins/room' });
    assert.equal((await c.next('subscribe_success')).type, 'subscribe_success');
    c.send({ type: 'publish', id: 'p1', channel: '/admins/room', events: ['{"n":1}'] });
    const refused = await c.next('publish_error');
    assert.equal(refused.type, 'publish_error');
    assert.equal(refused.errors[0].errorType, 'UnauthorizedException');
    // An API key is not among admins' subscribe modes either.
    c.send({ type: 'subscribe', id: 'a2', channel: '/admins/other', authorization: { host: host(h), 'x-api-key': API_KEY } });
    assert.equal((await c.next('subscribe_error')).errors[0].errorType, 'UnauthorizedException');
    // IAM publishes to admins over HTTP; the Cognito subscriber gets it.
    const r = await signedPost(h, { channel: '/admins/room', events: ['{"from":"iam"}'] });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    const data = await c.next('data');
    assert.deepEqual(JSON.parse(data.event), { from: 'iam' });
    // A signature over another body, or by an unknown key, is refused.
    const wrong = await signedPost(h, { channel: '/admins/room', events: ['{}'] }, { id: IAM.id, secret: 'nope' });
    assert.equal(wrong.status, 401);
    c.ws.close();
  });

  test('the Lambda authorizer: AppSync\'s request, ttlOverride cached per token, slow and failing ones refuse without holding others', async () => {
    lambdaCalls.length = 0;
    for (let i = 0; i < 3; i++) {
      const c = await connectRaw(h, { host: host(h), Authorization: 'lambda-ok', 'x-custom': 'v' });
      assert.equal(c.first.type, 'connection_ack');
      c.ws.close();
    }
    assert.equal(lambdaCalls.length, 1, 'one call, then the cached answer');
    const call = lambdaCalls[0];
    assert.equal(call.authorizationToken, 'lambda-ok');
    assert.equal(call.requestContext.operation, 'EVENT_CONNECT');
    assert.equal(call.requestContext.apiId, 'auth');
    assert.equal(call.requestHeaders['x-custom'], 'v');
    assert.equal(call.requestHeaders.authorization, undefined);

    const before = await metric(h, 'herald_appsync_authorizer_failures_total');
    const started = Date.now();
    let slowDone = false;
    const slow = connectRaw(h, { host: host(h), Authorization: 'lambda-slow' }).finally(() => (slowDone = true));
    // Meanwhile an API-key client connects, without waiting for it.
    const quick = await connectRaw(h, { host: host(h), 'x-api-key': API_KEY });
    assert.equal(quick.first.type, 'connection_ack');
    assert.equal(slowDone, false, 'not held behind the slow authorizer');
    quick.ws.close();
    const s = await slow;
    assert.equal(s.first.type, 'connection_error');
    s.ws.close();
    assert.ok(Date.now() - started < 5000, 'the slow authorizer is bounded by timeout_ms');
    assert.equal((await refusedWith(h, { Authorization: 'lambda-500' })).length > 0, true);
    assert.ok((await metric(h, 'herald_appsync_authorizer_failures_total')) >= before + 2);
  });

});

describe('a JWKS that is down, stalls or is huge; an authorizer that is down', () => {
  test('refused within bounds, counted; a JWKS of a thousand keys serves its first ones (and Cognito groups), a JWKS file works offline; an oversized one refuses', async () => {
    const dead = await freePort();
    const port = jwksServer.address().port;
    const app = appConfig({
      namespaces: [],
      auth_providers: [
        { type: 'AMAZON_COGNITO_USER_POOLS', user_pool_id: POOL, jwks_url: `http://127.0.0.1:${port}/slow/jwks.json`, jwks_timeout_ms: 500 },
        { type: 'OPENID_CONNECT', issuer: OIDC_ISS, jwks_url: `http://127.0.0.1:${dead}/jwks.json`, jwks_timeout_ms: 500 },
        { type: 'AWS_LAMBDA', authorizer_url: `http://127.0.0.1:${dead}/authorize`, timeout_ms: 500 },
      ],
    });
    const h = await startHerald({ apps: [app] });
    try {
      const before = await metric(h, 'herald_appsync_authorizer_failures_total');
      let started = Date.now();
      await refusedWith(h, { Authorization: cognito() });
      assert.ok(Date.now() - started < 2500, 'a stalled JWKS is bounded');
      started = Date.now();
      await refusedWith(h, { Authorization: oidc() });
      await refusedWith(h, { Authorization: 'anything' });
      assert.ok(Date.now() - started < 2500, 'a JWKS or authorizer that is down refuses at once');
      assert.ok((await metric(h, 'herald_appsync_authorizer_failures_total')) >= before + 3);
    } finally {
      await h.stop();
    }
    const many = appConfig({
      namespaces: [],
      auth_providers: [
        { type: 'AMAZON_COGNITO_USER_POOLS', user_pool_id: POOL, jwks_url: `http://127.0.0.1:${port}/many/jwks.json`, groups: ['admins'] },
      ],
    });
    const h2 = await startHerald({ apps: [many] });
    try {
      const c = await connectRaw(h2, { host: host(h2), Authorization: cognito({ 'cognito:groups': ['readers', 'admins'] }) });
      assert.equal(c.first.type, 'connection_ack');
      c.ws.close();
      // The provider's groups: a reader alone is refused.
      assert.match(await refusedWith(h2, { Authorization: cognito() }), /group/);
    } finally {
      await h2.stop();
    }
    // Air-gapped: the keys from a file, no URL at all.
    const dir = mkdtempSync(join(tmpdir(), 'herald-jwks-'));
    writeFileSync(join(dir, 'jwks.json'), JSON.stringify({ keys: [jwk(rsa, 'rsa-1')] }));
    const fromFile = appConfig({
      namespaces: [],
      auth_providers: [{ type: 'AMAZON_COGNITO_USER_POOLS', user_pool_id: POOL, jwks_file: join(dir, 'jwks.json') }],
    });
    const h4 = await startHerald({ apps: [fromFile] });
    try {
      const c = await connectRaw(h4, { host: host(h4), Authorization: cognito() });
      assert.equal(c.first.type, 'connection_ack');
      c.ws.close();
      await refusedWith(h4, { Authorization: cognito({}, 'rsa-1', stranger) });
    } finally {
      await h4.stop();
    }
    const huge = appConfig({
      namespaces: [],
      auth_providers: [{ type: 'AMAZON_COGNITO_USER_POOLS', user_pool_id: POOL, jwks_url: `http://127.0.0.1:${port}/huge/jwks.json` }],
    });
    const h3 = await startHerald({ apps: [huge] });
    try {
      await refusedWith(h3, { Authorization: cognito() });
    } finally {
      await h3.stop();
    }
  });
});
