// Server keep-alive: after activity_timeout of silence herald sends
// pusher:ping; a client that does not answer within pong_timeout is closed
// with 4201, one that answers stays.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startHerald, once, connectionState, waitFor } from '../lib/herald.mjs';
import { rawClient } from '../lib/raw.mjs';

let h;
before(async () => { h = await startHerald({ activity_timeout: 1, pong_timeout: 1 }); });
after(async () => { await h.stop(); });

test('the handshake announces the configured activity_timeout', async () => {
  const raw = rawClient(h);
  const m = await raw.next('pusher:connection_established');
  assert.equal(m.data.activity_timeout, 1);
  raw.ws.close();
});

test('a client that never answers pusher:ping is closed with 4201', async () => {
  const silent = rawClient(h, { answerPings: false });
  await silent.established();
  await silent.next('pusher:ping', 5000);
  const err = await silent.next('pusher:error', 5000);
  assert.equal(err.data.code, 4201);
  assert.equal((await silent.closed).code, 4201);
});

test('a client that answers stays connected across several pings', async () => {
  const polite = rawClient(h, { answerPings: true });
  await polite.established();
  await polite.subscribe('alive');
  // Unanswered, the first ping would close it (4201) before a second one
  // is due; a second ping means the answer counted.
  for (let i = 0; i < 2; i++) await polite.next('pusher:ping', 5000);
  await h.server().trigger('alive', 'still', 'here');
  assert.equal((await polite.next('still')).data, 'here');
  assert.ok(!polite.messages.some((m) => m.event === 'pusher:error'));
  polite.ws.close();
});

test('any client frame counts as activity, not only pongs', async () => {
  const chatty = rawClient(h, { answerPings: false });
  await chatty.established();
  // Send a client ping every 200 ms for 2.5 s: herald never needs to ping.
  for (let i = 0; i < 12; i++) {
    chatty.send({ event: 'pusher:ping', data: {} });
    await chatty.next('pusher:pong');
    await new Promise((r) => setTimeout(r, 200));
  }
  assert.equal(chatty.ws.readyState, chatty.ws.OPEN);
  assert.ok(!chatty.messages.some((m) => m.event === 'pusher:ping'));
  chatty.ws.close();
});

test('pusher-js keeps its connection alive against a 1 s activity timeout', async () => {
  const c = h.client();
  const ch = c.subscribe('pjs-alive');
  await once(ch, 'pusher:subscription_succeeded');
  // pusher-js pings after 1 s of silence; herald's pong keeps it connected.
  const pong = waitFor('pusher-js to get a pusher:pong', (resolve) =>
    c.connection.bind('message', (m) => m.event === 'pusher:pong' && resolve()),
  );
  await pong;
  const got = once(ch, 'ev');
  await h.server().trigger('pjs-alive', 'ev', 'ok');
  assert.equal(await got, 'ok');
  assert.equal(c.connection.state, 'connected');
});
