// Turbo Streams and CableReady without RPC: Hotwire's own
// <turbo-cable-stream-source> (@hotwired/turbo-rails) in headless Chromium,
// and @rails/actioncable in Node, subscribing with names signed as Rails'
// MessageVerifier signs them (made here), against a herald with no RPC
// server; AnyCable's settings (ANYCABLE_TURBO_STREAMS, ...) and Herald's.
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import http from 'node:http';
import { createRequire } from 'node:module';
import { chromium } from 'playwright-core';
import { startHerald, within, http as fetchBounded } from '../lib/herald.mjs';
import { chatApp, httpRpcServer, consumer, subscribe, rawCable } from '../lib/cable.mjs';

const CHROMIUM = process.env.CHROMIUM_PATH ?? ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find(existsSync);

/** Rails' MessageVerifier (serializer JSON, digest SHA256): base64 JSON, "--", hex HMAC. */
function signed(key, name) {
  const data = Buffer.from(JSON.stringify(name)).toString('base64');
  return `${data}--${createHmac('sha256', key).update(data).digest('hex')}`;
}
const turbo = (name) => ({ channel: 'Turbo::StreamsChannel', signed_stream_name: name });
const cableReady = (id) => ({ channel: 'CableReady::Stream', identifier: id });

async function broadcast(herald, stream, data, key = 'bkey') {
  const r = await fetchBounded(`${herald.base}/_broadcast`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ stream, data: JSON.stringify(data) }),
  });
  assert.equal(r.status, 201);
}

/** Whether subscribing `params` is rejected (true) or confirmed (false). */
async function rejected(herald, params) {
  const c = consumer(herald);
  try {
    await subscribe(c, params);
    return false;
  } catch (e) {
    if (e.rejected) return true;
    throw e;
  } finally {
    c.disconnect();
  }
}

describe('Turbo Streams and CableReady with Herald\'s settings, no RPC', () => {
  let herald;
  before(async () => {
    herald = await startHerald({
      rpc: {
        broadcast_key: 'bkey',
        streams_secret: 'streams-key',
        turbo_streams: true,
        turbo_streams_secret: 'turbo-key',
        cable_ready_streams: true,
      },
    });
  });
  after(async () => herald?.stop());

  test('@rails/actioncable: a signed Turbo stream is confirmed and gets broadcasts', async () => {
    const c = consumer(herald);
    try {
      const s = await subscribe(c, turbo(signed('turbo-key', 'gid://app/Room/1:messages')));
      await broadcast(herald, 'gid://app/Room/1:messages', '<turbo-stream action="append" target="m"></turbo-stream>');
      assert.equal(await s.next(), '<turbo-stream action="append" target="m"></turbo-stream>');
    } finally {
      c.disconnect();
    }
  });

  test('forged, re-keyed, tampered and missing names are rejected', async () => {
    const good = signed('turbo-key', 'room');
    const [data, digest] = good.split('--');
    const flipped = digest.replace(/^./, (ch) => (ch === '0' ? '1' : '0'));
    for (const name of [
      signed('streams-key', 'room'), // the signed streams' key: Turbo has its own
      signed('wrong', 'room'),
      `${Buffer.from('"other"').toString('base64')}--${digest}`, // another name, the old digest
      `${data}--${flipped}`,
      data,
      '',
    ]) {
      assert.equal(await rejected(herald, turbo(name)), true, `rejected: ${name}`);
    }
    assert.equal(await rejected(herald, { channel: 'Turbo::StreamsChannel' }), true);
  });

  test('CableReady: its identifier, signed with the streams key by default', async () => {
    assert.equal(await rejected(herald, cableReady(signed('turbo-key', 'cr'))), true);
    const c = consumer(herald);
    try {
      const s = await subscribe(c, cableReady(signed('streams-key', 'visitors')));
      await broadcast(herald, 'visitors', { cableReady: true, operations: [{ operation: 'consoleLog' }] });
      assert.deepEqual(await s.next(), { cableReady: true, operations: [{ operation: 'consoleLog' }] });
    } finally {
      c.disconnect();
    }
  });

  test('actioncable-v1-ext-json: positions on Turbo broadcasts, and history on resubscribe', async () => {
    const id = JSON.stringify(turbo(signed('turbo-key', 'reliable')));
    const a = await rawCable(herald, { protocols: ['actioncable-v1-ext-json'] });
    assert.equal((await a.next()).type, 'welcome');
    a.send({ command: 'subscribe', identifier: id });
    assert.deepEqual(await a.next(), { identifier: id, type: 'confirm_subscription' });
    await broadcast(herald, 'reliable', 'one');
    const m = await a.next();
    assert.equal(m.message, 'one');
    assert.equal(m.stream_id, 'reliable');
    assert.equal(m.offset, 1);
    assert.equal(typeof m.epoch, 'string');
    a.close();
    await broadcast(herald, 'reliable', 'two');
    // A new client asks for what it missed since that position.
    const b = await rawCable(herald, { protocols: ['actioncable-v1-ext-json'] });
    assert.equal((await b.next()).type, 'welcome');
    b.send({
      command: 'subscribe',
      identifier: id,
      history: { streams: { reliable: { epoch: m.epoch, offset: 1 } } },
    });
    const frames = [await b.next(), await b.next(), await b.next()];
    assert.deepEqual(
      frames.map((f) => f.type ?? f.message),
      ['confirm_subscription', 'two', 'confirm_history'],
    );
    assert.equal(frames[1].offset, 2);
    b.close();
  });
});

