// Server-Sent Events at /events (rpc.sse), as AnyCable serves them: the
// `eventsource` package in Node and EventSource in headless Chromium
// subscribe to a public stream, a signed stream, a Turbo stream and an
// Action Cable channel of an app served over AnyCable's HTTP RPC; an EventSource cut
// off mid-stream reconnects by itself with Last-Event-ID and gets exactly
// what it missed, on one node (memory) and on another node of a cluster
// on Redis and on NATS JetStream.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { EventSource } from 'eventsource';
import { startHerald, freePort } from '../lib/herald.mjs';
import { chatApp, httpRpcServer, until } from '../lib/cable.mjs';
import { balancer, startServer } from '../lib/nodes.mjs';
import { metric } from '../lib/raw.mjs';

const STREAMS_SECRET = 'sse-streams-secret';
const TURBO_SECRET = 'sse-turbo-secret';

/** A signed stream name as Rails' MessageVerifier (and AnyCable) make it. */
function signed(name, key = STREAMS_SECRET) {
  const b64 = Buffer.from(JSON.stringify(name)).toString('base64');
  return `${b64}--${createHmac('sha256', key).update(b64).digest('hex')}`;
}

/**
 * An EventSource on `url` that records every event it gets (`welcome`,
 * `confirm_subscription`, `ping`, messages) and its errors; `cookie`
 * goes with every request (reconnections too): the app of the first
 * group connects only clients with a user in it.
 */
function source(url, { cookie = 'user=sse' } = {}) {
  const events = [];
  const errors = [];
  const es = new EventSource(url, {
    fetch: (input, init) =>
      fetch(input, { ...init, headers: { ...init.headers, ...(cookie ? { cookie } : {}) } }),
  });
  for (const type of ['welcome', 'confirm_subscription', 'ping', 'disconnect', 'message']) {
    es.addEventListener(type, (e) => events.push({ type, data: JSON.parse(e.data), id: e.lastEventId }));
  }
  es.addEventListener('error', (e) => errors.push(e));
  const messages = () => events.filter((e) => e.type === 'message');
  return {
    es,
    events,
    errors,
    messages,
    confirmed: () => until(() => events.some((e) => e.type === 'confirm_subscription'), 'confirm_subscription'),
    close: () => es.close(),
  };
}

const broadcast = (h, stream, data) =>
  fetch(`${h.base}/_broadcast`, { method: 'POST', body: JSON.stringify({ stream, data: JSON.stringify(data) }) }).then(
    (r) => assert.equal(r.status, 201),
  );

