// Presence channels with pusher-js: member lists, member_added on a user's
// first socket only, member_removed on its last socket only, counts.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startHerald, DEV_APP, once, connectionState } from '../lib/herald.mjs';
import { createHmac } from 'node:crypto';
import { channelAuth, collect, rawClient } from '../lib/raw.mjs';

let h;
// The development app's credentials with subscription counting on: these
// tests read `info=subscription_count`, which Pusher answers only then.
before(async () => { h = await startHerald({ apps: [{ ...DEV_APP, subscription_count: true }] }); });
after(async () => { await h.stop(); });

const as = (user_id, user_info) => channelAuth(h.server(), () => ({ user_id, user_info }));
const ids = (members) => {
  const out = [];
  members.each((m) => out.push(m.id));
  return out.sort();
};

test('members list, me, and count on subscription_succeeded', async () => {
  const alice = h.client({ channelAuthorization: as('alice', { name: 'Alice' }) });
  const ca = alice.subscribe('presence-room1');
  await once(ca, 'pusher:subscription_succeeded');
  const bob = h.client({ channelAuthorization: as('bob', { name: 'Bob' }) });
  const cb = bob.subscribe('presence-room1');
  const members = await once(cb, 'pusher:subscription_succeeded');
  assert.equal(members.count, 2);
  assert.deepEqual(ids(members), ['alice', 'bob']);
  assert.equal(members.me.id, 'bob');
  assert.deepEqual(members.get('alice').info, { name: 'Alice' });
});

test('member_added only for a user\'s first socket, member_removed only for its last', async () => {
  const watcher = h.client({ channelAuthorization: as('watcher') });
  const cw = watcher.subscribe('presence-room2');
  await once(cw, 'pusher:subscription_succeeded');
  const added = collect(cw, 'pusher:member_added');
  const removed = collect(cw, 'pusher:member_removed');

  const carol1 = h.client({ channelAuthorization: as('carol', { n: 1 }) });
  const first = once(cw, 'pusher:member_added');
  await once(carol1.subscribe('presence-room2'), 'pusher:subscription_succeeded');
  assert.equal((await first).id, 'carol');
  assert.deepEqual((await first).info, { n: 1 });

  // A second socket of the same user: no member_added; the marker event
  // triggered afterwards arrives first, proving none was sent.
  const carol2 = h.client({ channelAuthorization: as('carol', { n: 1 }) });
  const c2 = carol2.subscribe('presence-room2');
  const m2 = await once(c2, 'pusher:subscription_succeeded');
  assert.equal(m2.count, 2, 'carol is one member however many sockets');
  const marker = once(cw, 'marker');
  await h.server().trigger('presence-room2', 'marker', 1);
  await marker;
  assert.equal(added.length, 1);

  // The first socket leaving does not remove carol.
  carol1.disconnect();
  await connectionState(carol1, 'disconnected');
  const marker2 = once(cw, 'marker2');
  // Wait until the server has seen the close: the API lists 2 users still,
  // and the subscription count dropped to 2 (watcher + carol2).
  for (let i = 0; ; i++) {
    const r = await h.server().get({ path: '/channels/presence-room2', params: { info: 'subscription_count' } });
    if ((await r.json()).subscription_count === 2) break;
    if (i > 500) throw new Error('carol1 never left');
    await new Promise((r) => setTimeout(r, 10));
  }
  await h.server().trigger('presence-room2', 'marker2', 1);
  await marker2;
  assert.equal(removed.length, 0);
  assert.equal(cw.members.count, 2, 'watcher and carol');

  // The last socket leaving removes her.
  const gone = once(cw, 'pusher:member_removed');
  carol2.disconnect();
  assert.equal((await gone).id, 'carol');
  assert.equal(cw.members.count, 1);
  assert.equal(removed.length, 1);
});

test('unsubscribing (not disconnecting) also removes the member', async () => {
  const a = h.client({ channelAuthorization: as('dave') });
  const ca = a.subscribe('presence-room3');
  await once(ca, 'pusher:subscription_succeeded');
  const b = h.client({ channelAuthorization: as('erin') });
  const added = once(ca, 'pusher:member_added');
  await once(b.subscribe('presence-room3'), 'pusher:subscription_succeeded');
  await added;
  const removed = once(ca, 'pusher:member_removed');
  b.unsubscribe('presence-room3');
  assert.equal((await removed).id, 'erin');
  assert.deepEqual(ids(ca.members), ['dave']);
});

test('numeric user ids (as Laravel signs them) come back as strings', async () => {
  const a = h.client({ channelAuthorization: as(42, { role: 'admin' }) });
  const members = await once(a.subscribe('presence-room4'), 'pusher:subscription_succeeded');
  assert.deepEqual(ids(members), ['42']);
  const res = await h.server().get({ path: '/channels/presence-room4/users' });
  assert.deepEqual(await res.json(), { users: [{ id: '42' }] });
});

test('presence subscription without channel_data, or with a malformed one, is refused', async () => {
  // pusher-js will not send a presence subscription without channel_data
  // unless signed in, so speak the protocol directly.
  const raw = rawClient(h);
  const socketId = await raw.established();
  const server = h.server();
  const bare = server.authorizeChannel(socketId, 'presence-room5');
  const e1 = await raw.subscribe('presence-room5', { auth: bare.auth });
  assert.equal(e1.event, 'pusher:subscription_error');
  assert.deepEqual([e1.data.type, e1.data.status], ['InvalidChannelData', 400]);
  // Correctly signed, but channel_data has no user_id.
  const channel_data = JSON.stringify({ user_info: {} });
  const { auth } = signExact(server, socketId, 'presence-room5', channel_data);
  const e2 = await raw.subscribe('presence-room5', { auth, channel_data });
  assert.deepEqual([e2.event, e2.data.status], ['pusher:subscription_error', 400]);
  // channel_data altered after signing.
  const signed = server.authorizeChannel(socketId, 'presence-room5', { user_id: 'x' });
  const e3 = await raw.subscribe('presence-room5', { auth: signed.auth, channel_data: '{"user_id":"admin"}' });
  assert.deepEqual([e3.event, e3.data.status], ['pusher:subscription_error', 401]);
  raw.ws.close();
});

// Sign an exact channel_data string the SDK would not produce itself.
function signExact(server, socketId, channel, channelData) {
  const sig = createHmac('sha256', server.config.token.secret).update(`${socketId}:${channel}:${channelData}`).digest('hex');
  return { auth: `${server.config.token.key}:${sig}` };
}

test('presence channel full: the next distinct user gets LimitReached', async () => {
  const small = await startHerald({
    apps: [{ id: 'p', key: 'p-key', secret: 'p-secret', max_presence_members: 2 }],
  });
  try {
    const app = { id: 'p', key: 'p-key', secret: 'p-secret' };
    const auth = (u) => channelAuth(small.server(app), () => ({ user_id: u }));
    for (const u of ['u1', 'u2']) {
      await once(small.client({ channelAuthorization: auth(u) }, app).subscribe('presence-full'), 'pusher:subscription_succeeded');
    }
    // Another socket of an existing member still fits.
    await once(small.client({ channelAuthorization: auth('u1') }, app).subscribe('presence-full'), 'pusher:subscription_succeeded');
    const err = await once(small.client({ channelAuthorization: auth('u3') }, app).subscribe('presence-full'), 'pusher:subscription_error');
    assert.equal(err.status, 403);
  } finally {
    await small.stop();
  }
});
