// Private channels: pusher-js authorizes through a custom handler that signs
// with the `pusher` SDK's authorizeChannel; a wrong signature is refused.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startHerald, DEV_APP, once } from '../lib/herald.mjs';
import { channelAuth } from '../lib/raw.mjs';

let h;
// The development app's credentials with subscription counting on: these
// tests read `info=subscription_count`, which Pusher answers only then.
before(async () => { h = await startHerald({ apps: [{ ...DEV_APP, subscription_count: true }] }); });
after(async () => { await h.stop(); });

test('a correctly signed private subscription receives events', async () => {
  const client = h.client({ channelAuthorization: channelAuth(h.server()) });
  const ch = client.subscribe('private-orders');
  await once(ch, 'pusher:subscription_succeeded');
  const got = once(ch, 'created');
  await h.server().trigger('private-orders', 'created', { id: 7 });
  assert.deepEqual(await got, { id: 7 });
});

test('a signature made with the wrong secret is refused with AuthError 401', async () => {
  const forger = h.server({ id: 'app-id', key: 'app-key', secret: 'not-the-secret' });
  const client = h.client({ channelAuthorization: channelAuth(forger) });
  const ch = client.subscribe('private-vault');
  const err = await once(ch, 'pusher:subscription_error');
  assert.equal(err.type, 'AuthError');
  assert.equal(err.status, 401);
  const info = await h.server().get({ path: '/channels/private-vault', params: { info: 'subscription_count' } });
  assert.deepEqual(await info.json(), { occupied: false, subscription_count: 0 });
});

test('a signature for another socket is refused', async () => {
  const server = h.server();
  const stolen = { customHandler: (_p, cb) => cb(null, server.authorizeChannel('1.1', 'private-x')) };
  const client = h.client({ channelAuthorization: stolen });
  const err = await once(client.subscribe('private-x'), 'pusher:subscription_error');
  assert.equal(err.status, 401);
});

test('a signature for another channel is refused', async () => {
  const server = h.server();
  const other = {
    customHandler: ({ socketId }, cb) => cb(null, server.authorizeChannel(socketId, 'private-other')),
  };
  const client = h.client({ channelAuthorization: other });
  const err = await once(client.subscribe('private-mine'), 'pusher:subscription_error');
  assert.equal(err.status, 401);
});
