// Every HTTP API call through the official `pusher` Node SDK, observed by
// pusher-js clients.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startHerald, DEV_APP, once, connectionState, waitFor, within } from '../lib/herald.mjs';
import { channelAuth, collect, userAuth } from '../lib/raw.mjs';

let h;
// The development app's credentials with subscription counting on: these
// tests read `info=subscription_count`, which Pusher answers only then.
before(async () => { h = await startHerald({ apps: [{ ...DEV_APP, subscription_count: true }] }); });
after(async () => { await h.stop(); });

const sdk = () => h.server();
const rejection = (p) => p.then(() => assert.fail('expected the request to fail'), (e) => e);
const member = (user_id) => h.client({ channelAuthorization: channelAuth(sdk(), () => ({ user_id })) });

async function subscribed(client, name) {
  const ch = client.subscribe(name);
  await once(ch, 'pusher:subscription_succeeded');
  return ch;
}

test('trigger to one channel answers 200 {}', async () => {
  const ch = await subscribed(h.client(), 'api-one');
  const got = once(ch, 'ev');
  const res = await sdk().trigger('api-one', 'ev', { a: 1 });
  assert.equal(res.status, 200);
  assert.deepEqual(await res.json(), {});
  assert.deepEqual(await got, { a: 1 });
});

test('trigger to several channels reaches each', async () => {
  const c = h.client();
  const chans = await Promise.all(['multi-a', 'multi-b', 'multi-c'].map((n) => subscribed(c, n)));
  const got = chans.map((ch) => once(ch, 'ev'));
  await sdk().trigger(['multi-a', 'multi-b', 'multi-c'], 'ev', 'all');
  assert.deepEqual(await Promise.all(got), ['all', 'all', 'all']);
});

test('trigger with socket_id excludes that socket only', async () => {
  const a = h.client();
  const b = h.client();
  const ca = await subscribed(a, 'api-excl');
  const cb = await subscribed(b, 'api-excl');
  const aGot = collect(ca, 'ev');
  const bGot = once(cb, 'ev');
  await sdk().trigger(['api-excl'], 'ev', 'x', { socket_id: a.connection.socket_id });
  assert.equal(await bGot, 'x');
  const marker = once(ca, 'marker');
  await sdk().trigger('api-excl', 'marker', '');
  await marker;
  assert.deepEqual(aGot, []);
});

test('trigger with info=subscription_count,user_count reports per channel', async () => {
  await subscribed(member('i1'), 'presence-info');
  await subscribed(member('i1'), 'presence-info');
  await subscribed(member('i2'), 'presence-info');
  await subscribed(h.client(), 'info-public');
  const res = await sdk().trigger(['presence-info', 'info-public', 'info-empty'], 'ev', {}, {
    info: 'subscription_count,user_count',
  });
  assert.deepEqual(await res.json(), {
    channels: {
      'presence-info': { subscription_count: 3, user_count: 2 },
      'info-public': { subscription_count: 1 },
      'info-empty': { subscription_count: 0 },
    },
  });
});

test('triggerBatch delivers every event in order and answers info per item', async () => {
  // One socket: its frames arrive in publish order across channels.
  const c = h.client();
  const ch = await subscribed(c, 'batch-a');
  const chB = await subscribed(c, 'batch-b');
  const got = [];
  ch.bind_global((name, data) => !name.startsWith('pusher') && got.push([name, data]));
  const done = once(chB, 'last');
  const res = await sdk().triggerBatch([
    { channel: 'batch-a', name: 'one', data: '1' },
    { channel: 'batch-a', name: 'two', data: { n: 2 } },
    { channel: 'batch-b', name: 'last', data: 'x', info: 'subscription_count' },
  ]);
  assert.equal(res.status, 200);
  assert.deepEqual(await res.json(), { batch: [{}, {}, { subscription_count: 1 }] });
  await done;
  assert.deepEqual(got, [['one', 1], ['two', { n: 2 }]]);
});

