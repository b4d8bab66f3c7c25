// permessage-deflate (RFC 7692) with real clients: the `ws` package (which
// offers deflate by default), an AppSync Events subscriber over `ws` (its
// frames carry a per-subscriber id ahead of the shared compressed
// payload), and headless Chromium (Debian's `chromium`, driven by
// playwright-core), by hand and through pusher-js's browser build. Each
// negotiates the extension, sends compressed messages of its own, and gets
// a 2 KiB event compressed on the wire and whole once inflated. pusher-js
// in Node speaks through faye-websocket, which offers no extension: it is
// served plain frames, unchanged.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import WebSocket from 'ws';
import { chromium } from 'playwright-core';
import { startHerald, DEV_APP, once, within } from '../lib/herald.mjs';
import { rawClient } from '../lib/raw.mjs';

const CHROMIUM = process.env.CHROMIUM_PATH ?? ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find(existsSync);
const KEY = 'da2-deflate';
const ANSWER = 'permessage-deflate; server_no_context_takeover; client_no_context_takeover';

let h;
let off;
before(async () => {
  h = await startHerald({ apps: [{ ...DEV_APP, api_keys: [KEY] }] });
  off = await startHerald({ websocket_compression: false });
});
after(async () => {
  await h?.stop();
  await off?.stop();
});

/** A 2 KiB order-like JSON event. */
function order(n = 24) {
  const items = Array.from({ length: n }, (_, i) => ({
    sku: `SKU-${String((i * 7919) % 100000).padStart(5, '0')}`,
    name: ['Ceramic mug', 'Milk frother', 'Paper filters (100)'][i % 3],
    quantity: 1 + (i % 4),
    unit_price: 12.5 + i,
    in_stock: i % 3 !== 0,
  }));
  return { type: 'order.updated', order: { id: 'ord_1234', status: 'paid', currency: 'EUR' }, items };
}

test('the ws package negotiates deflate; a 2 KiB event arrives compressed and whole', async () => {
  const c = rawClient(h);
  await c.opened;
  assert.equal(c.ws.extensions, 'permessage-deflate');
  await c.next('pusher:connection_established');
  // A subscribe over ws's 1 KiB threshold goes compressed: the server
  // inflates it.
  c.send({ event: 'pusher:subscribe', data: { channel: 'orders', padding: 'x'.repeat(1500) } });
  await c.next((m) => m.event === 'pusher_internal:subscription_succeeded' && m.channel === 'orders');
  const data = order();
  const plainBytes = JSON.stringify({ event: 'updated', channel: 'orders', data: JSON.stringify(data) }).length;
  assert.ok(plainBytes > 2000, `${plainBytes}`);
  const before = c.ws._socket.bytesRead;
  const got = c.next('updated');
  const res = await h.server().trigger('orders', 'updated', data);
  assert.equal(res.status, 200);
  assert.deepEqual((await got).data, data);
  const wire = c.ws._socket.bytesRead - before;
  assert.ok(wire < plainBytes * 0.35, `${wire} bytes on the wire for ${plainBytes}`);
  c.ws.close();
});

test('pusher-js in Node (faye-websocket: no offer) is served plain frames, unchanged', async () => {
  const client = h.client();
  const channel = client.subscribe('orders-js');
  await once(channel, 'pusher:subscription_succeeded');
  const socket = client.connection.connection.transport.socket;
  assert.equal(socket._driver.headers?.['sec-websocket-extensions'], undefined);
  const data = order();
  const got = once(channel, 'updated');
  await h.server().trigger('orders-js', 'updated', data);
  assert.deepEqual(await got, data);
  client.disconnect();
});

