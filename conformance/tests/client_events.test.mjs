// Client events (client-*) between pusher-js clients: only on private and
// presence channels, never echoed to the sender, carrying user_id on
// presence channels, refused when the app disables them, rate limited.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startHerald, once, waitFor } from '../lib/herald.mjs';
import { channelAuth, collect, rawClient } from '../lib/raw.mjs';

const APPS = [
  { id: 'on', key: 'on-key', secret: 'on-secret', client_event_rate: 5 },
  { id: 'off', key: 'off-key', secret: 'off-secret', client_events: false },
];
const [ON, OFF] = APPS.map(({ id, key, secret }) => ({ id, key, secret }));
let h;
before(async () => { h = await startHerald({ apps: APPS }); });
after(async () => { await h.stop(); });

const client = (app = ON, user = 'u') =>
  h.client({ channelAuthorization: channelAuth(h.server(app), () => ({ user_id: user })) }, app);

async function pair(channel, app = ON) {
  const a = client(app, 'alice');
  const b = client(app, 'bob');
  const ca = a.subscribe(channel);
  const cb = b.subscribe(channel);
  await Promise.all([once(ca, 'pusher:subscription_succeeded'), once(cb, 'pusher:subscription_succeeded')]);
  return { a, b, ca, cb };
}

test('a client event on a private channel reaches the others, not the sender', async () => {
  const { ca, cb } = await pair('private-chat');
  const echoed = collect(ca, 'client-typing');
  const got = once(cb, 'client-typing');
  assert.equal(ca.trigger('client-typing', { who: 'alice' }), true);
  assert.deepEqual(await got, { who: 'alice' });
  const marker = once(ca, 'marker');
  await h.server(ON).trigger('private-chat', 'marker', {});
  await marker;
  assert.deepEqual(echoed, [], 'the sender does not get its own event back');
});

test('a client event on a presence channel carries the sender\'s user_id', async () => {
  const { ca, cb } = await pair('presence-chat');
  const got = waitFor('client-hi with its metadata', (resolve) => cb.bind('client-hi', (data, meta) => resolve({ data, meta })));
  ca.trigger('client-hi', 'hello');
  const { data, meta } = await got;
  assert.equal(data, 'hello');
  assert.equal(meta.user_id, 'alice');
});

test('client events on public channels are refused', async () => {
  const raw = rawClient(h, { key: ON.key });
  await raw.established();
  await raw.subscribe('public-chat');
  const listener = client();
  const ch = listener.subscribe('public-chat');
  await once(ch, 'pusher:subscription_succeeded');
  const leaked = collect(ch, 'client-x');
  raw.send({ event: 'client-x', channel: 'public-chat', data: {} });
  const err = await raw.next('pusher:error');
  assert.equal(err.data.code, null);
  const marker = once(ch, 'marker');
  await h.server(ON).trigger('public-chat', 'marker', {});
  await marker;
  assert.deepEqual(leaked, []);
  raw.ws.close();
});

test('client events to a channel the sender is not subscribed to are refused', async () => {
  const { cb } = await pair('private-closed');
  const leaked = collect(cb, 'client-x');
  const raw = rawClient(h, { key: ON.key });
  await raw.established();
  raw.send({ event: 'client-x', channel: 'private-closed', data: {} });
  const err = await raw.next('pusher:error');
  assert.match(err.data.message, /subscri/);
  const marker = once(cb, 'marker');
  await h.server(ON).trigger('private-closed', 'marker', {});
  await marker;
  assert.deepEqual(leaked, []);
  raw.ws.close();
});

test('an app with client_events=false refuses them', async () => {
  const { a, cb, ca } = await pair('private-quiet', OFF);
  const leaked = collect(cb, 'client-x');
  const err = waitFor('a PusherError for the refused client event', (resolve) =>
    a.connection.bind('error', (e) => e.type === 'PusherError' && resolve(e.data)),
  );
  ca.trigger('client-x', { a: 1 });
  assert.match((await err).message, /disabled/);
  const marker = once(cb, 'marker');
  await h.server(OFF).trigger('private-quiet', 'marker', {});
  await marker;
  assert.deepEqual(leaked, []);
});

test('over client_event_rate the event is dropped with pusher:error 4301', async () => {
  const { a, ca, cb } = await pair('private-burst');
  const got = collect(cb, 'client-n');
  const limited = waitFor('pusher:error 4301', (resolve) =>
    a.connection.bind('error', (e) => e.type === 'PusherError' && e.data.code === 4301 && resolve(e.data)),
  );
  // 12 at once against a limit of 5/s: even split across two rate
  // windows, one of them is over the limit.
  for (let i = 0; i < 12; i++) ca.trigger('client-n', i);
  await limited;
  const marker = once(cb, 'marker');
  await h.server(ON).trigger('private-burst', 'marker', {});
  await marker;
  assert.ok(got.length >= 5 && got.length <= 10, `5 to 10 delivered, got ${got.length}`);
  assert.deepEqual(got, [...got.keys()], 'the first ones are delivered, in order');
  assert.equal(a.connection.state, 'connected', '4301 does not close the connection');
});
