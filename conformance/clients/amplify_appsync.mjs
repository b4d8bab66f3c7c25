// The real aws-amplify client (6.x) against a running herald over TLS, as an
// AppSync app uses it: the Events API (events.connect / channel.subscribe /
// channel.publish / events.post) and the generic pub/sub GraphQL API
// (generateClient().graphql subscriptions and the publish mutation).
//
// Run by tests/appsync_amplify.test.mjs in its own process, because Node
// reads NODE_EXTRA_CA_CERTS (Herald's test certificate) only at start.
// Node 20 has no global WebSocket; Amplify gets `ws`'s, which is what a
// Node app gives it too. Exits 0 when every step passed.
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { Amplify } from 'aws-amplify';
import { events } from 'aws-amplify/data';
import { generateClient } from 'aws-amplify/api';

globalThis.WebSocket ??= WebSocket;

const port = process.env.HERALD_PORT;
const apiKey = process.env.HERALD_API_KEY ?? 'app-key';
const which = process.argv[2];
const TIMEOUT = 10000;

Amplify.configure({
  API: {
    Events: {
      endpoint: `https://127.0.0.1:${port}/event`,
      region: 'us-east-1',
      defaultAuthMode: 'apiKey',
      apiKey,
    },
    GraphQL: {
      endpoint: `https://127.0.0.1:${port}/graphql`,
      region: 'us-east-1',
      defaultAuthMode: 'apiKey',
      apiKey,
    },
  },
});

/** A queue of what an observer receives; `next()` waits with a timeout. */
function inbox() {
  const items = [];
  const waiters = [];
  const push = (x) => {
    const w = waiters.shift();
    if (w) w(x);
    else items.push(x);
  };
  const next = () =>
    items.length
      ? Promise.resolve(items.shift())
      : new Promise((resolve, reject) => {
          const t = setTimeout(() => reject(new Error('timed out waiting for a message')), TIMEOUT);
          waiters.push((x) => {
            clearTimeout(t);
            resolve(x);
          });
        });
  return { push, next, items };
}

const withTimeout = (p, what) =>
  Promise.race([p, new Promise((_, reject) => setTimeout(() => reject(new Error(`timed out: ${what}`)), TIMEOUT))]);

async function eventsApi() {
  const channel = await withTimeout(events.connect('default/amplify'), 'events.connect');
  const got = inbox();
  const errors = inbox();
  const sub = channel.subscribe({ next: (d) => got.push(d), error: (e) => errors.push(e) });
  await withTimeout(sub.ready, 'subscribe_success');

  // channel.publish resolves on publish_success.
  await withTimeout(channel.publish({ over: 'websocket', n: 1 }), 'channel.publish');
  const a = await got.next();
  assert.deepEqual(a.event, { over: 'websocket', n: 1 });

  // events.post publishes over HTTPS (it adds the leading slash); it
  // returns the failed events, none here.
  const res = await withTimeout(events.post('default/amplify', { over: 'http' }), 'events.post');
  assert.equal(res, undefined, `no failed events: ${JSON.stringify(res)}`);
  const b = await got.next();
  assert.deepEqual(b.event, { over: 'http' });

  // A wildcard subscription on a second channel object.
  const wild = await withTimeout(events.connect('default/*'), 'events.connect wildcard');
  const wgot = inbox();
  const wsub = wild.subscribe({ next: (d) => wgot.push(d), error: (e) => errors.push(e) });
  await withTimeout(wsub.ready, 'wildcard subscribe_success');
  await withTimeout(events.post('default/deeper/still', [{ k: 1 }, { k: 2 }]), 'events.post batch');
  assert.deepEqual((await wgot.next()).event, { k: 1 });
  assert.deepEqual((await wgot.next()).event, { k: 2 });

  // A publish Herald refuses rejects the promise (publish_error).
  const bad = await withTimeout(events.connect('default/*'), 'events.connect for a bad publish');
  await assert.rejects(withTimeout(bad.publish({ x: 1 }), 'channel.publish to a wildcard'), /Publish errors: BadRequestException/);

  // A subscription Herald refuses errors the observer (subscribe_error).
  const invalid = await withTimeout(events.connect('default/not_valid'), 'events.connect invalid');
  const ierr = inbox();
  const isub = invalid.subscribe({ next: () => {}, error: (e) => ierr.push(e) });
  const e = await ierr.next();
  assert.match(JSON.stringify(e), /BadRequestException/);
  await assert.rejects(isub.ready);

  assert.equal(errors.items.length, 0, `no errors on the good subscriptions: ${JSON.stringify(errors.items)}`);
  sub.unsubscribe();
  wsub.unsubscribe();
  channel.close();
  wild.close();
  bad.close();
  invalid.close();
}

async function graphqlApi() {
  const client = generateClient();
  const got = inbox();
  const errors = inbox();
  const subscription = /* GraphQL */ `
    subscription Subscribe($name: String!) {
      subscribe(name: $name) { name data }
    }`;
  const publish = /* GraphQL */ `
    mutation Publish($name: String!, $data: AWSJSON!) {
      publish(name: $name, data: $data) { name data }
    }`;
  const sub = client
    .graphql({ query: subscription, variables: { name: 'amplify-room' } })
    .subscribe({ next: (m) => got.push(m), error: (e) => errors.push(e) });

  // generateClient does not expose the start_ack: publish until the
  // subscription is live, then once more with a known payload.
  let first = false;
  for (let i = 0; i < 50 && !first; i++) {
    const r = await client.graphql({ query: publish, variables: { name: 'amplify-room', data: JSON.stringify({ probe: i }) } });
    assert.equal(r.data.publish.name, 'amplify-room');
    for (let w = 0; w < 20 && !got.items.length; w++) await new Promise((r2) => setTimeout(r2, 10));
    first = got.items.length > 0;
  }
  assert.ok(first, 'a publish reached the subscription');
  while (got.items.length) got.items.shift();
  const r = await client.graphql({ query: publish, variables: { name: 'amplify-room', data: JSON.stringify({ hello: 'graphql' }) } });
  assert.deepEqual(JSON.parse(r.data.publish.data), { hello: 'graphql' });
  let m = await got.next();
  while (!String(m.data.subscribe.data).includes('hello')) m = await got.next();
  assert.equal(m.data.subscribe.name, 'amplify-room');
  assert.deepEqual(JSON.parse(m.data.subscribe.data), { hello: 'graphql' });

  // An operation outside the schema: the mutation fails with GraphQL errors.
  await assert.rejects(
    client.graphql({ query: 'mutation { delete(name: "x") { name } }' }),
    (e) => Array.isArray(e.errors) && /FieldUndefined/.test(e.errors[0].message),
  );
  assert.equal(errors.items.length, 0, `no subscription errors: ${JSON.stringify(errors.items)}`);
  sub.unsubscribe();
}

/** A wrong API key: connect fails fast (a non-retryable UnauthorizedException). */
async function badKey() {
  const started = Date.now();
  await assert.rejects(withTimeout(events.connect('default/x'), 'events.connect with a bad key'), /UnauthorizedException/);
  assert.ok(Date.now() - started < 5000, 'refused without retrying');
}

try {
  if (which === 'events') await eventsApi();
  else if (which === 'bad-key') await badKey();
  else if (which === 'graphql') await graphqlApi();
  else throw new Error(`unknown client ${which}`);
  console.log('OK');
  process.exit(0);
} catch (e) {
  console.error('FAILED:', e?.stack ?? e, JSON.stringify(e));
  process.exit(1);
}