test('AppSync Events: per-subscriber ids ahead of one shared compressed payload', async () => {
  const auth = { host: `127.0.0.1:${h.port}`, 'x-api-key': KEY };
  const header = `header-${Buffer.from(JSON.stringify(auth)).toString('base64url')}`;
  const sockets = [];
  for (const id of ['sub-1', 'a-much-longer-subscription-id']) {
    const ws = new WebSocket(`ws://127.0.0.1:${h.port}/event/realtime`, ['aws-appsync-event-ws', header]);
    const messages = [];
    const arrived = [];
    ws.on('message', (d) => {
      const m = JSON.parse(d.toString());
      if (m.type === 'ka') return;
      messages.push(m);
      arrived.splice(0).forEach((r) => r());
    });
    const next = (type) =>
      within(
        (async () => {
          for (;;) {
            const i = messages.findIndex((m) => m.type === type);
            if (i >= 0) return messages.splice(i, 1)[0];
            await new Promise((r) => arrived.push(r));
          }
        })(),
        type,
      );
    await within(new Promise((r, e) => { ws.once('open', r); ws.once('error', e); }), 'open');
    assert.equal(ws.extensions, 'permessage-deflate');
    ws.send(JSON.stringify({ type: 'connection_init' }));
    await next('connection_ack');
    ws.send(JSON.stringify({ type: 'subscribe', id, channel: '/default/*', authorization: auth }));
    await next('subscribe_success');
    sockets.push({ ws, id, next });
  }
  const event = JSON.stringify(order());
  const r = await fetch(`${h.base}/event`, {
    method: 'POST',
    headers: { 'x-api-key': KEY, 'content-type': 'application/json' },
    body: JSON.stringify({ channel: '/default/orders', events: [event] }),
  });
  assert.equal(r.status, 200);
  for (const s of sockets) {
    assert.deepEqual(await s.next('data'), { type: 'data', id: s.id, event });
    s.ws.close();
  }
});

test('with websocket_compression = false nothing is negotiated', async () => {
  const c = rawClient(off);
  await c.opened;
  assert.equal(c.ws.extensions, '');
  await c.next('pusher:connection_established');
  c.ws.close();
});

test('headless Chromium negotiates deflate and receives a 2 KiB event', async () => {
  assert.ok(CHROMIUM, 'Chromium not found: install Debian\'s `chromium` (scripts/test does) or set CHROMIUM_PATH');
  const browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
  try {
    const page = await browser.newPage();
    await page.goto(`${h.base}/up`);
    const url = `ws://127.0.0.1:${h.port}/app/${DEV_APP.key}?protocol=7&client=js&version=8.4.0`;
    // The page subscribes (Chromium compresses what it sends) and waits.
    const extensions = await page.evaluate(
      (url) =>
        new Promise((resolve, reject) => {
          const ws = new WebSocket(url);
          window.received = new Promise((got) => {
            ws.onmessage = (e) => {
              const m = JSON.parse(e.data);
              if (m.event === 'pusher:connection_established') {
                ws.send(JSON.stringify({ event: 'pusher:subscribe', data: { channel: 'orders-browser' } }));
              } else if (m.event === 'pusher_internal:subscription_succeeded') {
                resolve(ws.extensions);
              } else if (m.event === 'updated') {
                got(m.data);
              }
            };
          });
          ws.onerror = () => reject(new Error('WebSocket error'));
          setTimeout(() => reject(new Error('timed out subscribing')), 5000);
        }),
      url,
    );
    assert.equal(extensions, ANSWER);
    const data = order();
    await h.server().trigger('orders-browser', 'updated', data);
    const got = await within(page.evaluate(() => window.received), 'the event in Chromium');
    assert.deepEqual(JSON.parse(got), data);

    // pusher-js's browser build in the same page: the browser's WebSocket
    // negotiates, pusher-js needs no change.
    await page.addScriptTag({ path: new URL('../node_modules/pusher-js/dist/web/pusher.min.js', import.meta.url).pathname });
    const negotiated = await page.evaluate(
      ({ key, port }) =>
        new Promise((resolve, reject) => {
          const p = new Pusher(key, { wsHost: '127.0.0.1', wsPort: port, forceTLS: false, enabledTransports: ['ws'], cluster: 'herald', disableStats: true });
          const ch = p.subscribe('orders-pusher-js');
          window.pusherReceived = new Promise((got) => ch.bind('updated', got));
          ch.bind('pusher:subscription_succeeded', () => resolve(p.connection.connection.transport.socket.extensions));
          setTimeout(() => reject(new Error('timed out subscribing with pusher-js')), 5000);
        }),
      { key: DEV_APP.key, port: h.port },
    );
    assert.equal(negotiated, ANSWER);
    await h.server().trigger('orders-pusher-js', 'updated', data);
    assert.deepEqual(await within(page.evaluate(() => window.pusherReceived), 'the event in pusher-js'), data);
  } finally {
    await browser.close();
  }
});
