// Connection-level refusals: each a pusher:error with the code, then a close
// with the same code. pusher-js reads these and does not reconnect.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startHerald, once, connectionState, http, waitFor, DEV_APP } from '../lib/herald.mjs';
import { rawClient, metric } from '../lib/raw.mjs';

const OFF = { id: 'off', key: 'off-key', secret: 'off-secret' };
const TWO = { id: 'two', key: 'two-key', secret: 'two-secret' };
let h;
before(async () => {
  h = await startHerald({
    apps: [DEV_APP, { ...OFF, enabled: false }, { ...TWO, max_connections: 2 }],
  });
});
after(async () => { await h.stop(); });

async function refusedWith(opts, code) {
  const raw = rawClient(h, opts);
  const err = await raw.next('pusher:error');
  assert.equal(err.data.code, code);
  assert.equal(typeof err.data.message, 'string');
  const closed = await raw.closed;
  assert.equal(closed.code, code);
  assert.equal(raw.messages.filter((m) => m.event === 'pusher:connection_established').length, 0);
}

/** pusher-js sees the error code and gives up (4000-4099: do not reconnect). */
async function pusherJsRefused(app, code) {
  const c = h.client({}, app);
  const err = waitFor(`pusher-js to report error ${code}`, (resolve) =>
    c.connection.bind('error', (e) => e.error?.data?.code && resolve(e.error.data.code)),
  );
  assert.equal(await err, code);
  await connectionState(c, 'disconnected');
}

test('connection_established carries a socket id and the activity timeout', async () => {
  const raw = rawClient(h);
  const m = await raw.next('pusher:connection_established');
  assert.match(m.data.socket_id, /^\d+\.\d+$/);
  assert.equal(m.data.activity_timeout, 120);
  raw.ws.close();
});

test('unknown app key → 4001', async () => {
  const refusedBefore = await metric(h, 'herald_connections_refused_total');
  await refusedWith({ key: 'no-such-key' }, 4001);
  await pusherJsRefused({ key: 'no-such-key' }, 4001);
  assert.ok((await metric(h, 'herald_connections_refused_total')) >= refusedBefore + 2);
});

test('disabled app → 4003', async () => {
  await refusedWith({ key: OFF.key }, 4003);
  await pusherJsRefused(OFF, 4003);
});

test('max_connections exceeded → 4004; a freed slot admits again', async () => {
  const a = h.client({}, TWO);
  const b = h.client({}, TWO);
  await Promise.all([connectionState(a, 'connected'), connectionState(b, 'connected')]);
  await refusedWith({ key: TWO.key }, 4004);
  await pusherJsRefused(TWO, 4004);
  b.disconnect();
  // The slot is released when the server sees the close; a raw client
  // retries until admitted.
  for (let i = 0; ; i++) {
    const raw = rawClient(h, { key: TWO.key });
    const first = await raw.next((m) => m.event === 'pusher:connection_established' || m.event === 'pusher:error');
    raw.ws.close();
    if (first.event === 'pusher:connection_established') break;
    assert.equal(first.data.code, 4004);
    if (i > 100) assert.fail('slot never released');
    await new Promise((r) => setTimeout(r, 20));
  }
});

// Pusher itself, soketi, sockudo, Reverb and AnyCable take a connection
// without `protocol` as the current version; soketi's benchmark script
// connects that way.
test('no protocol parameter → taken as protocol 7', async () => {
  for (const query of ['client=js&version=8.4.0', null]) {
    const raw = rawClient(h, { query });
    assert.match(await raw.established(), /^\d+\.\d+$/);
    raw.ws.close();
  }
});

test('unsupported protocol version → 4007; not a number → 4006', async () => {
  await refusedWith({ query: 'protocol=99' }, 4007);
  await refusedWith({ query: 'protocol=4' }, 4007);
  await refusedWith({ query: 'protocol=seven' }, 4006);
});

test('protocol versions 5 to 7 are accepted', async () => {
  for (const v of [5, 6, 7]) {
    const raw = rawClient(h, { query: `protocol=${v}` });
    await raw.established();
    raw.ws.close();
  }
});

test('a pusher:ping from the client is answered with pusher:pong', async () => {
  const raw = rawClient(h);
  await raw.established();
  raw.send({ event: 'pusher:ping', data: {} });
  await raw.next('pusher:pong');
  // The string-data form pusher-js uses works too.
  raw.send({ event: 'pusher:ping', data: '{}' });
  await raw.next('pusher:pong');
  raw.ws.close();
});

test('unknown paths are 404, not a WebSocket', async () => {
  const res = await http(`${h.base}/nope`);
  assert.equal(res.status, 404);
  assert.equal((await http(`${h.base}/up`)).status, 200);
});

test('a close from the client is answered with a close frame (not 1006)', async () => {
  const raw = rawClient(h);
  await raw.established();
  raw.ws.close(1000, 'bye');
  // ws reports 1006 if the server drops TCP without answering the close.
  assert.deepEqual(await raw.closed, { code: 1000, reason: 'bye' });
  const subscribed = rawClient(h);
  await subscribed.established();
  await subscribed.subscribe('closing');
  subscribed.ws.close(4321, 'app reason');
  assert.equal((await subscribed.closed).code, 4321);
});
