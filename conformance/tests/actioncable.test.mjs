// Action Cable at /cable: the real @rails/actioncable client against a real
// herald, whose app is a chat built on AnyCable's @anycable/serverless-js,
// served once as HTTP RPC and once as gRPC (@grpc/grpc-js).
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startHerald, once } from '../lib/herald.mjs';
import {
  chatApp,
  httpRpcServer,
  grpcRpcServer,
  consumer,
  subscribe,
  rawCable,
  until,
  startCable,
} from '../lib/cable.mjs';

// ANYCABLE_BIN=/path/to/anycable-go runs the first two groups against
// AnyCable instead (the rest test herald's own behaviour).
const herald_only = process.env.ANYCABLE_BIN ? { skip: 'herald only' } : {};

const ROOM = (room) => ({ channel: 'ChatChannel', room });
const ident = (params) => JSON.stringify(params);

for (const transport of ['http', 'grpc']) {
  describe(`Action Cable over ${transport} RPC`, () => {
    let herald;
    let rpc;
    let chat;
    const consumers = [];
    const cons = (user) => {
      const c = consumer(herald, user);
      consumers.push(c);
      return c;
    };

    before(async () => {
      chat = chatApp();
      rpc = transport === 'http' ? await httpRpcServer(chat.app, { secret: 'rpc-secret' }) : await grpcRpcServer(chat.app);
      herald = await startCable({
        rpc: { host: rpc.url, secret: 'rpc-secret', broadcast_key: 'bkey', headers: ['cookie', 'x-api-version'] },
      });
      chat.setBroadcast(`${herald.base}/_broadcast`, 'bkey');
    });

    after(async () => {
      for (const c of consumers) c.disconnect();
      await herald?.stop();
      await rpc?.close();
    });

    test('a client with a cookie is welcomed; the app saw the URL, the forwarded headers and the sid', async () => {
      const ws = await rawCable(herald, { cookie: 'user=ann' });
      const welcome = await ws.next();
      assert.equal(welcome.type, 'welcome');
      assert.ok(welcome.sid, 'welcome carries the session id');
      const seen = await until(() => chat.calls.connect.find((c) => c.sid === welcome.sid), 'Connect call');
      assert.equal(seen.env.url, `http://127.0.0.1:${herald.port}/cable`);
      assert.equal(seen.env.headers.cookie, 'user=ann');
      assert.equal(seen.env.headers.REMOTE_ADDR, '127.0.0.1');
      assert.equal(Object.keys(seen.env.headers).length, 2, 'only the configured headers and REMOTE_ADDR');
      ws.close();
    });

    test('a client without the cookie is refused with the app\'s disconnect message', async () => {
      const ws = await rawCable(herald);
      const f = await ws.next();
      assert.deepEqual(f, { type: 'disconnect', reason: 'unauthorized' });
      assert.equal(await ws.closed(), 1000);
    });

    test('@rails/actioncable subscribes, gets broadcasts from POST /_broadcast and the app\'s transmissions', async () => {
      const c = cons('bob');
      const room = await subscribe(c, ROOM('lobby'));
      const r = await fetch(`${herald.base}/_broadcast`, {
        method: 'POST',
        headers: { authorization: 'Bearer bkey', 'content-type': 'application/json' },
        body: JSON.stringify({ stream: 'room:lobby', data: JSON.stringify({ text: 'hello' }) }),
      });
      assert.equal(r.status, 201);
      assert.deepEqual(await room.next(), { text: 'hello' });
      // An action that answers the caller only, with the channel's state.
      room.sub.perform('whoami');
      assert.deepEqual(await room.next(), { user: 'bob', room: 'lobby' });
    });

    test('an action that broadcasts reaches every subscriber of the room, each with its identifier', async () => {
      const a = await subscribe(cons('amy'), ROOM('kitchen'));
      const b = await subscribe(cons('ben'), ROOM('kitchen'));
      a.sub.perform('speak', { text: 'tea?' });
      assert.deepEqual(await a.next(), { from: 'amy', text: 'tea?' });
      assert.deepEqual(await b.next(), { from: 'amy', text: 'tea?' });
    });

    test('the secret room is rejected', async () => {
      await assert.rejects(subscribe(cons('eve'), ROOM('secret')), /rejected/);
    });

    test('stopped streams, added streams and state travel as the app says', async () => {
      const c = cons('cat');
      const room = await subscribe(c, ROOM('attic'));
      room.sub.perform('follow', { stream: 'extra' });
      assert.deepEqual(await room.next(), { following: 'extra' });
      const post = (stream, text) =>
        fetch(`${herald.base}/_broadcast`, {
          method: 'POST',
          headers: { authorization: 'Bearer bkey' },
          body: JSON.stringify({ stream, data: JSON.stringify({ text }) }),
        });
      await post('extra', 'on extra');
      assert.deepEqual(await room.next(), { text: 'on extra' });
      room.sub.perform('mute');
      assert.deepEqual(await room.next(), { muted: true });
      await post('room:attic', 'muted away');
      await post('extra', 'still on extra');
      assert.deepEqual(await room.next(), { text: 'still on extra' }, 'the stopped stream delivers nothing');
      // Every command carried the subscription's state from the subscribe.
      const last = chat.calls.command.filter((c) => c.identifier === ident(ROOM('attic'))).at(-1);
      assert.ok(last.env.istate, 'istate sent');
    });

    test('the app closing the connection (disconnect: true) closes it after its transmissions', async () => {
      const ws = await rawCable(herald, { cookie: 'user=dan' });
      assert.equal((await ws.next()).type, 'welcome');
      const id = ident(ROOM('hall'));
      ws.send({ command: 'subscribe', identifier: id });
      assert.equal((await ws.next()).type, 'confirm_subscription');
      ws.send({ command: 'message', identifier: id, data: JSON.stringify({ action: 'kick' }) });
      // The library queues the connection's transmission before the
      // channel's; they are sent in the app's order, then the socket closes
      // (herald: 1000; AnyCable drops the connection, which clients see as
      // 1006; clients act on the disconnect message, not on the code).
      const got = [await ws.next(), await ws.next()];
      assert.deepEqual(got, [
        { type: 'disconnect', reason: 'remote', reconnect: false },
        { identifier: id, message: { kicked: true } },
      ]);
      const code = await ws.closed();
      if (!herald.anycable) assert.equal(code, 1000);
    });

    test('Disconnect is called with the client\'s subscriptions and state when it leaves', async () => {
      const c = cons('fay');
      await subscribe(c, ROOM('porch'));
      await subscribe(c, ROOM('garden'));
      const before = chat.calls.disconnect.length;
      c.disconnect();
      const d = await until(
        () => chat.calls.disconnect.slice(before).find((x) => x.identifiers?.user === 'fay'),
        'Disconnect call for fay',
      );
      assert.deepEqual([...d.subscriptions].sort(), [ident(ROOM('garden')), ident(ROOM('porch'))].sort());
      assert.ok(d.env.istate[ident(ROOM('porch'))], 'every subscription\'s state');
    });

    test('/_broadcast: a batch, exclude_socket, and the bearer key', async () => {
      const ws = await rawCable(herald, { cookie: 'user=gus' });
      const { sid } = await ws.next();
      const id = ident(ROOM('deck'));
      ws.send({ command: 'subscribe', identifier: id });
      assert.equal((await ws.next()).type, 'confirm_subscription');
      const other = await subscribe(cons('hal'), ROOM('deck'));
      const send = (body, key = 'bkey') =>
        fetch(`${herald.base}/_broadcast`, {
          method: 'POST',
          headers: key ? { authorization: `Bearer ${key}` } : {},
          body: JSON.stringify(body),
        });
      assert.equal((await send({ stream: 'room:deck', data: '1' }, 'wrong')).status, 401);
      assert.equal((await send({ stream: 'room:deck', data: '1' }, null)).status, 401);
      // herald refuses a body that is not a broadcast (AnyCable answers 201
      // and logs it).
      if (!herald.anycable) assert.equal((await send({ nope: 1 })).status, 400);
      const batch = [
        { stream: 'room:deck', data: JSON.stringify({ n: 1 }), meta: { exclude_socket: sid } },
        { stream: 'room:deck', data: 'plain text' },
      ];
      assert.equal((await send(batch)).status, 201);
      assert.deepEqual(await other.next(), { n: 1 });
      assert.equal(await other.next(), 'plain text');
      assert.deepEqual(await ws.next(), { identifier: id, message: 'plain text' }, 'the excluded socket skips the first');
      ws.close();
    });
  });
}

