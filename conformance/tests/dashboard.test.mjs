// The dashboard in headless Chromium (Debian's `chromium`, driven by
// playwright-core): sign in with the token, see a pusher-js connection and
// its channel appear, send a test event from the form and see it reach the
// pusher-js client and the debug console. Saves a screenshot.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync } from 'node:fs';
import { chromium } from 'playwright-core';
import { startHerald, once } from '../lib/herald.mjs';

const TOKEN = 'dashboard-test-token-0123456789';
const CHROMIUM = process.env.CHROMIUM_PATH ?? ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find(existsSync);
const OUT = new URL('../test-output/', import.meta.url).pathname;

let h;
let browser;
before(async () => {
  assert.ok(CHROMIUM, 'Chromium not found: install Debian\'s `chromium` (scripts/test does) or set CHROMIUM_PATH');
  h = await startHerald({ dashboard: true, dashboard_token: TOKEN });
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
});
after(async () => {
  await browser?.close();
  await h?.stop();
});

test('the API refuses a missing or wrong token', async () => {
  for (const headers of [{}, { authorization: 'Bearer wrong-token-wrong-token' }]) {
    const r = await fetch(`${h.base}/dashboard/api/stats`, { headers });
    assert.equal(r.status, 401);
    assert.match((await r.json()).error, /token/);
  }
  const ok = await fetch(`${h.base}/dashboard/api/stats`, { headers: { authorization: `Bearer ${TOKEN}` } });
  assert.equal(ok.status, 200);
});

test('live connections, channels, console and test event in Chromium', async () => {
  const page = await browser.newPage({ viewport: { width: 1280, height: 1000 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(`${h.base}/dashboard`);
  await page.fill('#token', TOKEN);
  await page.click('#login button[type=submit]');
  await page.waitForSelector('#connections');
  assert.equal(await page.textContent('#connections'), '0');
  await page.waitForFunction(() => document.querySelector('#console-status')?.textContent === 'live');

  // A pusher-js client connects and subscribes: the dashboard sees it.
  const client = h.client();
  const channel = client.subscribe('dashboard-demo');
  await once(channel, 'pusher:subscription_succeeded');
  await page.waitForFunction(() => document.querySelector('#connections')?.textContent === '1', null, { timeout: 10000 });
  await page.waitForSelector('#channels tr[data-channel="dashboard-demo"]', { timeout: 10000 });
  assert.equal(await page.textContent('#channels tr[data-channel="dashboard-demo"] .subs'), '1');
  await page.waitForSelector('#console .event[data-type="channel_occupied"][data-channel="dashboard-demo"]', { timeout: 10000 });

  // A test event from the form reaches the client and the console.
  const arrived = once(channel, 'test-event', 10000);
  await page.fill('#test-channel', 'dashboard-demo');
  await page.fill('#test-event', 'test-event');
  await page.fill('#test-data', '{"hello":"dashboard"}');
  await page.click('#test-send');
  assert.deepEqual(await arrived, { hello: 'dashboard' });
  await page.waitForSelector('#test-result');
  assert.match(await page.textContent('#test-result'), /Sent test-event/);
  await page.waitForSelector('#console .event[data-type="event"][data-channel="dashboard-demo"]', { timeout: 10000 });
  assert.match(await page.textContent('#console .event[data-type="event"]'), /hello/);
  // Let the charts draw a few points before the picture.
  await page.waitForFunction(() => document.querySelectorAll('#chart-connections canvas').length > 0);
  await page.waitForTimeout(2500);
  mkdirSync(OUT, { recursive: true });
  await page.screenshot({ path: `${OUT}dashboard.png`, fullPage: true });
  assert.deepEqual(errors, [], 'no page errors');
  await page.close();
});
