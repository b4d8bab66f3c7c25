// HTTP API request authentication and error statuses, with hand-signed (or
// deliberately mis-signed) requests: what the SDKs never send.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startHerald, once, http, DEV_APP } from '../lib/herald.mjs';
import { collect, metric, signedFetch } from '../lib/raw.mjs';

const DISABLED = { id: 'off', key: 'off-key', secret: 'off-secret' };
const SMALL = { id: 'small', key: 'small-key', secret: 'small-secret' };
let h;
before(async () => {
  h = await startHerald({
    max_request_size: 64 * 1024,
    apps: [DEV_APP, { ...DISABLED, enabled: false }, { ...SMALL, max_payload: 100 }],
  });
});
after(async () => { await h.stop(); });

const EVENTS = `/apps/${DEV_APP.id}/events`;
const event = (channel, data = '{}') => ({ name: 'ev', channel, data });

test('a correctly hand-signed request is accepted (the signing recipe is right)', async () => {
  const c = h.client();
  const ch = c.subscribe('signed');
  await once(ch, 'pusher:subscription_succeeded');
  const got = once(ch, 'ev');
  const r = await signedFetch(h, 'POST', EVENTS, { body: event('signed', '"hi"') });
  assert.equal(r.status, 200, r.text);
  assert.equal(await got, 'hi');
  const g = await signedFetch(h, 'GET', `/apps/${DEV_APP.id}/channels`, { params: { filter_by_prefix: 'signed' } });
  assert.deepEqual([g.status, g.json], [200, { channels: { signed: {} } }]);
});

test('401 for each missing auth parameter', async () => {
  for (const p of ['auth_key', 'auth_timestamp', 'auth_version', 'auth_signature', 'body_md5']) {
    const r = await signedFetch(h, 'POST', EVENTS, { body: event('c'), tamper: (q) => delete q[p] });
    assert.equal(r.status, 401, `without ${p}: ${r.text}`);
    assert.equal(typeof r.json?.error, 'string');
  }
});

test('401 for an unsigned request with no query at all', async () => {
  const res = await http(`${h.base}${EVENTS}`, { method: 'POST', body: JSON.stringify(event('c')) });
  assert.equal(res.status, 401);
});

test('401 for a wrong signature, wrong secret, or a parameter changed after signing', async () => {
  const wrongSig = await signedFetch(h, 'POST', EVENTS, { body: event('c'), tamper: (q) => (q.auth_signature = 'ab'.repeat(32)) });
  assert.equal(wrongSig.status, 401);
  const wrongSecret = await signedFetch(h, 'POST', EVENTS, { body: event('c'), secret: 'guess' });
  assert.equal(wrongSecret.status, 401);
  const changed = await signedFetch(h, 'GET', `/apps/${DEV_APP.id}/channels`, {
    params: { filter_by_prefix: 'a' },
    tamper: (q) => (q.filter_by_prefix = 'b'),
  });
  assert.equal(changed.status, 401);
  // Signed for another path.
  const otherPath = await signedFetch(h, 'GET', `/apps/${DEV_APP.id}/channels/x`, {
    signedPath: `/apps/${DEV_APP.id}/channels/y`,
  });
  assert.equal(otherPath.status, 401);
  const control = await signedFetch(h, 'GET', `/apps/${DEV_APP.id}/channels`, { tamper: () => {} });
  assert.equal(control.status, 200, 'control: the same request untampered passes');
});

test('401 for a key that is not the app\'s', async () => {
  const r = await signedFetch(h, 'POST', EVENTS, { body: event('c'), app: { ...DEV_APP, key: 'other-key' } });
  assert.equal(r.status, 401);
  // Another app's valid credentials do not work on this app id.
  const cross = await signedFetch(h, 'POST', EVENTS, { body: event('c'), app: { ...SMALL, id: DEV_APP.id } });
  assert.equal(cross.status, 401);
});