describe('Action Cable without a reachable RPC server', herald_only, () => {
  test('clients get disconnect with reconnect: true, and Pusher clients are unaffected', async () => {
    const herald = await startHerald({ rpc: { host: '127.0.0.1:1', timeout_ms: 500, retries: 1 } });
    try {
      const ws = await rawCable(herald, { cookie: 'user=ann' });
      assert.deepEqual(await ws.next(), { type: 'disconnect', reason: 'rpc_error', reconnect: true });
      assert.equal(await ws.closed(), 1011);
      const p = herald.client();
      const ch = p.subscribe('still-fine');
      await once(ch, 'pusher:subscription_succeeded');
      p.disconnect();
      const metrics = await (await fetch(`${herald.base}/metrics`)).text();
      assert.match(metrics, /herald_cable_rpc_failures_total [1-9]/);
    } finally {
      await herald.stop();
    }
  });

  test('a slow RPC server times out the same way, and does not hold up others', async () => {
    const chat = chatApp();
    const slow = await httpRpcServer(chat.app, { delayMs: 2000 });
    const herald = await startHerald({ rpc: { host: slow.url, timeout_ms: 300 } });
    try {
      const [a, b] = await Promise.all([rawCable(herald, { cookie: 'user=a' }), rawCable(herald, { cookie: 'user=b' })]);
      assert.equal((await a.next()).reason, 'rpc_error');
      assert.equal((await b.next()).reason, 'rpc_error');
    } finally {
      await herald.stop();
      await slow.close();
    }
  });
});

