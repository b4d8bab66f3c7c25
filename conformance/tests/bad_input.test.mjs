// Bad input from raw clients. Each test ends by checking that herald still
// serves a healthy pusher-js client end to end.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startHerald, once, DEV_APP } from '../lib/herald.mjs';
import { clientFrame, metric, rawClient, rawFrameClose } from '../lib/raw.mjs';

const STRICT = { id: 'strict', key: 'strict-key', secret: 'strict-secret' };
let h;
before(async () => {
  h = await startHerald({
    apps: [
      DEV_APP,
      { ...STRICT, max_messages_per_second: 20, max_subscriptions_per_connection: 3, max_frame_size: 4096 },
    ],
  });
});
after(async () => { await h.stop(); });

let healthChecks = 0;
/** A fresh pusher-js client subscribes and receives a broadcast. */
async function assertHealthy(app = DEV_APP) {
  const name = `health-${++healthChecks}`;
  const c = h.client({}, app);
  const ch = c.subscribe(name);
  await once(ch, 'pusher:subscription_succeeded');
  const got = once(ch, 'ok');
  await h.server(app).trigger(name, 'ok', { n: healthChecks });
  assert.deepEqual(await got, { n: healthChecks });
  c.disconnect();
}

/** After an error that does not close, the same raw socket still works. */
async function assertSocketUsable(raw, channel) {
  const ok = await raw.subscribe(channel);
  assert.equal(ok.event, 'pusher_internal:subscription_succeeded');
  await h.server().trigger(channel, 'after', 'still works');
  assert.equal((await raw.next('after')).data, 'still works');
}

async function errorWithoutClose(payload, channel) {
  const before = await metric(h, 'herald_bad_messages_total');
  const raw = rawClient(h);
  await raw.established();
  raw.send(payload);
  const err = await raw.next('pusher:error');
  assert.equal(err.data.code, null, 'a null code: the connection stays open');
  assert.equal(typeof err.data.message, 'string');
  await assertSocketUsable(raw, channel);
  assert.ok((await metric(h, 'herald_bad_messages_total')) > before, 'counted as a bad message');
  raw.ws.close();
}

test('non-JSON text → pusher:error, connection stays', async () => {
  await errorWithoutClose('this is not json', 'after-nonjson');
  await errorWithoutClose('{"event":"pusher:subscribe",', 'after-truncated');
  await assertHealthy();
});

test('JSON of the wrong shape → pusher:error, connection stays', async () => {
  await errorWithoutClose('[1,2,3]', 'after-array');
  await errorWithoutClose('"just a string"', 'after-string');
  await errorWithoutClose({ data: {} }, 'after-no-event');
  await errorWithoutClose({ event: 42 }, 'after-number-event');
  await errorWithoutClose({ event: 'pusher:subscribe' }, 'after-no-data');
  await errorWithoutClose({ event: 'pusher:subscribe', data: { channel: 5 } }, 'after-bad-channel-type');
  await errorWithoutClose({ event: 'pusher:subscribe', data: 'not json inside' }, 'after-bad-inner');
  await errorWithoutClose({ event: 'client-x', data: {} }, 'after-client-no-channel');
  await assertHealthy();
});

test('unknown event → pusher:error, connection stays', async () => {
  await errorWithoutClose({ event: 'pusher:bogus', data: {} }, 'after-unknown');
  await errorWithoutClose({ event: 'something-else', data: {} }, 'after-unknown2');
  await assertHealthy();
});

test('binary frame → close 1003', async () => {
  const before = await metric(h, 'herald_bad_messages_total');
  const raw = rawClient(h);
  await raw.established();
  raw.ws.send(Buffer.from('{"event":"pusher:ping","data":{}}'), { binary: true });
  assert.equal((await raw.closed).code, 1003);
  assert.ok((await metric(h, 'herald_bad_messages_total')) > before);
  await assertHealthy();
});

