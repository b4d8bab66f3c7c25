// Webhooks from a real herald to a real HTTP receiver, verified with the
// official `pusher` SDK's webhook validation (`pusher.webhook(...)`), as a
// backend would: channel existence, presence members and client events
// caused by pusher-js clients.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { startHerald, DEV_APP, once } from '../lib/herald.mjs';
import { channelAuth } from '../lib/raw.mjs';

let h;
let receiver;
const got = []; // { webhook, events }
let waiters = [];

function startReceiver() {
  return new Promise((resolve) => {
    const srv = http.createServer((req, res) => {
      let rawBody = '';
      req.setEncoding('utf8');
      req.on('data', (d) => (rawBody += d));
      req.on('end', () => {
        // The SDK wants lower-case header names, as Node gives them.
        const webhook = h.server().webhook({ headers: req.headers, rawBody });
        got.push({ webhook, rawBody });
        res.writeHead(200).end();
        for (const w of waiters) w();
      });
    });
    srv.listen(0, '127.0.0.1', () => resolve(srv));
  });
}

/** Wait for a received event matching `pred`; returns [event, webhook]. */
async function received(pred, what, timeoutMs = 10000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    for (const { webhook } of got) {
      if (!webhook.isValid()) continue;
      const ev = webhook.getEvents().find(pred);
      if (ev) return [ev, webhook];
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}; got ${got.map((g) => g.rawBody).join('\n')}`);
    await new Promise((r) => {
      waiters.push(r);
      setTimeout(r, 200);
    });
    waiters = [];
  }
}

before(async () => {
  receiver = await startReceiver();
  const url = `http://127.0.0.1:${receiver.address().port}/pusher/webhooks`;
  h = await startHerald({
    webhook_batch_ms: 50,
    webhook_leave_delay_ms: 300,
    apps: [
      {
        ...DEV_APP,
        webhooks: [
          {
            url,
            event_types: ['channel_occupied', 'channel_vacated', 'member_added', 'member_removed', 'client_event'],
          },
        ],
      },
    ],
  });
});
after(async () => {
  await h.stop();
  receiver.close();
});

test('every webhook passes the pusher SDK validation', async () => {
  const auth = channelAuth(h.server(), () => ({ user_id: 'alice', user_info: { name: 'Alice' } }));
  const alice = h.client({ channelAuthorization: auth });
  const ch = alice.subscribe('presence-hooks');
  await once(ch, 'pusher:subscription_succeeded');

  const [occupied, hook] = await received((e) => e.name === 'channel_occupied' && e.channel === 'presence-hooks', 'channel_occupied');
  assert.deepEqual(occupied, { name: 'channel_occupied', channel: 'presence-hooks' });
  assert.ok(hook.isValid(), 'signature and key accepted by the SDK');
  assert.ok(Math.abs(hook.getTime().getTime() - Date.now()) < 60000, 'time_ms is now');
  const [added] = await received((e) => e.name === 'member_added', 'member_added');
  assert.deepEqual(added, { name: 'member_added', channel: 'presence-hooks', user_id: 'alice' });

  ch.trigger('client-hello', { text: 'hi' });
  const [ce] = await received((e) => e.name === 'client_event', 'client_event');
  assert.equal(ce.channel, 'presence-hooks');
  assert.equal(ce.event, 'client-hello');
  assert.deepEqual(JSON.parse(ce.data), { text: 'hi' });
  assert.equal(ce.socket_id, alice.connection.socket_id);
  assert.equal(ce.user_id, 'alice');

  alice.unsubscribe('presence-hooks');
  await received((e) => e.name === 'member_removed' && e.user_id === 'alice', 'member_removed');
  await received((e) => e.name === 'channel_vacated' && e.channel === 'presence-hooks', 'channel_vacated');

  assert.ok(got.length > 0);
  for (const { webhook, rawBody } of got) assert.ok(webhook.isValid(), `valid: ${rawBody}`);
});

test('the SDK refuses a webhook signed with another secret', async () => {
  const { webhook, rawBody } = got[0];
  const other = h.server({ ...DEV_APP, secret: 'not-the-secret' }).webhook({
    headers: { 'x-pusher-key': DEV_APP.key, 'x-pusher-signature': webhook.signature, 'content-type': 'application/json' },
    rawBody,
  });
  assert.equal(other.isValid(), false);
});
