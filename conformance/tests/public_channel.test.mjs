// Public channels with pusher-js and the official `pusher` server SDK.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startHerald, once } from '../lib/herald.mjs';

let h;
before(async () => { h = await startHerald(); });
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
