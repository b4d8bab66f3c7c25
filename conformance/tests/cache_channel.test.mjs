// Cache channels: the last event is replayed to a new subscriber right after
// subscription_succeeded; pusher:cache_miss when nothing is cached.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startHerald, once } from '../lib/herald.mjs';
import { channelAuth, collect } from '../lib/raw.mjs';

let h;
before(async () => { h = await startHerald(); });
after(async () => { await h.stop(); });

test('an empty cache channel answers pusher:cache_miss', async () => {
  const c = h.client();
  const ch = c.subscribe('cache-empty');
  const miss = once(ch, 'pusher:cache_miss');
  await once(ch, 'pusher:subscription_succeeded');
  await miss;
});

test('the last event is replayed to a later subscriber, without a cache_miss', async () => {
  await h.server().trigger('cache-price', 'tick', { v: 1 });
  await h.server().trigger('cache-price', 'tick', { v: 2 });
  const c = h.client();
  const ch = c.subscribe('cache-price');
  const misses = collect(ch, 'pusher:cache_miss');
  const ticks = collect(ch, 'tick');
  await once(ch, 'pusher:subscription_succeeded');
  const marker = once(ch, 'marker');
  await h.server().trigger('cache-price', 'marker', {});
  await marker;
  assert.deepEqual(ticks, [{ v: 2 }], 'only the last event, once');
  assert.deepEqual(misses, []);
});

test('private cache channels replay too', async () => {
  await h.server().trigger('private-cache-state', 'set', { s: 'on' });
  const c = h.client({ channelAuthorization: channelAuth(h.server()) });
  const ch = c.subscribe('private-cache-state');
  const got = once(ch, 'set');
  await once(ch, 'pusher:subscription_succeeded');
  assert.deepEqual(await got, { s: 'on' });
});

test('an event excluded by socket_id is still cached for others', async () => {
  const c = h.client();
  const ch = c.subscribe('cache-excl');
  await once(ch, 'pusher:subscription_succeeded');
  await h.server().trigger('cache-excl', 'e', 'cached', { socket_id: c.connection.socket_id });
  const d = h.client();
  const got = once(d.subscribe('cache-excl'), 'e');
  assert.equal(await got, 'cached');
});

test('a cached event expires after the app\'s cache_ttl', async () => {
  const app = { id: 'ttl', key: 'ttl-key', secret: 'ttl-secret' };
  const short = await startHerald({ apps: [{ ...app, cache_ttl: 1 }] });
  try {
    await short.server(app).trigger('cache-brief', 'e', 'soon gone');
    const t0 = Date.now();
    const first = short.client({}, app).subscribe('cache-brief');
    assert.equal(await once(first, 'e'), 'soon gone');
    // Fresh subscribers until one gets a miss: that must take about 1 s.
    for (let i = 0; ; i++) {
      const ch = short.client({}, app).subscribe('cache-brief');
      const outcome = await Promise.race([once(ch, 'e').then(() => 'hit'), once(ch, 'pusher:cache_miss').then(() => 'miss')]);
      if (outcome === 'miss') break;
      if (i > 100) assert.fail('never expired');
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.ok(Date.now() - t0 >= 900, `expired after ${Date.now() - t0} ms`);
  } finally {
    await short.stop();
  }
});