test('401 for a stale or future auth_timestamp (more than 600 s off)', async () => {
  const now = Math.floor(Date.now() / 1000);
  assert.equal((await signedFetch(h, 'POST', EVENTS, { body: event('c'), timestamp: now - 700 })).status, 401);
  assert.equal((await signedFetch(h, 'POST', EVENTS, { body: event('c'), timestamp: now + 700 })).status, 401);
  assert.equal((await signedFetch(h, 'POST', EVENTS, { body: event('c'), timestamp: now - 500 })).status, 200);
});

test('401 when body_md5 does not match the body (signature otherwise valid)', async () => {
  const r = await signedFetch(h, 'POST', EVENTS, { body: event('c'), bodyMd5: '0'.repeat(32) });
  assert.equal(r.status, 401);
  assert.match(r.json.error, /body_md5/);
});

test('401 for auth_version other than 1.0', async () => {
  const r = await signedFetch(h, 'POST', EVENTS, { body: event('c'), params: { auth_version: '2.0' } });
  assert.equal(r.status, 401);
});

test('404 for an unknown app id, and for unknown paths', async () => {
  const r = await signedFetch(h, 'POST', '/apps/nope/events', { body: event('c') });
  assert.equal(r.status, 404);
  const p = await signedFetch(h, 'GET', `/apps/${DEV_APP.id}/nonsense`);
  assert.equal(p.status, 404);
});

test('403 for a disabled app', async () => {
  const r = await signedFetch(h, 'POST', `/apps/${DISABLED.id}/events`, { body: event('c'), app: DISABLED });
  assert.equal(r.status, 403);
});

test('413 for data over the app\'s max_payload, and for a body over max_request_size', async () => {
  const path = `/apps/${SMALL.id}/events`;
  const r = await signedFetch(h, 'POST', path, { body: event('c', 'x'.repeat(101)), app: SMALL });
  assert.equal(r.status, 413);
  assert.equal((await signedFetch(h, 'POST', path, { body: event('c', 'x'.repeat(100)), app: SMALL })).status, 200);
  const huge = await signedFetch(h, 'POST', EVENTS, { body: event('c', 'x'.repeat(70 * 1024)) });
  assert.equal(huge.status, 413);
});

test('400 for invalid JSON and for JSON of the wrong shape, and nothing is published', async () => {
  const c = h.client();
  const ch = c.subscribe('shape');
  await once(ch, 'pusher:subscription_succeeded');
  const got = collect(ch, 'ev');
  const cases = [
    '{"name":"ev","channel":"shape","data":',
    'not json',
    JSON.stringify({ name: 'ev', channel: 'shape' }),
    JSON.stringify({ name: 'ev', channel: 'shape', data: { not: 'a string' } }),
    JSON.stringify({ name: 'ev', data: '{}' }),
    JSON.stringify({ name: 'ev', channel: 'shape', channels: ['shape'], data: '{}' }),
    JSON.stringify({ name: '', channel: 'shape', data: '{}' }),
    JSON.stringify({ name: 'ev', channel: 'shape', data: '{}', socket_id: 'nope' }),
    JSON.stringify({ name: 'ev', channel: 'shape', data: '{}', info: 'bogus' }),
    JSON.stringify([1, 2]),
  ];
  for (const body of cases) {
    const r = await signedFetch(h, 'POST', EVENTS, { body });
    assert.equal(r.status, 400, `${body}: ${r.status} ${r.text}`);
    assert.equal(typeof r.json?.error, 'string');
  }
  const batch = await signedFetch(h, 'POST', `/apps/${DEV_APP.id}/batch_events`, { body: '{"batch":' });
  assert.equal(batch.status, 400);
  const marker = once(ch, 'marker');
  await h.server().trigger('shape', 'marker', '');
  await marker;
  assert.deepEqual(got, []);
});

test('API errors are counted in /metrics', async () => {
  const before = await metric(h, 'herald_api_errors_total');
  await signedFetch(h, 'POST', EVENTS, { body: event('c'), secret: 'nope' });
  assert.equal(await metric(h, 'herald_api_errors_total'), before + 1);
});