describe('Pusher and Action Cable on one herald', herald_only, () => {
  test('never see each other\'s channels', async () => {
    const chat = chatApp();
    const rpc = await httpRpcServer(chat.app);
    const herald = await startHerald({ rpc: { host: rpc.url, public_streams: true } });
    try {
      const c = consumer(herald, 'ivy');
      const cable = await subscribe(c, { channel: '$pubsub', stream_name: 'news' });
      const p = herald.client();
      const ch = p.subscribe('news');
      await once(ch, 'pusher:subscription_succeeded');
      const pusherGot = [];
      ch.bind('headline', (d) => pusherGot.push(d));
      // A Pusher publish on "news" does not reach the Action Cable stream...
      await herald.server().trigger('news', 'headline', { for: 'pusher' });
      assert.deepEqual(await once(ch, 'headline'), { for: 'pusher' });
      // ...and a stream broadcast on "news" does not reach the Pusher channel.
      await fetch(`${herald.base}/_broadcast`, {
        method: 'POST',
        body: JSON.stringify({ stream: 'news', data: JSON.stringify({ for: 'cable' }) }),
      });
      assert.deepEqual(await cable.next(), { for: 'cable' });
      assert.equal(cable.messages.length, 0);
      assert.equal(pusherGot.length, 1);
      c.disconnect();
      p.disconnect();
    } finally {
      await herald.stop();
      await rpc.close();
    }
  });
});

describe('@anycable/web against herald', herald_only, () => {
  test('subscribes, receives broadcasts and the app\'s answers, and gets rejections', async () => {
    const { createCable } = await import('@anycable/web');
    const { default: WebSocket } = await import('ws');
    const chat = chatApp();
    const rpc = await httpRpcServer(chat.app);
    const herald = await startHerald({ rpc: { host: rpc.url } });
    chat.setBroadcast(`${herald.base}/_broadcast`);
    const cable = createCable(`ws://127.0.0.1:${herald.port}/cable`, {
      websocketImplementation: WebSocket,
      websocketOptions: { headers: { cookie: 'user=web' } },
      protocol: 'actioncable-v1-json',
      logLevel: 'error',
    });
    try {
      const channel = cable.subscribeTo('ChatChannel', { room: 'web' });
      await channel.ensureSubscribed();
      const got = [];
      const waiters = [];
      channel.on('message', (m) => (waiters.length ? waiters.shift()(m) : got.push(m)));
      const next = () =>
        got.length
          ? Promise.resolve(got.shift())
          : new Promise((res, rej) => {
              const t = setTimeout(() => rej(new Error('no message')), 5000);
              waiters.push((m) => (clearTimeout(t), res(m)));
            });
      await channel.perform('whoami');
      assert.deepEqual(await next(), { user: 'web', room: 'web' });
      await channel.perform('speak', { text: 'from web' });
      assert.deepEqual(await next(), { from: 'web', text: 'from web' });
      const secret = cable.subscribeTo('ChatChannel', { room: 'secret' });
      await assert.rejects(secret.ensureSubscribed());
    } finally {
      cable.disconnect();
      await herald.stop();
      await rpc.close();
    }
  });
});
