// User authentication with pusher-js: signin(), sendToUser, watchlists, and a
// forged sign-in refused with 4009.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startHerald, once, connectionState, waitFor, within } from '../lib/herald.mjs';
import { collect, rawClient, userAuth } from '../lib/raw.mjs';

let h;
before(async () => { h = await startHerald(); });
after(async () => { await h.stop(); });

const signedIn = async (userData) => {
  const c = h.client({ userAuthentication: userAuth(h.server(), userData) });
  c.signin();
  await connectionState(c, 'connected');
  await within(c.user.signinDonePromise, 'pusher-js sign-in');
  assert.equal(c.user.user_data?.id, userData.id, 'signed in');
  return c;
};

test('sendToUser reaches every socket of the signed-in user, and only it', async () => {
  const u1 = await signedIn({ id: 'user-1', user_info: { name: 'One' } });
  const u1b = await signedIn({ id: 'user-1' });
  const u2 = await signedIn({ id: 'user-2' });
  const other = collect(u2.user, 'notice');
  const got = [once(u1.user, 'notice'), once(u1b.user, 'notice')];
  const res = await h.server().sendToUser('user-1', 'notice', { text: 'for one' });
  assert.equal(res.status, 200);
  assert.deepEqual(await Promise.all(got), [{ text: 'for one' }, { text: 'for one' }]);
  const marker = once(u2.user, 'marker');
  await h.server().sendToUser('user-2', 'marker', {});
  await marker;
  assert.deepEqual(other, []);
});

test('watchlist: online/offline as watched users come and go', async () => {
  const friend = await signedIn({ id: 'friend' });
  const watcher = h.client({
    userAuthentication: userAuth(h.server(), { id: 'watcher', watchlist: ['friend', 'stranger'] }),
  });
  const initialOnline = once(watcher.user.watchlist, 'online');
  const initialOffline = once(watcher.user.watchlist, 'offline');
  watcher.signin();
  assert.deepEqual((await initialOnline).user_ids, ['friend']);
  assert.deepEqual((await initialOffline).user_ids, ['stranger']);

  const online = once(watcher.user.watchlist, 'online');
  const stranger = await signedIn({ id: 'stranger' });
  assert.deepEqual((await online).user_ids, ['stranger']);

  // A second socket of an online user changes nothing; its last socket
  // leaving makes it offline.
  const online2 = collect(watcher.user.watchlist, 'online');
  const stranger2 = await signedIn({ id: 'stranger' });
  const offline = once(watcher.user.watchlist, 'offline');
  stranger.disconnect();
  stranger2.disconnect();
  assert.deepEqual((await offline).user_ids, ['stranger']);
  assert.deepEqual(online2, []);
  friend.disconnect();
  assert.deepEqual((await once(watcher.user.watchlist, 'offline')).user_ids, ['friend']);
});

test('a forged sign-in gets pusher:error 4009 and is closed', async () => {
  const forger = h.server({ id: 'app-id', key: 'app-key', secret: 'wrong' });
  const c = h.client({ userAuthentication: userAuth(forger, { id: 'mallory' }) });
  const err = waitFor('pusher-js to report the 4009 error', (resolve) =>
    c.connection.bind('error', (e) => e.data?.code && resolve(e.data)),
  );
  c.signin();
  assert.equal((await err).code, 4009);
  // 4000-4099: pusher-js does not reconnect.
  await connectionState(c, 'disconnected');

  const raw = rawClient(h);
  const socketId = await raw.established();
  const signed = h.server().authenticateUser(socketId, { id: 'mallory' });
  raw.send({ event: 'pusher:signin', data: { auth: signed.auth, user_data: JSON.stringify({ id: 'admin' }) } });
  assert.equal((await raw.next('pusher:error')).data.code, 4009);
  assert.equal((await raw.closed).code, 4009);
});

test('only the signed-in user may subscribe to its #server-to-user channel', async () => {
  const raw = rawClient(h);
  const socketId = await raw.established();
  const r1 = await raw.subscribe('#server-to-user-victim');
  assert.equal(r1.event, 'pusher:subscription_error');
  raw.send({ event: 'pusher:signin', data: h.server().authenticateUser(socketId, { id: 'me' }) });
  await raw.next('pusher:signin_success');
  const r2 = await raw.subscribe('#server-to-user-me');
  assert.equal(r2.event, 'pusher_internal:subscription_succeeded');
  const r3 = await raw.subscribe('#server-to-user-victim');
  assert.equal(r3.event, 'pusher:subscription_error');
  raw.ws.close();
});