test('triggerBatch with more than 10 events is refused with 400 and publishes none', async () => {
  const ch = await subscribed(h.client(), 'batch-big');
  const got = collect(ch, 'ev');
  const batch = Array.from({ length: 11 }, (_, i) => ({ channel: 'batch-big', name: 'ev', data: String(i) }));
  const err = await rejection(sdk().triggerBatch(batch));
  assert.equal(err.status, 400);
  const marker = once(ch, 'marker');
  await sdk().trigger('batch-big', 'marker', '');
  await marker;
  assert.deepEqual(got, []);
});

test('a batch with one invalid item publishes none of it', async () => {
  const ch = await subscribed(h.client(), 'batch-atomic');
  const got = collect(ch, 'ev');
  const err = await rejection(
    sdk().triggerBatch([
      { channel: 'batch-atomic', name: 'ev', data: 'ok' },
      { channel: 'bad channel!', name: 'ev', data: 'x' },
    ]),
  );
  assert.equal(err.status, 400);
  const marker = once(ch, 'marker');
  await sdk().trigger('batch-atomic', 'marker', '');
  await marker;
  assert.deepEqual(got, []);
});

test('GET /channels lists occupied channels, with filter_by_prefix and info=user_count', async () => {
  await subscribed(h.client(), 'list-x');
  await subscribed(member('l1'), 'presence-list');
  await subscribed(member('l2'), 'presence-list');
  await subscribed(member('l2'), 'presence-list');
  const all = await (await sdk().get({ path: '/channels' })).json();
  assert.ok('list-x' in all.channels && 'presence-list' in all.channels);
  const filtered = await (await sdk().get({ path: '/channels', params: { filter_by_prefix: 'list-' } })).json();
  assert.deepEqual(filtered, { channels: { 'list-x': {} } });
  const presence = await (
    await sdk().get({ path: '/channels', params: { filter_by_prefix: 'presence-list', info: 'user_count' } })
  ).json();
  assert.deepEqual(presence, { channels: { 'presence-list': { user_count: 2 } } });
  const err = await rejection(sdk().get({ path: '/channels', params: { info: 'user_count' } }));
  assert.equal(err.status, 400, 'user_count needs a presence- prefix');
  // subscription_count (on for this app) needs no prefix.
  const counted = await (
    await sdk().get({ path: '/channels', params: { filter_by_prefix: 'list-', info: 'subscription_count' } })
  ).json();
  assert.deepEqual(counted, { channels: { 'list-x': { subscription_count: 1 } } });
  const both = await (
    await sdk().get({ path: '/channels', params: { filter_by_prefix: 'presence-list', info: 'user_count,subscription_count' } })
  ).json();
  assert.deepEqual(both, { channels: { 'presence-list': { user_count: 2, subscription_count: 3 } } });
});

test('GET /channels/{name}: occupied, user_count, subscription_count', async () => {
  const c = member('c1');
  await subscribed(c, 'presence-one');
  await subscribed(member('c1'), 'presence-one');
  const res = await sdk().get({
    path: '/channels/presence-one',
    params: { info: 'user_count,subscription_count' },
  });
  assert.deepEqual(await res.json(), { occupied: true, user_count: 1, subscription_count: 2 });
  const empty = await (await sdk().get({ path: '/channels/nobody-here', params: { info: 'subscription_count' } })).json();
  assert.deepEqual(empty, { occupied: false, subscription_count: 0 });
  const err = await rejection(sdk().get({ path: '/channels/public-one', params: { info: 'user_count' } }));
  assert.equal(err.status, 400);
});

test('GET /channels/{name}/users lists each user once', async () => {
  await subscribed(member('ua'), 'presence-users');
  await subscribed(member('ub'), 'presence-users');
  await subscribed(member('ub'), 'presence-users');
  const { users } = await (await sdk().get({ path: '/channels/presence-users/users' })).json();
  assert.deepEqual(users.map((u) => u.id).sort(), ['ua', 'ub']);
  const err = await rejection(sdk().get({ path: '/channels/not-presence/users' }));
  assert.equal(err.status, 400);
});

