// Both AppSync real-time protocols spoken by hand with `ws`, as the
// published AppSync benchmark and graphql-ws-style clients do: the generic
// pub/sub GraphQL API (`graphql-ws` on /graphql with the `header` query
// parameter, POST /graphql without a Content-Type) and the Events API
// (`aws-appsync-event-ws` with a `header-` subprotocol, POST /event).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { startHerald } from '../lib/herald.mjs';

const KEY = 'da2-conformance';
let h;

before(async () => {
  h = await startHerald({
    apps: [{ id: 'as', key: 'as-key', secret: 'as-secret', api_keys: [KEY] }],
  });
});
after(() => h.stop());

const authHeaders = (key = KEY) => ({ host: `127.0.0.1:${h.port}`, 'x-api-key': key });

/** A raw socket whose JSON messages are kept in order; `next(type)` waits. */
function socket(path, protocols) {
  const ws = new WebSocket(`ws://127.0.0.1:${h.port}${path}`, protocols);
  const messages = [];
  const waiters = new Set();
  ws.on('message', (d) => {
    const m = JSON.parse(d.toString());
    if (m.type !== 'ka') messages.push(m);
    for (const w of waiters) w();
  });
  const closed = new Promise((resolve) => ws.on('close', (code) => {
    resolve(code);
    for (const w of waiters) w();
  }));
  const opened = new Promise((resolve, reject) => {
    ws.once('open', resolve);
    ws.once('error', reject);
  });
  let cursor = 0;
  const next = (type, timeoutMs = 5000) =>
    new Promise((resolve, reject) => {
      const check = () => {
        if (cursor < messages.length) {
          const m = messages[cursor++];
          waiters.delete(check);
          clearTimeout(timer);
          if (type && m.type !== type) reject(new Error(`expected ${type}, got ${JSON.stringify(m)}`));
          else resolve(m);
        } else if (ws.readyState === WebSocket.CLOSED) {
          waiters.delete(check);
          clearTimeout(timer);
          reject(new Error(`socket closed while waiting for ${type}`));
        }
      };
      const timer = setTimeout(() => {
        waiters.delete(check);
        reject(new Error(`timed out waiting for ${type}; got ${JSON.stringify(messages.slice(cursor))}`));
      }, timeoutMs);
      waiters.add(check);
      check();
    });
  const send = (m) => ws.send(typeof m === 'string' ? m : JSON.stringify(m));
  return { ws, opened, closed, next, send };
}

const b64url = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
const b64 = (o) => Buffer.from(JSON.stringify(o)).toString('base64');

async function post(path, body, key = KEY, headers = {}) {
  const r = await fetch(`${h.base}${path}`, {
    method: 'POST',
    headers: { ...(key ? { 'x-api-key': key } : {}), ...headers },
    // A byte body: fetch then sends no Content-Type at all.
    body: Buffer.from(typeof body === 'string' ? body : JSON.stringify(body)),
  });
  return { status: r.status, json: await r.json(), errorType: r.headers.get('x-amzn-errortype') };
}

test('Events API: handshake, subscribe, publish over the socket and HTTP, unsubscribe', async () => {
  const s = socket('/event/realtime', ['aws-appsync-event-ws', `header-${b64url(authHeaders())}`]);
  await s.opened;
  assert.equal(s.ws.protocol, 'aws-appsync-event-ws');
  s.send({ type: 'connection_init' });
  assert.equal((await s.next('connection_ack')).connectionTimeoutMs, 300000);
  s.send({ type: 'subscribe', id: 'sub-1', channel: '/default/*', authorization: authHeaders() });
  assert.deepEqual(await s.next('subscribe_success'), { type: 'subscribe_success', id: 'sub-1' });

  s.send({ type: 'publish', id: 'pub-1', channel: '/default/chat', events: [JSON.stringify({ a: 1 })], authorization: authHeaders() });
  const ok = await s.next('publish_success');
  assert.equal(ok.id, 'pub-1');
  assert.equal(ok.successful[0].index, 0);
  assert.deepEqual(await s.next('data'), { type: 'data', id: 'sub-1', event: '{"a":1}' });

  const r = await post('/event', { channel: '/default/deep/er', events: ['"x"', '{"b":2}'] }, KEY, { 'content-type': 'application/json; charset=UTF-8' });
  assert.equal(r.status, 200);
  assert.deepEqual(r.json.failed, []);
  assert.deepEqual(r.json.successful.map((x) => x.index), [0, 1]);
  assert.equal((await s.next('data')).event, '"x"');
  assert.equal((await s.next('data')).event, '{"b":2}');

  s.send({ type: 'unsubscribe', id: 'sub-1' });
  assert.deepEqual(await s.next('unsubscribe_success'), { type: 'unsubscribe_success', id: 'sub-1' });
  s.ws.close();
});