describe('AnyCable\'s settings', () => {
  test('ANYCABLE_TURBO_STREAMS with ANYCABLE_SECRET: the Turbo key defaults to it', async () => {
    const herald = await startHerald({}, { env: { ANYCABLE_TURBO_STREAMS: 'true', ANYCABLE_SECRET: 'app-s3cret' } });
    try {
      assert.equal(await rejected(herald, turbo(signed('app-s3cret', 'a'))), false);
      assert.equal(await rejected(herald, turbo(signed('other', 'a'))), true);
      // CableReady stays off: without RPC its subscription is refused.
      assert.equal(await rejected(herald, cableReady(signed('app-s3cret', 'a'))), true);
    } finally {
      await herald.stop();
    }
  });

  test('ANYCABLE_TURBO_STREAMS_SECRET and ANYCABLE_CABLE_READY_STREAMS/_SECRET', async () => {
    const herald = await startHerald(
      {},
      {
        env: {
          ANYCABLE_SECRET: 'app-s3cret',
          ANYCABLE_TURBO_STREAMS: 'true',
          ANYCABLE_TURBO_STREAMS_SECRET: 'turbo-s3cret',
          ANYCABLE_CABLE_READY_STREAMS: 'true',
          ANYCABLE_CABLE_READY_SECRET: 'cr-s3cret',
        },
      },
    );
    try {
      assert.equal(await rejected(herald, turbo(signed('turbo-s3cret', 'a'))), false);
      assert.equal(await rejected(herald, turbo(signed('app-s3cret', 'a'))), true);
      assert.equal(await rejected(herald, cableReady(signed('cr-s3cret', 'a'))), false);
      assert.equal(await rejected(herald, cableReady(signed('turbo-s3cret', 'a'))), true);
    } finally {
      await herald.stop();
    }
  });

  test('with an RPC server, Turbo subscriptions never reach it; other channels still do', async () => {
    const chat = chatApp();
    const rpc = await httpRpcServer(chat.app);
    const herald = await startHerald(
      { rpc: { host: rpc.url } },
      { env: { ANYCABLE_TURBO_STREAMS: 'true', ANYCABLE_TURBO_STREAMS_SECRET: 't' } },
    );
    const c = consumer(herald, 'ann');
    try {
      await subscribe(c, turbo(signed('t', 'x')));
      await subscribe(c, { channel: 'ChatChannel', room: 'lobby' });
      const channels = chat.calls.command.map((m) => JSON.parse(m.identifier).channel);
      assert.ok(channels.includes('ChatChannel'));
      assert.ok(!channels.includes('Turbo::StreamsChannel'), `commands: ${channels}`);
    } finally {
      c.disconnect();
      await herald.stop();
      await rpc.close();
    }
  });
});