test('terminateUserConnections closes every socket of that user, only', async () => {
  const signedIn = async (id) => {
    const c = h.client({ userAuthentication: userAuth(sdk(), { id }) });
    c.signin();
    await connectionState(c, 'connected');
    await within(c.user.signinDonePromise, 'pusher-js sign-in');
    return c;
  };
  const t1 = await signedIn('doomed');
  const t2 = await signedIn('doomed');
  const keep = await signedIn('spared');
  const errors = [t1, t2].map(
    (c) => waitFor('pusher-js to report the 4009 error', (resolve) => c.connection.bind('error', (e) => e.data?.code && resolve(e.data.code))),
  );
  const res = await sdk().terminateUserConnections('doomed');
  assert.equal(res.status, 200);
  assert.deepEqual(await Promise.all(errors), [4009, 4009]);
  await Promise.all([connectionState(t1, 'disconnected'), connectionState(t2, 'disconnected')]);
  const still = once(keep.user, 'ping');
  await sdk().sendToUser('spared', 'ping', 'still here');
  assert.equal(await still, 'still here');
  assert.equal(keep.connection.state, 'connected');
});

test('sendToUser reaches a signed-in pusher-js user', async () => {
  const c = h.client({ userAuthentication: userAuth(sdk(), { id: 'to-me' }) });
  c.signin();
  await connectionState(c, 'connected');
  await within(c.user.signinDonePromise, 'pusher-js sign-in');
  const got = once(c.user, 'hello');
  const res = await sdk().sendToUser('to-me', 'hello', { a: 'b' });
  assert.equal(res.status, 200);
  assert.deepEqual(await got, { a: 'b' });
});

test('the SDK sees 404 for an unknown app id', async () => {
  const err = await rejection(h.server({ id: 'no-such-app', key: 'app-key', secret: 'app-secret' }).trigger('c', 'e', {}));
  assert.equal(err.status, 404);
});

test('data over max_payload is refused with 413 and not delivered', async () => {
  const ch = await subscribed(h.client(), 'big');
  const got = collect(ch, 'ev');
  const err = await rejection(sdk().trigger('big', 'ev', 'x'.repeat(10 * 1024 + 1)));
  assert.equal(err.status, 413);
  // Exactly at the limit is fine.
  const ok = once(ch, 'ev');
  await sdk().trigger('big', 'ev', 'y'.repeat(10 * 1024));
  assert.equal((await ok).length, 10 * 1024);
  assert.equal(got.length, 1);
});

test('reserved pusher: event names and bad channel names are refused with 400', async () => {
  assert.equal((await rejection(sdk().trigger('c', 'pusher:subscribe', {}))).status, 400);
  assert.equal((await rejection(sdk().post({ path: '/events', body: { name: 'e', data: '{}', channels: ['a b'] } }))).status, 400);
  const many = Array.from({ length: 101 }, (_, i) => `c${i}`);
  assert.equal((await rejection(sdk().post({ path: '/events', body: { name: 'e', data: '{}', channels: many } }))).status, 400);
});

test('channel names with every allowed punctuation work in paths and bodies', async () => {
  const name = 'presence-a@b,c;d=e.f_g-h';
  const c = member('p@1');
  const ch = await subscribed(c, name);
  const got = once(ch, 'ev');
  const res = await sdk().trigger(name, 'ev', 'x', { info: 'user_count' });
  assert.deepEqual(await res.json(), { channels: { [name]: { user_count: 1 } } });
  assert.equal(await got, 'x');
  const info = await (await sdk().get({ path: `/channels/${name}`, params: { info: 'user_count' } })).json();
  assert.deepEqual(info, { occupied: true, user_count: 1 });
  const encoded = await (await sdk().get({ path: `/channels/${encodeURIComponent(name)}/users` })).json();
  assert.deepEqual(encoded, { users: [{ id: 'p@1' }] });
});

test('terminating a presence member\'s connections tells the others it left', async () => {
  const watcher = await subscribed(member('stays'), 'presence-term');
  const leaver = h.client({
    channelAuthorization: channelAuth(sdk(), () => ({ user_id: 'leaves' })),
    userAuthentication: userAuth(sdk(), { id: 'leaves' }),
  });
  leaver.signin();
  await connectionState(leaver, 'connected');
  await within(leaver.user.signinDonePromise, 'pusher-js sign-in');
  const added = once(watcher, 'pusher:member_added');
  await subscribed(leaver, 'presence-term');
  await added;
  const removed = once(watcher, 'pusher:member_removed');
  await sdk().terminateUserConnections('leaves');
  assert.equal((await removed).id, 'leaves');
});