describe('Server-Sent Events on one node', () => {
  let herald;
  let rpc;
  let chat;
  const sources = [];
  const open = (path, opts) => {
    const s = source(`${herald.base}${path}`, opts);
    sources.push(s);
    return s;
  };

  before(async () => {
    chat = chatApp();
    rpc = await httpRpcServer(chat.app);
    herald = await startHerald({
      rpc: {
        host: rpc.url,
        sse: true,
        public_streams: true,
        streams_secret: STREAMS_SECRET,
        turbo_streams: true,
        turbo_streams_secret: TURBO_SECRET,
      },
    });
    chat.setBroadcast(`${herald.base}/_broadcast`);
  });

  after(async () => {
    for (const s of sources) s.close();
    await herald?.stop();
    await rpc?.close();
  });

  test('a public stream: welcome, confirmation, then messages with their position as id', async () => {
    const s = open('/events?stream=news');
    await s.confirmed();
    assert.equal(s.events[0].type, 'welcome');
    assert.deepEqual(s.events[1].data, {
      type: 'confirm_subscription',
      identifier: JSON.stringify({ channel: '$pubsub', stream_name: 'news' }),
    });
    await broadcast(herald, 'news', { n: 1 });
    await broadcast(herald, 'news', { n: 2 });
    await until(() => s.messages().length === 2, 'two messages');
    // GET clients get the message alone, as AnyCable sends them.
    assert.deepEqual(
      s.messages().map((m) => m.data),
      [{ n: 1 }, { n: 2 }],
    );
    const [a, b] = s.messages().map((m) => m.id.split('/'));
    assert.deepEqual([a[0], a[1], b[0], b[1]], ['1', 'news', '2', 'news']);
    assert.ok(a[2] && a[2] === b[2], 'one epoch');
    assert.equal(await metric(herald, 'herald_connections'), 1, 'the stream counts as a connection');
  });

  test('pings keep the stream alive', async () => {
    const s = open('/events?stream=quiet');
    await s.confirmed();
    await until(() => s.events.some((e) => e.type === 'ping'), 'a ping', 5000);
    assert.equal(typeof s.events.find((e) => e.type === 'ping').data.message, 'number');
  });

  test('a signed stream; a bad signature is 401 and EventSource stops', async () => {
    const s = open(`/events?signed_stream=${encodeURIComponent(signed('private:7'))}`);
    await s.confirmed();
    await broadcast(herald, 'private:7', { secret: true });
    await until(() => s.messages().length === 1, 'the message');
    assert.deepEqual(s.messages()[0].data, { secret: true });

    const res = await fetch(`${herald.base}/events?signed_stream=${encodeURIComponent(signed('private:7', 'wrong'))}`);
    assert.equal(res.status, 401);
    const bad = open(`/events?signed_stream=${encodeURIComponent(signed('private:7', 'wrong'))}`);
    await until(() => bad.errors.length > 0, 'an error');
    assert.equal(bad.es.readyState, EventSource.CLOSED);
  });

  test('a Turbo stream (turbo_signed_stream_name), verified with the Turbo secret', async () => {
    const s = open(`/events?turbo_signed_stream_name=${encodeURIComponent(signed('board:1', TURBO_SECRET))}`);
    await s.confirmed();
    assert.equal(JSON.parse(s.events[1].data.identifier).channel, 'Turbo::StreamsChannel');
    await broadcast(herald, 'board:1', '<turbo-stream action="append" target="b"></turbo-stream>');
    await until(() => s.messages().length === 1, 'the turbo stream');
    assert.equal(s.messages()[0].data, '<turbo-stream action="append" target="b"></turbo-stream>');
    assert.match(s.messages()[0].id, /^1\/board:1\//);
    // Signed with the streams secret, not Turbo's: rejected.
    const res = await fetch(
      `${herald.base}/events?turbo_signed_stream_name=${encodeURIComponent(signed('board:1'))}`,
      { headers: { cookie: 'user=sse' } },
    );
    assert.equal(res.status, 401);
  });

  test('an Action Cable channel over RPC: Connect with the cookie, Command subscribe, Disconnect when it goes', async () => {
    const identifier = JSON.stringify({ channel: 'ChatChannel', room: 'sse' });
    const s = open(`/events?identifier=${encodeURIComponent(identifier)}`, { cookie: 'user=eve' });
    await s.confirmed();
    const sub = chat.calls.command.find((c) => c.command === 'subscribe' && c.identifier === identifier);
    assert.ok(sub, 'the app was asked to subscribe');
    await broadcast(herald, 'room:sse', { text: 'hi' });
    await until(() => s.messages().length === 1, 'the broadcast');
    assert.deepEqual(s.messages()[0].data, { text: 'hi' });
    const before = chat.calls.disconnect.length;
    s.close();
    await until(() => chat.calls.disconnect.length > before, 'the Disconnect call');
    assert.match(JSON.stringify(chat.calls.disconnect.at(-1).identifiers), /eve/);

    // `channel` names a channel without parameters; a rejected subscription and
    // an unauthorized client are 401.
    const rejected = await fetch(
      `${herald.base}/events?identifier=${encodeURIComponent(JSON.stringify({ channel: 'ChatChannel', room: 'secret' }))}`,
      { headers: { cookie: 'user=eve' } },
    );
    assert.equal(rejected.status, 401);
    const anonymous = await fetch(`${herald.base}/events?identifier=${encodeURIComponent(identifier)}`);
    assert.equal(anonymous.status, 401);
  });

  test('bad requests are 400 with a reason', async () => {
    for (const q of ['', '?identifier=nope', '?stream=', '?stream=a&history_since=soon']) {
      const res = await fetch(`${herald.base}/events${q}`);
      assert.equal(res.status, 400, q);
      assert.ok((await res.text()).length > 0);
    }
  });

  test('history_since replays what the stream kept', async () => {
    await broadcast(herald, 'kept', { n: 1 });
    await broadcast(herald, 'kept', { n: 2 });
    // Nobody followed `kept` when those went out: no history. Follow it, publish, then ask.
    const first = open('/events?stream=kept');
    await first.confirmed();
    await broadcast(herald, 'kept', { n: 3 });
    await until(() => first.messages().length === 1, 'the live message');
    const since = Math.floor(Date.now() / 1000) - 60;
    const s = open(`/events?stream=kept&history_since=${since}`);
    await until(() => s.messages().length === 1, 'the kept message');
    assert.deepEqual(s.messages()[0].data, { n: 3 });
    assert.equal(s.messages()[0].id, first.messages()[0].id, 'the same position');
  });

  test('cut off, EventSource reconnects with Last-Event-ID and gets exactly what it missed', async () => {
    const lb = await balancer(herald);
    try {
      const s = source(`http://127.0.0.1:${lb.port}/events?stream=resume`);
      sources.push(s);
      await s.confirmed();
      await broadcast(herald, 'resume', { n: 1 });
      await until(() => s.messages().length === 1, 'message 1');
      lb.cut();
      for (let n = 2; n <= 5; n++) await broadcast(herald, 'resume', { n });
      await until(() => s.messages().length === 5, 'messages 2-5 after the reconnect', 15000);
      await broadcast(herald, 'resume', { n: 6 });
      await until(() => s.messages().length === 6, 'message 6');
      assert.deepEqual(
        s.messages().map((m) => m.data.n),
        [1, 2, 3, 4, 5, 6],
      );
      assert.equal(s.events.filter((e) => e.type === 'welcome').length, 2, 'it did reconnect');
      assert.ok((await metric(herald, 'herald_sse_resumes_total')) >= 1);
    } finally {
      lb.close();
    }
  });
});

describe('Server-Sent Events in headless Chromium', () => {
  const CHROMIUM = process.env.CHROMIUM_PATH ?? ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find(existsSync);
  let herald;
  let browser;

  before(async () => {
    assert.ok(CHROMIUM, "Chromium not found: install Debian's `chromium` or set CHROMIUM_PATH");
    const { chromium } = await import('playwright-core');
    herald = await startHerald({ rpc: { sse: true, public_streams: true } });
    browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
  });

  after(async () => {
    await browser?.close();
    await herald?.stop();
  });

  test("the browser's EventSource subscribes, receives, and resumes with Last-Event-ID", async () => {
    const lb = await balancer(herald);
    try {
      const page = await browser.newPage();
      const origin = `http://127.0.0.1:${lb.port}`;
      await page.goto(`${origin}/ready`);
      await page.evaluate(() => {
        window.got = [];
        window.confirmed = false;
        const es = new EventSource('/events?stream=browser');
        es.addEventListener('confirm_subscription', () => (window.confirmed = true));
        es.onmessage = (e) => window.got.push({ n: JSON.parse(e.data).n, id: e.lastEventId });
      });
      await page.waitForFunction(() => window.confirmed, null, { timeout: 5000 });
      await broadcast(herald, 'browser', { n: 1 });
      await page.waitForFunction(() => window.got.length === 1, null, { timeout: 5000 });
      lb.cut();
      await broadcast(herald, 'browser', { n: 2 });
      await broadcast(herald, 'browser', { n: 3 });
      await page.waitForFunction(() => window.got.length === 3, null, { timeout: 15000 });
      const got = await page.evaluate(() => window.got);
      assert.deepEqual(
        got.map((g) => g.n),
        [1, 2, 3],
      );
      assert.match(got[2].id, /^3\/browser\/.+/);
    } finally {
      lb.close();
    }
  });
});

/** A broker server for the cluster test: redis-server, or nats-server with JetStream. */
async function startBroker(kind) {
  const port = await freePort();
  if (kind === 'redis') {
    const args = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'];
    const child = await startServer('redis-server', args, port);
    return { url: `redis://127.0.0.1:${port}`, stop: () => child.kill('SIGKILL') };
  }
  const store = mkdtempSync(join(tmpdir(), 'herald-sse-js-'));
  const child = await startServer('nats-server', ['-a', '127.0.0.1', '-p', String(port), '-js', '-sd', store], port);
  return {
    url: `nats://127.0.0.1:${port}`,
    stop: () => {
      child.kill('SIGKILL');
      rmSync(store, { recursive: true, force: true });
    },
  };
}

for (const kind of ['redis', 'nats']) {
  describe(`Server-Sent Events on a ${kind} cluster`, () => {
    test('an EventSource cut off from one node resumes on another with Last-Event-ID', async () => {
      const broker = await startBroker(kind);
      const nodes = [];
      let lb = null;
      let s = null;
      try {
        for (let i = 0; i < 2; i++) {
          nodes.push(
            await startHerald({
              'broker.url': broker.url,
              'broker.prefix': 'sse',
              rpc: { sse: true, public_streams: true },
            }),
          );
        }
        for (const h of nodes) {
          await until(async () => (await fetch(`${h.base}/ready`)).status === 200, '/ready', 10000);
        }
        lb = await balancer(nodes[0]);
        s = source(`http://127.0.0.1:${lb.port}/events?stream=orders`);
        await s.confirmed();
        // The stream is reliable on the server once confirmed: publish from the other node.
        await broadcast(nodes[1], 'orders', { n: 1 });
        await until(() => s.messages().length === 1, 'message 1 from the other node');
        // Node 0 drops out of the balancer; the client's next connection reaches node 1.
        lb.route(nodes[1]);
        lb.cut();
        for (let n = 2; n <= 4; n++) await broadcast(nodes[n % 2], 'orders', { n });
        await until(() => s.messages().length === 4, 'messages 2-4 on node 1', 15000);
        await broadcast(nodes[0], 'orders', { n: 5 });
        await until(() => s.messages().length === 5, 'message 5');
        assert.deepEqual(
          s.messages().map((m) => m.data.n),
          [1, 2, 3, 4, 5],
        );
        const offsets = s.messages().map((m) => Number(m.id.split('/')[0]));
        assert.deepEqual(offsets, [1, 2, 3, 4, 5], 'positions from the shared history');
        assert.equal(await metric(nodes[1], 'herald_sse_resumes_total'), 1, 'node 1 resumed it');
      } finally {
        s?.close();
        lb?.close();
        for (const h of nodes) await h.stop();
        broker.stop();
      }
    });
  });
}