describe('<turbo-cable-stream-source> in Chromium', () => {
  let herald;
  let browser;
  let page_server;
  before(async () => {
    assert.ok(CHROMIUM, 'Chromium not found: install Debian\'s `chromium` (scripts/test does) or set CHROMIUM_PATH');
    herald = await startHerald({
      rpc: { broadcast_key: 'bkey', turbo_streams: true, turbo_streams_secret: 'turbo-key' },
    });
    browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
    // The page a Rails view would render (`turbo_stream_from @room`), and
    // turbo-rails' bundle (Turbo and its Action Cable consumer in one file).
    const bundle = readFileSync(
      createRequire(import.meta.url).resolve('@hotwired/turbo-rails') // its "require" entry: the bundle,
    );
    const html = (signedName) => `<!doctype html><html><head>
      <meta name="action-cable-url" content="ws://127.0.0.1:${herald.port}/cable">
      <script type="module" src="/turbo.js"></script></head><body>
      <turbo-cable-stream-source channel="Turbo::StreamsChannel" signed-stream-name="${signedName}"></turbo-cable-stream-source>
      <div id="messages"></div></body></html>`;
    page_server = http.createServer((req, res) => {
      if (req.url === '/turbo.js') {
        res.writeHead(200, { 'content-type': 'text/javascript' });
        return res.end(bundle);
      }
      const forged = req.url === '/forged';
      res.writeHead(200, { 'content-type': 'text/html' });
      res.end(html(forged ? signed('not-the-key', 'rooms:1') : signed('turbo-key', 'rooms:1')));
    });
    await new Promise((r) => page_server.listen(0, '127.0.0.1', r));
  });
  after(async () => {
    await browser?.close();
    page_server?.close();
    await herald?.stop();
  });

  test('a <turbo-stream> broadcast is applied to the page; a forged name never connects', async () => {
    const page = await browser.newPage();
    const errors = [];
    page.on('pageerror', (e) => errors.push(String(e)));
    await page.goto(`http://127.0.0.1:${page_server.address().port}/`);
    // turbo-rails marks the element `connected` on confirm_subscription.
    await page.waitForSelector('turbo-cable-stream-source[connected]', { state: 'attached', timeout: 10000 });
    await broadcast(
      herald,
      'rooms:1',
      '<turbo-stream action="append" target="messages"><template><p id="m1">hello from herald</p></template></turbo-stream>',
    );
    await page.waitForSelector('#messages #m1', { timeout: 10000 });
    assert.equal(await page.textContent('#m1'), 'hello from herald');

    const forged = await browser.newPage();
    // The server's answer to the forged page's subscribe, read off its socket.
    const refused = new Promise((resolve) =>
      forged.on('websocket', (ws) =>
        ws.on('framereceived', ({ payload }) => {
          if (String(payload).includes('"reject_subscription"')) resolve(String(payload));
        }),
      ),
    );
    await forged.goto(`http://127.0.0.1:${page_server.address().port}/forged`);
    const answer = JSON.parse(await within(refused, 'reject_subscription on the forged page', 10000));
    assert.equal(JSON.parse(answer.identifier).channel, 'Turbo::StreamsChannel');
    // A broadcast after the refusal reaches the good page only.
    await broadcast(
      herald,
      'rooms:1',
      '<turbo-stream action="append" target="messages"><template><p id="m2">second</p></template></turbo-stream>',
    );
    await page.waitForSelector('#messages #m2', { timeout: 10000 });
    assert.equal(await forged.$('turbo-cable-stream-source[connected]'), null);
    assert.equal(await forged.$('#messages p'), null);
    assert.deepEqual(errors, []);
    await page.close();
    await forged.close();
  });
});