test('Events API errors: bad key, invalid channel, publish to a wildcard, too many events, unknown type', async () => {
  const bad = socket('/event/realtime', ['aws-appsync-event-ws', `header-${b64url(authHeaders('nope'))}`]);
  await bad.opened;
  bad.send({ type: 'connection_init' });
  const ce = await bad.next('connection_error');
  assert.equal(ce.errors[0].errorType, 'UnauthorizedException');
  await bad.closed;

  const s = socket('/event/realtime', ['aws-appsync-event-ws', `header-${b64url(authHeaders())}`]);
  await s.opened;
  s.send({ type: 'connection_init' });
  await s.next('connection_ack');
  s.send({ type: 'subscribe', id: 'x', channel: '/default/not_valid' });
  assert.equal((await s.next('subscribe_error')).errors[0].errorType, 'BadRequestException');
  s.send({ type: 'publish', id: 'p', channel: '/default/*', events: ['1'] });
  assert.equal((await s.next('publish_error')).id, 'p');
  s.send({ type: 'publish', id: 'q', channel: '/default/a', events: ['1', '2', '3', '4', '5', '6'] });
  assert.match((await s.next('publish_error')).errors[0].message, /1 to 5 events/);
  s.send({ type: 'what', id: 'w' });
  assert.equal((await s.next('error')).errors[0].errorType, 'UnsupportedOperation');
  s.send('{not json');
  assert.equal((await s.next('error')).errors[0].errorType, 'BadRequestException');

  const r = await post('/event', { channel: '/default/a', events: ['1'] }, 'nope');
  assert.equal(r.status, 401);
  assert.equal(r.errorType, 'UnauthorizedException');
  s.ws.close();
});

test('GraphQL API: header query parameter, start, publish mutation without Content-Type, stop', async () => {
  const s = socket(`/graphql?header=${encodeURIComponent(b64(authHeaders()))}&payload=e30=`, ['graphql-ws']);
  await s.opened;
  assert.equal(s.ws.protocol, 'graphql-ws');
  s.send({ type: 'connection_init' });
  assert.equal((await s.next('connection_ack')).payload.connectionTimeoutMs, 300000);
  const data = JSON.stringify({
    query: 'subscription SubscribeToData($name: String!) { subscribe(name: $name) { name data } }',
    variables: { name: 'robots' },
  });
  s.send({ type: 'start', id: 'g-1', payload: { data, extensions: { authorization: authHeaders() } } });
  assert.deepEqual(await s.next('start_ack'), { type: 'start_ack', id: 'g-1' });

  // As the published AppSync benchmark posts: no Content-Type header.
  const r = await post('/graphql', {
    query: 'mutation PublishData($name: String!, $data: AWSJSON!) { publish(name: $name, data: $data) { name data } }',
    variables: { name: 'robots', data: '{"beep":"boop"}' },
  });
  assert.equal(r.status, 200);
  assert.deepEqual(r.json, { data: { publish: { name: 'robots', data: '{"beep":"boop"}' } } });
  assert.deepEqual(await s.next('data'), {
    type: 'data',
    id: 'g-1',
    payload: { data: { subscribe: { name: 'robots', data: '{"beep":"boop"}' } } },
  });

  s.send({ type: 'stop', id: 'g-1' });
  assert.deepEqual(await s.next('complete'), { type: 'complete', id: 'g-1' });
  s.ws.close();
});

test('GraphQL API errors: unknown operation, mutation over the socket, bad key', async () => {
  const s = socket(`/graphql/realtime?header=${encodeURIComponent(b64(authHeaders()))}`, ['graphql-ws']);
  await s.opened;
  s.send({ type: 'connection_init' });
  await s.next('connection_ack');
  const start = (id, query) =>
    s.send({ type: 'start', id, payload: { data: JSON.stringify({ query }), extensions: { authorization: authHeaders() } } });
  start('e1', 'subscription { onCreateTodo { id } }');
  const e1 = await s.next('error');
  assert.equal(e1.id, 'e1');
  assert.match(e1.payload.errors[0].message, /FieldUndefined/);
  start('e2', 'mutation { publish(name: "a", data: "1") { name } }');
  assert.equal((await s.next('error')).payload.errors[0].errorType, 'UnsupportedOperation');
  s.ws.close();

  const r = await post('/graphql', { query: 'mutation { nope }' });
  assert.equal(r.status, 200);
  assert.equal(r.json.data, null);
  assert.match(r.json.errors[0].message, /FieldUndefined/);

  const bad = socket(`/graphql?header=${encodeURIComponent(b64(authHeaders('nope')))}`, ['graphql-ws']);
  await bad.opened;
  bad.send({ type: 'connection_init' });
  assert.equal((await bad.next('connection_error')).payload.errors[0].errorType, 'UnauthorizedException');
  await bad.closed;
});
