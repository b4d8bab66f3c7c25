// Laravel Echo (broadcaster: 'pusher') on top of pusher-js against herald,
// with events triggered as a Laravel backend would (class names as event
// names, integer user ids in presence channel_data).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import Echo from 'laravel-echo';
import Pusher from 'pusher-js';
import { startHerald, once, waitFor, DEV_APP } from '../lib/herald.mjs';
import { channelAuth } from '../lib/raw.mjs';

let h;
const echos = [];
before(async () => { h = await startHerald(); });
after(async () => {
  for (const e of echos) e.disconnect();
  await h.stop();
});

/** Echo over a pusher-js client we built (`client` option). */
function echoWithClient(user) {
  const auth = channelAuth(h.server(), () => user);
  const e = new Echo({ broadcaster: 'pusher', client: h.client({ channelAuthorization: auth }) });
  echos.push(e);
  return e;
}

/** Echo building its own pusher-js from key + options, as apps configure it. */
function echoWithOptions(user, extra = {}) {
  const e = new Echo({
    broadcaster: 'pusher',
    Pusher,
    key: DEV_APP.key,
    cluster: 'herald',
    wsHost: '127.0.0.1',
    wsPort: h.port,
    forceTLS: false,
    enabledTransports: ['ws'],
    disableStats: true,
    channelAuthorization: channelAuth(h.server(), () => user),
    ...extra,
  });
  echos.push(e);
  return e;
}

const subscribed = (ch) =>
  waitFor(`Echo's subscription to ${ch.name}`, (resolve, reject) => ch.subscribed(resolve).error(reject));

test('channel().listen: namespaced class names and leading-dot raw names', async () => {
  const echo = echoWithOptions();
  const ch = echo.channel('orders');
  const shipped = waitFor(`Echo listen OrderShipped on ${ch.name}`, (resolve) => ch.listen('OrderShipped', resolve));
  const raw = waitFor(`Echo listen .order.raw on ${ch.name}`, (resolve) => ch.listen('.order.raw', resolve));
  await subscribed(ch);
  // Laravel broadcasts the event's class name.
  await h.server().trigger('orders', 'App\\Events\\OrderShipped', { id: 1 });
  await h.server().trigger('orders', 'order.raw', { id: 2 });
  assert.deepEqual(await shipped, { id: 1 });
  assert.deepEqual(await raw, { id: 2 });
});

test('a custom namespace is applied to listen()', async () => {
  const echo = echoWithOptions(undefined, { namespace: 'Domain.Events' });
  const ch = echo.channel('ns');
  const got = waitFor(`Echo listen Thing on ${ch.name}`, (resolve) => ch.listen('Thing', resolve));
  await subscribed(ch);
  await h.server().trigger('ns', 'Domain\\Events\\Thing', 'ok');
  assert.equal(await got, 'ok');
});

test('private(): authorized subscription receives events', async () => {
  const echo = echoWithClient();
  const ch = echo.private('App.Models.User.1');
  const got = waitFor(`Echo listen .notify on ${ch.name}`, (resolve) => ch.listen('.notify', resolve));
  await subscribed(ch);
  await h.server().trigger('private-App.Models.User.1', 'notify', { n: 1 });
  assert.deepEqual(await got, { n: 1 });
});

test('join(): here, joining, leaving with integer user ids', async () => {
  const taylor = echoWithClient({ user_id: 1, user_info: { id: 1, name: 'Taylor' } });
  const here = waitFor('Echo presence chat.1 here', (resolve) => taylor.join('chat.1').here(resolve));
  assert.deepEqual(await here, [{ id: 1, name: 'Taylor' }]);
  const joining = waitFor('Echo presence chat.1 joining', (resolve) => taylor.join('chat.1').joining(resolve));
  const leaving = waitFor('Echo presence chat.1 leaving', (resolve) => taylor.join('chat.1').leaving(resolve));

  const abigail = echoWithOptions({ user_id: 2, user_info: { id: 2, name: 'Abigail' } });
  const here2 = waitFor('Echo presence chat.1 here', (resolve) => abigail.join('chat.1').here(resolve));
  const members = await here2;
  assert.deepEqual(members.map((m) => m.name).sort(), ['Abigail', 'Taylor']);
  assert.deepEqual(await joining, { id: 2, name: 'Abigail' });

  abigail.leave('chat.1');
  assert.deepEqual(await leaving, { id: 2, name: 'Abigail' });
});

test('whisper / listenForWhisper between two Echo clients, not echoed', async () => {
  const a = echoWithClient({ user_id: 10, user_info: {} });
  const b = echoWithOptions({ user_id: 11, user_info: {} });
  const ca = a.join('typing.room');
  const cb = b.join('typing.room');
  await Promise.all([subscribed(ca), subscribed(cb)]);
  let echoed = 0;
  ca.listenForWhisper('typing', () => echoed++);
  const got = waitFor(`Echo listenForWhisper typing on ${cb.name}`, (resolve) => cb.listenForWhisper('typing', resolve));
  ca.whisper('typing', { name: 'A' });
  assert.deepEqual(await got, { name: 'A' });
  // Private channels whisper too.
  const pa = a.private('dm.1');
  const pb = b.private('dm.1');
  await Promise.all([subscribed(pa), subscribed(pb)]);
  const dm = waitFor(`Echo listenForWhisper read on ${pa.name}`, (resolve) => pa.listenForWhisper('read', resolve));
  pb.whisper('read', { upTo: 5 });
  assert.deepEqual(await dm, { upTo: 5 });
  // A marker the sender does receive, sent after, proves no echo.
  const marker = waitFor(`Echo listen .marker on ${ca.name}`, (resolve) => ca.listen('.marker', resolve));
  await h.server().trigger('presence-typing.room', 'marker', {});
  await marker;
  assert.equal(echoed, 0);
});

test('encryptedPrivate(): Echo decrypts events the SDK encrypted', async () => {
  const encryptionMasterKeyBase64 = randomBytes(32).toString('base64');
  const server = h.server(undefined, { encryptionMasterKeyBase64 });
  const e = new Echo({
    broadcaster: 'pusher',
    client: h.client({ channelAuthorization: channelAuth(server) }),
  });
  echos.push(e);
  const ch = e.encryptedPrivate('vault');
  const got = waitFor(`Echo listen .opened on ${ch.name}`, (resolve) => ch.listen('.opened', resolve));
  await subscribed(ch);
  await server.trigger('private-encrypted-vault', 'opened', { by: 'echo' });
  assert.deepEqual(await got, { by: 'echo' });
});

test('socketId() is herald\'s socket id, usable for toOthers() exclusion', async () => {
  const a = echoWithClient();
  const b = echoWithClient();
  const ca = a.channel('others');
  const cb = b.channel('others');
  await Promise.all([subscribed(ca), subscribed(cb)]);
  assert.match(a.socketId(), /^\d+\.\d+$/);
  let aGot = 0;
  ca.listen('.e', () => aGot++);
  const bGot = waitFor(`Echo listen .e on ${cb.name}`, (resolve) => cb.listen('.e', resolve));
  const aMarker = waitFor(`Echo listen .marker on ${ca.name}`, (resolve) => ca.listen('.marker', resolve));
  // Laravel's broadcast(...)->toOthers() sends the X-Socket-ID as socket_id.
  await h.server().trigger('others', 'e', 'x', { socket_id: a.socketId() });
  await h.server().trigger('others', 'marker', 'y');
  assert.equal(await bGot, 'x');
  await aMarker;
  assert.equal(aGot, 0);
});
