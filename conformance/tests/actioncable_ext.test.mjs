// AnyCable's extended protocol (actioncable-v1-ext-json) on one herald:
// the real @anycable/web client whose socket is cut while the app keeps
// broadcasting comes back with every message exactly once, in order,
// restored without a new Connect; a history request for an unknown epoch
// is rejected and the client stays connected.
import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { startHerald } from '../lib/herald.mjs';
import { chatApp, httpRpcServer, rawCable, until } from '../lib/cable.mjs';

const EXT = 'actioncable-v1-ext-json';

async function setup() {
  const chat = chatApp();
  const rpc = await httpRpcServer(chat.app);
  const herald = await startHerald({ rpc: { host: rpc.url } });
  const broadcast = (stream, data) =>
    fetch(`${herald.base}/_broadcast`, {
      method: 'POST',
      body: JSON.stringify({ stream, data: JSON.stringify(data) }),
    }).then((r) => assert.equal(r.status, 201));
  return { chat, rpc, herald, broadcast };
}

describe('actioncable-v1-ext-json with @anycable/web', () => {
  test('a dropped client restores without Connect and gets every missed message once, in order', async () => {
    const { createCable } = await import('@anycable/web');
    const { default: WebSocket } = await import('ws');
    const { chat, rpc, herald, broadcast } = await setup();
    const cable = createCable(`ws://127.0.0.1:${herald.port}/cable`, {
      websocketImplementation: WebSocket,
      websocketOptions: { headers: { cookie: 'user=gap' } },
      protocol: EXT,
      logLevel: 'error',
    });
    const events = [];
    cable.on('connect', (e) => events.push(e));
    try {
      const channel = cable.subscribeTo('ChatChannel', { room: 'gap' });
      await channel.ensureSubscribed();
      const got = [];
      channel.on('message', (m) => got.push(m.n));
      const N = 80;
      let dropped = false;
      for (let n = 1; n <= N; n++) {
        await broadcast('room:gap', { n });
        if (n === 20) {
          await until(() => got.length >= 20, 'the first 20 messages live');
          // Cut the socket under the client (no close handshake).
          cable.transport.ws.terminate();
          dropped = true;
        }
        await new Promise((r) => setTimeout(r, 15));
      }
      assert.ok(dropped);
      await until(() => got.length >= N, `all ${N} messages (got ${got.length})`, 15000);
      await new Promise((r) => setTimeout(r, 200));
      assert.deepEqual(got, Array.from({ length: N }, (_, i) => i + 1), 'each message once, in order');
      assert.ok(events.some((e) => e.restored), `the session was restored: ${JSON.stringify(events)}`);
      assert.equal(chat.calls.connect.length, 1, 'no second Connect for the restored session');
    } finally {
      cable.disconnect();
      await herald.stop();
      await rpc.close();
    }
  });

  test('reject_history for an unknown epoch leaves the client connected', async () => {
    const { rpc, herald, broadcast } = await setup();
    try {
      const c = await rawCable(herald, { cookie: 'user=r', protocols: [EXT] });
      assert.equal(c.ws.protocol, EXT);
      const welcome = await c.next();
      assert.equal(welcome.type, 'welcome');
      assert.ok(welcome.sid, 'the welcome carries a sid');
      const identifier = JSON.stringify({ channel: 'ChatChannel', room: 'r' });
      c.send({
        command: 'subscribe',
        identifier,
        history: { since: 0, streams: { 'room:r': { epoch: 'bogus', offset: 3 } } },
      });
      assert.equal((await c.next()).type, 'confirm_subscription');
      assert.deepEqual(await c.next(), { type: 'reject_history', identifier });
      await broadcast('room:r', { after: true });
      const m = await c.next();
      assert.deepEqual(m.message, { after: true });
      assert.equal(m.stream_id, 'room:r');
      assert.equal(m.offset, 1);
      assert.equal(typeof m.epoch, 'string');
      c.close();
    } finally {
      await herald.stop();
      await rpc.close();
    }
  });

  test('presence (join, info, leave) and whispers with the real client on $pubsub streams', async () => {
    const { createCable } = await import('@anycable/web');
    const { default: WebSocket } = await import('ws');
    const herald = await startHerald({ rpc: { public_streams: true } });
    const broadcast = (stream, data) =>
      fetch(`${herald.base}/_broadcast`, {
        method: 'POST',
        body: JSON.stringify({ stream, data: JSON.stringify(data) }),
      }).then((r) => assert.equal(r.status, 201));
    const open = () =>
      createCable(`ws://127.0.0.1:${herald.port}/cable`, {
        websocketImplementation: WebSocket,
        protocol: EXT,
        logLevel: 'error',
      });
    const ann = open();
    const bob = open();
    try {
      const a = ann.streamFrom('room');
      const b = bob.streamFrom('room');
      await a.ensureSubscribed();
      await b.ensureSubscribed();
      const seenByA = [];
      const seenByB = [];
      a.on('presence', (e) => seenByA.push(e));
      b.on('presence', (e) => seenByB.push(e));
      const toA = [];
      const toB = [];
      a.on('message', (m) => toA.push(m));
      b.on('message', (m) => toB.push(m));

      await a.presence.join('ann', { name: 'Ann' });
      await until(
        () => seenByB.some((e) => e.type === 'join' && e.id === 'ann' && e.info?.name === 'Ann'),
        "Bob hears Ann join",
      );
      assert.deepEqual(await b.presence.info(), { ann: { name: 'Ann' } });
      await b.presence.join('bob', { name: 'Bob' });
      await until(() => seenByA.some((e) => e.type === 'join' && e.id === 'bob'), 'Ann hears Bob join');
      assert.deepEqual(await a.presence.info(), { ann: { name: 'Ann' }, bob: { name: 'Bob' } });

      // A whisper reaches Bob, never Ann (its sender), and never a position.
      await a.whisper({ typing: 'ann' });
      await until(() => toB.length === 1, 'Bob gets the whisper');
      assert.deepEqual(toB[0], { typing: 'ann' });
      await broadcast('room', { after: true });
      await until(() => toA.length === 1 && toB.length === 2, 'the broadcast after the whisper');
      assert.deepEqual(toA, [{ after: true }], 'no whisper back to its sender');

      await a.presence.leave();
      await until(() => seenByB.some((e) => e.type === 'leave' && e.id === 'ann'), 'Bob hears Ann leave');
      // Bob's state follows the events it heard.
      assert.deepEqual(await b.presence.info(), { bob: { name: 'Bob' } });
    } finally {
      ann.disconnect();
      bob.disconnect();
      await herald.stop();
    }
  });

  test("presence on a channel the app's subscribe enabled; a restored client stays one member; gone after the TTL", async () => {
    const { createCable } = await import('@anycable/web');
    const { default: WebSocket } = await import('ws');
    const chat = chatApp();
    const rpc = await httpRpcServer(chat.app);
    // The client reconnects after a random back-off of up to a few
    // seconds: the TTL leaves it room.
    const herald = await startHerald({ rpc: { host: rpc.url, presence_ttl: 10 } });
    const open = (user) =>
      createCable(`ws://127.0.0.1:${herald.port}/cable`, {
        websocketImplementation: WebSocket,
        websocketOptions: { headers: { cookie: `user=${user}` } },
        protocol: EXT,
        logLevel: 'error',
      });
    const ann = open('ann');
    const bob = open('bob');
    const events = [];
    ann.on('connect', (e) => events.push(e));
    try {
      const a = ann.subscribeTo('PresenceChannel', { room: 'p' });
      const b = bob.subscribeTo('PresenceChannel', { room: 'p' });
      await a.ensureSubscribed();
      await b.ensureSubscribed();
      const seenByB = [];
      b.on('presence', (e) => seenByB.push(e));
      const toB = [];
      b.on('message', (m) => toB.push(m));
      await a.presence.join('ann', { name: 'Ann' });
      await until(() => seenByB.some((e) => e.type === 'join' && e.id === 'ann'), 'Bob hears Ann join');
      await a.whisper({ typing: true });
      await until(() => toB.length === 1, 'the whisper on the app-enabled stream');
      assert.deepEqual(toB[0], { typing: true });

      // Ann's socket is cut; the client restores the session and joins
      // again: Bob hears no leave and no second join.
      ann.transport.ws.terminate();
      await until(() => events.some((e) => e.restored), 'the session restored', 9500);
      // Ann's own info request follows the client's join on the restored
      // connection, so its answer means the join was handled.
      assert.deepEqual(await a.presence.info(), { ann: { name: 'Ann' } });
      assert.deepEqual(await b.presence.info(), { ann: { name: 'Ann' } });
      // Bob heard no leave and no second join: the marker broadcast now
      // reaches him after anything the restore caused.
      const s = await fetch(`${herald.base}/_broadcast`, {
        method: 'POST',
        body: JSON.stringify({ stream: 'presence:p', data: JSON.stringify({ marker: 1 }) }),
      });
      assert.equal(s.status, 201);
      await until(() => toB.some((m) => m.marker === 1), 'the marker');
      assert.deepEqual(
        seenByB.filter((e) => e.type !== 'info').map((e) => `${e.type}:${e.id}`),
        ['join:ann'],
        'one join, no leave across the restore',
      );
      // Gone for good: the leave comes once the TTL has passed.
      ann.disconnect();
      await until(() => seenByB.some((e) => e.type === 'leave' && e.id === 'ann'), 'Ann leaves', 12000);
    } finally {
      ann.disconnect();
      bob.disconnect();
      await herald.stop();
      await rpc.close();
    }
  });
});
