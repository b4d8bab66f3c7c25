// pusher-js in headless Chromium (Debian's `chromium`, driven by
// playwright-core) on a network where WebSockets are refused: the page's
// own server, which the client's wsHost points at, answers every upgrade
// with 403, as a blocking proxy does. pusher-js must fall back to herald's
// HTTP transports by itself (cross-origin: the page and herald are on
// different ports), then subscribe, receive and send.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { createRequire } from 'node:module';
import { chromium } from 'playwright-core';
import { startHerald, once, DEV_APP } from '../lib/herald.mjs';
import { channelAuth } from '../lib/raw.mjs';

const CHROMIUM = process.env.CHROMIUM_PATH ?? ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find(existsSync);
const require = createRequire(import.meta.url);
const PUSHER_JS = readFileSync(require.resolve('pusher-js/dist/web/pusher.min.js'));

let h;
let browser;
let page;
let blocked = 0;
const site = createServer((req, res) => {
  if (req.url === '/pusher.min.js') {
    res.writeHead(200, { 'content-type': 'application/javascript' });
    return res.end(PUSHER_JS);
  }
  res.writeHead(200, { 'content-type': 'text/html' });
  res.end('<!doctype html><title>fallback</title><script src="/pusher.min.js"></script>');
});
// The blocking proxy: no WebSocket gets through.
site.on('upgrade', (_req, socket) => {
  blocked++;
  socket.end('HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n');
});

before(async () => {
  assert.ok(CHROMIUM, 'Chromium not found: install Debian\'s `chromium` (scripts/test does) or set CHROMIUM_PATH');
  h = await startHerald();
  await new Promise((r) => site.listen(0, '127.0.0.1', r));
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
});
after(async () => {
  await browser?.close();
  site.close();
  await h?.stop();
});

test('pusher-js falls back from refused WebSockets to HTTP and works', async () => {
  page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(`http://127.0.0.1:${site.address().port}/`);
  const sitePort = site.address().port;
  // Channel auth signed in the test: the page asks through an exposed function.
  const auth = channelAuth(h.server(), () => ({ user_id: 'browser', user_info: {} }));
  await page.exposeFunction('signChannel', (socketId, channelName) =>
    new Promise((resolve, reject) =>
      auth.customHandler({ socketId, channelName }, (e, r) => (e ? reject(e) : resolve(r)))));
  await page.evaluate(({ key, sitePort, heraldPort }) => {
    window.got = [];
    window.p = new Pusher(key, {
      cluster: 'herald',
      wsHost: '127.0.0.1',
      wsPort: sitePort,
      httpHost: '127.0.0.1',
      httpPort: heraldPort,
      forceTLS: false,
      disableStats: true,
      channelAuthorization: {
        customHandler: ({ socketId, channelName }, cb) =>
          window.signChannel(socketId, channelName).then((r) => cb(null, r), (e) => cb(e, null)),
      },
    });
    const ch = window.p.subscribe('fallback-news');
    ch.bind('headline', (d) => window.got.push(d));
    window.priv = window.p.subscribe('private-fallback');
    window.priv.bind('client-from-node', (d) => window.got.push(d));
  }, { key: DEV_APP.key, sitePort, heraldPort: h.port });

  // Falling back takes pusher-js several seconds (its own delays).
  await page.waitForFunction(() => window.p.connection.state === 'connected', null, { timeout: 30000 });
  const transport = await page.evaluate(() => window.p.connection.connection.transport.name);
  assert.match(transport, /^xhr_(streaming|polling)$/);
  assert.ok(blocked > 0, 'pusher-js tried WebSockets first');
  await page.waitForFunction(() => window.p.channel('fallback-news').subscribed && window.priv.subscribed, null, { timeout: 10000 });

  await h.server().trigger('fallback-news', 'headline', { title: 'through the proxy' });
  await page.waitForFunction(() => window.got.length === 1, null, { timeout: 10000 });
  assert.deepEqual(await page.evaluate(() => window.got), [{ title: 'through the proxy' }]);

  // Client events both ways with a Node (WebSocket) client.
  const node = h.client({ channelAuthorization: channelAuth(h.server()) });
  const nch = node.subscribe('private-fallback');
  await once(nch, 'pusher:subscription_succeeded');
  const fromBrowser = once(nch, 'client-from-browser', 10000);
  await page.evaluate(() => window.priv.trigger('client-from-browser', { hi: 'node' }));
  assert.deepEqual(await fromBrowser, { hi: 'node' });
  nch.trigger('client-from-node', { hi: 'browser' });
  await page.waitForFunction(() => window.got.length === 2, null, { timeout: 10000 });
  assert.deepEqual((await page.evaluate(() => window.got))[1], { hi: 'browser' });
  assert.deepEqual(errors, [], 'no page errors');
  await page.evaluate(() => window.p.disconnect());
  await page.close();
});
