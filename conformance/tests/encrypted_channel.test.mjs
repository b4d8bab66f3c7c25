// End-to-end encrypted channels: the SDK encrypts with the master key, herald
// relays ciphertext, pusher-js decrypts with the shared_secret it got from
// authorizeChannel.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { startHerald, once } from '../lib/herald.mjs';
import { channelAuth, rawClient } from '../lib/raw.mjs';

const encryptionMasterKeyBase64 = randomBytes(32).toString('base64');
let h;
before(async () => { h = await startHerald(); });
after(async () => { await h.stop(); });

const server = () => h.server(undefined, { encryptionMasterKeyBase64 });

test('pusher-js decrypts an event the SDK encrypted', async () => {
  const client = h.client({ channelAuthorization: channelAuth(server()) });
  const ch = client.subscribe('private-encrypted-secrets');
  await once(ch, 'pusher:subscription_succeeded');
  const got = once(ch, 'reveal');
  await server().trigger('private-encrypted-secrets', 'reveal', { answer: 42 });
  assert.deepEqual(await got, { answer: 42 });
});

test('herald only ever sees ciphertext', async () => {
  const raw = rawClient(h);
  const socketId = await raw.established();
  const auth = server().authorizeChannel(socketId, 'private-encrypted-peek');
  const ok = await raw.subscribe('private-encrypted-peek', { auth: auth.auth });
  assert.equal(ok.event, 'pusher_internal:subscription_succeeded');
  await server().trigger('private-encrypted-peek', 'msg', { plain: 'text-we-must-not-see' });
  const m = await raw.next('msg');
  assert.ok(m.data.ciphertext && m.data.nonce, 'relayed as {ciphertext, nonce}');
  assert.ok(!JSON.stringify(m).includes('text-we-must-not-see'));
  raw.ws.close();
});

test('client events are refused on private-encrypted channels', async () => {
  const raw = rawClient(h);
  const socketId = await raw.established();
  const auth = server().authorizeChannel(socketId, 'private-encrypted-chat');
  await raw.subscribe('private-encrypted-chat', { auth: auth.auth });
  // Another subscriber must not receive it.
  const other = h.client({ channelAuthorization: channelAuth(server()) });
  const ch = other.subscribe('private-encrypted-chat');
  await once(ch, 'pusher:subscription_succeeded');
  let leaked = 0;
  ch.bind('client-x', () => leaked++);
  raw.send({ event: 'client-x', channel: 'private-encrypted-chat', data: { a: 1 } });
  const err = await raw.next('pusher:error');
  assert.equal(err.data.code, null);
  assert.match(err.data.message, /encrypted|private and presence/i);
  // pusher-js itself refuses to send them.
  assert.throws(() => ch.trigger('client-x', {}), /not currently supported|encrypted/i);
  const marker = once(ch, 'marker');
  await server().trigger('private-encrypted-chat', 'marker', {});
  await marker;
  assert.equal(leaked, 0);
  raw.ws.close();
});
