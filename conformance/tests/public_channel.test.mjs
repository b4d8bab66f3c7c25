// Public channels with pusher-js and the official `pusher` server SDK.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startHerald, DEV_APP, once } from '../lib/herald.mjs';

let h;
// The development app's credentials with subscription counting on: these
// tests read `info=subscription_count`, which Pusher answers only then.
before(async () => { h = await startHerald({ apps: [{ ...DEV_APP, subscription_count: true }] }); });
after(async () => { await h.stop(); });

test('pusher-js receives an event triggered through the HTTP API', async () => {
  const client = h.client();
  const channel = client.subscribe('news');
  await once(channel, 'pusher:subscription_succeeded');
  const received = once(channel, 'headline');
  const res = await h.server().trigger('news', 'headline', { title: 'hello' });
  assert.equal(res.status, 200);
  assert.deepEqual(await received, { title: 'hello' });
});

test('socket_id exclusion skips the excluded client only', async () => {
  const a = h.client();
  const b = h.client();
  const ca = a.subscribe('excl');
  const cb = b.subscribe('excl');
  await Promise.all([once(ca, 'pusher:subscription_succeeded'), once(cb, 'pusher:subscription_succeeded')]);
  let aGot = 0;
  ca.bind('e', () => aGot++);
  const bGot = once(cb, 'e');
  await h.server().trigger('excl', 'e', 'x', { socket_id: a.connection.socket_id });
  assert.equal(await bGot, 'x');
  // A second event that a does receive proves a's ordering: if the excluded
  // one had reached it, it would have arrived first.
  const aSecond = once(ca, 'f');
  await h.server().trigger('excl', 'f', 'y');
  assert.equal(await aSecond, 'y');
  assert.equal(aGot, 0);
});

test('after unsubscribe no more events arrive; subscribing again works', async () => {
  const c = h.client();
  const ch = c.subscribe('unsub');
  await once(ch, 'pusher:subscription_succeeded');
  const seen = [];
  // Bound on the connection: pusher-js drops events for channels it left,
  // so look at what herald actually sent.
  c.connection.bind('message', (m) => m.channel === 'unsub' && m.event === 'e' && seen.push(m.data));
  c.unsubscribe('unsub');
  const marker = once(c.subscribe('unsub-marker'), 'pusher:subscription_succeeded');
  await marker;
  // Herald handled the unsubscribe before this later subscribe.
  const info = await (await h.server().get({ path: '/channels/unsub', params: { info: 'subscription_count' } })).json();
  assert.deepEqual(info, { occupied: false, subscription_count: 0 });
  await h.server().trigger('unsub', 'e', 'lost');
  const m = once(c.channel('unsub-marker'), 'm');
  await h.server().trigger('unsub-marker', 'm', 'x');
  await m;
  assert.deepEqual(seen, []);
  const again = c.subscribe('unsub');
  await once(again, 'pusher:subscription_succeeded');
  const got = once(again, 'e');
  await h.server().trigger('unsub', 'e', 'back');
  assert.equal(await got, 'back');
});

test('event data: JSON strings are decoded, other strings are passed through', async () => {
  const c = h.client();
  const ch = c.subscribe('types');
  await once(ch, 'pusher:subscription_succeeded');
  const got = [];
  ch.bind('t', (d) => got.push(d));
  const done = once(ch, 'done');
  await h.server().trigger('types', 't', { nested: { a: [1, 2] } });
  await h.server().trigger('types', 't', 'plain text');
  await h.server().trigger('types', 't', '"quoted"');
  await h.server().trigger('types', 't', 'ünïcödé ✓');
  await h.server().trigger('types', 'done', '');
  await done;
  assert.deepEqual(got, [{ nested: { a: [1, 2] } }, 'plain text', 'quoted', 'ünïcödé ✓']);
});