test('message over max_frame_size → close 1009', async () => {
  const before = await metric(h, 'herald_bad_messages_total');
  const raw = rawClient(h, { key: STRICT.key });
  await raw.established();
  raw.send({ event: 'pusher:ping', data: { pad: 'x'.repeat(5000) } });
  assert.equal((await raw.closed).code, 1009);
  assert.ok((await metric(h, 'herald_bad_messages_total')) > before, 'counted as a bad message');
  // Just under the limit is fine.
  const ok = rawClient(h, { key: STRICT.key });
  await ok.established();
  ok.send({ event: 'pusher:ping', data: { pad: 'x'.repeat(3900) } });
  await ok.next('pusher:pong');
  ok.ws.close();
  // The default limit (64 KiB) on the default app.
  const big = rawClient(h);
  await big.established();
  big.send({ event: 'pusher:ping', data: { pad: 'x'.repeat(70 * 1024) } });
  assert.equal((await big.closed).code, 1009);
  await assertHealthy();
  await assertHealthy(STRICT);
});

test('invalid UTF-8 in a text frame → close 1007', async () => {
  const before = await metric(h, 'herald_bad_messages_total');
  const bytes = [...Buffer.from('{"event":"pusher:ping","data":"')];
  const frame = clientFrame(0x1, [...bytes, 0xc3, 0x28, 0xff, ...Buffer.from('"}')]);
  assert.equal(await rawFrameClose(h, frame), 1007);
  assert.ok((await metric(h, 'herald_bad_messages_total')) > before);
  await assertHealthy();
});

test('invalid channel names → pusher:subscription_error InvalidChannel 400', async () => {
  const before = await metric(h, 'herald_subscription_errors_total');
  const raw = rawClient(h);
  await raw.established();
  for (const name of ['', 'has space', 'emoji-😀', 'slash/channel', 'x'.repeat(165), 'private-', 'presence-']) {
    raw.send({ event: 'pusher:subscribe', data: { channel: name } });
    const err = await raw.next((m) => m.event === 'pusher:subscription_error');
    if (name === 'private-' || name === 'presence-') {
      // Valid characters, but unsigned: refused all the same.
      assert.ok([400, 401].includes(err.data.status), `${name}: ${JSON.stringify(err)}`);
    } else {
      assert.equal(err.data.type, 'InvalidChannel', name);
      assert.equal(err.data.status, 400, name);
    }
  }
  assert.ok((await metric(h, 'herald_subscription_errors_total')) >= before + 7, 'each refusal is counted');
  // 164 characters is the limit and is accepted.
  const ok = await raw.subscribe('y'.repeat(164));
  assert.equal(ok.event, 'pusher_internal:subscription_succeeded');
  await assertSocketUsable(raw, 'after-names');
  raw.ws.close();
  await assertHealthy();
});

test('a subscribe flood over max_messages_per_second → close 4100', async () => {
  const before = await metric(h, 'herald_rate_limited_total');
  const raw = rawClient(h, { key: STRICT.key });
  await raw.established();
  for (let i = 0; i < 60; i++) raw.send({ event: 'pusher:subscribe', data: { channel: `flood-${i}` } });
  const err = await raw.next('pusher:error');
  assert.equal(err.data.code, 4100);
  assert.equal((await raw.closed).code, 4100);
  assert.ok((await metric(h, 'herald_rate_limited_total')) > before);
  // Its subscriptions were cleaned up.
  const res = await h.server(STRICT).get({ path: '/channels', params: { filter_by_prefix: 'flood-' } });
  assert.deepEqual(await res.json(), { channels: {} });
  await assertHealthy(STRICT);
});

test('more than max_subscriptions_per_connection → subscription_error LimitReached 403', async () => {
  const raw = rawClient(h, { key: STRICT.key });
  await raw.established();
  for (const c of ['s1', 's2', 's3']) {
    assert.equal((await raw.subscribe(c)).event, 'pusher_internal:subscription_succeeded');
  }
  const err = await raw.subscribe('s4');
  assert.equal(err.event, 'pusher:subscription_error');
  assert.deepEqual([err.data.type, err.data.status], ['LimitReached', 403]);
  // Re-subscribing to one it has is not a new subscription.
  assert.equal((await raw.subscribe('s1')).event, 'pusher_internal:subscription_succeeded');
  // Unsubscribing frees a slot.
  raw.send({ event: 'pusher:unsubscribe', data: { channel: 's2' } });
  assert.equal((await raw.subscribe('s4')).event, 'pusher_internal:subscription_succeeded');
  raw.ws.close();
  await assertHealthy(STRICT);
});
