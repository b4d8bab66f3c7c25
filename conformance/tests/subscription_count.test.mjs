// pusher_internal:subscription_count (app option subscription_count=true),
// surfaced by pusher-js as pusher:subscription_count.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startHerald, once } from '../lib/herald.mjs';
import { channelAuth, collect } from '../lib/raw.mjs';

const COUNTING = { id: 'c', key: 'c-key', secret: 'c-secret' };
const PLAIN = { id: 'p', key: 'p-key', secret: 'p-secret' };
let h;
before(async () => {
  h = await startHerald({ apps: [{ ...COUNTING, subscription_count: true }, PLAIN] });
});
after(async () => { await h.stop(); });

test('subscribers are told the count as it goes up and down', async () => {
  const a = h.client({}, COUNTING);
  const ca = a.subscribe('counted');
  assert.equal((await once(ca, 'pusher:subscription_count')).subscription_count, 1);
  const b = h.client({}, COUNTING);
  const two = once(ca, 'pusher:subscription_count');
  const cb = b.subscribe('counted');
  const bCount = once(cb, 'pusher:subscription_count');
  assert.equal((await two).subscription_count, 2);
  assert.equal((await bCount).subscription_count, 2);
  assert.equal(ca.subscriptionCount, 2);
  const c = h.client({}, COUNTING);
  const three = once(ca, 'pusher:subscription_count');
  c.subscribe('counted');
  assert.equal((await three).subscription_count, 3);
  // Unsubscribing and disconnecting both count down.
  const two2 = once(ca, 'pusher:subscription_count');
  c.unsubscribe('counted');
  assert.equal((await two2).subscription_count, 2);
  const one = once(ca, 'pusher:subscription_count');
  b.disconnect();
  assert.equal((await one).subscription_count, 1);
});

test('not sent on presence channels', async () => {
  const auth = channelAuth(h.server(COUNTING), () => ({ user_id: 'u' }));
  const a = h.client({ channelAuthorization: auth }, COUNTING);
  const ch = a.subscribe('presence-counted');
  const counts = collect(ch, 'pusher:subscription_count');
  await once(ch, 'pusher:subscription_succeeded');
  const marker = once(ch, 'marker');
  await h.server(COUNTING).trigger('presence-counted', 'marker', {});
  await marker;
  assert.deepEqual(counts, []);
});

test('not sent when the app does not enable it', async () => {
  const a = h.client({}, PLAIN);
  const ch = a.subscribe('uncounted');
  const counts = collect(ch, 'pusher:subscription_count');
  await once(ch, 'pusher:subscription_succeeded');
  const marker = once(ch, 'marker');
  await h.server(PLAIN).trigger('uncounted', 'marker', {});
  await marker;
  assert.deepEqual(counts, []);
});
