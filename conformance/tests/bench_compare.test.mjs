// `herald bench compare` end to end: two real servers, one short `fanout`
// run against each with --json and --label, then the comparison's text
// table and its HTML page, opened in headless Chromium (Debian's
// `chromium`, driven by playwright-core), where each server's series must
// be drawn on the shared charts. Runs of different settings are refused.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';
import { BIN, startHerald } from '../lib/herald.mjs';

const CHROMIUM = process.env.CHROMIUM_PATH ?? ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find(existsSync);
const DIR = mkdtempSync(join(tmpdir(), 'herald-compare-'));

/** `herald ARGS`, bounded; resolves to { code, stdout, stderr }. */
function herald(args, ms = 50000) {
  return new Promise((resolve) => {
    execFile(BIN, args, { timeout: ms }, (err, stdout, stderr) =>
      resolve({ code: err ? (err.code ?? 1) : 0, stdout, stderr }),
    );
  });
}

const servers = [];
let browser;
before(async () => {
  assert.ok(CHROMIUM, "Chromium not found: install Debian's `chromium` (scripts/test does) or set CHROMIUM_PATH");
  servers.push(await startHerald(), await startHerald());
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
});
after(async () => {
  await browser?.close();
  for (const s of servers) await s.stop();
});

test('two servers side by side: the table and the page show both', { timeout: 120000 }, async () => {
  const files = [];
  for (const [i, s] of servers.entries()) {
    const json = join(DIR, `run-${i}.json`);
    const r = await herald([
      'bench', 'fanout', '--url', `ws://127.0.0.1:${s.port}`, '--clients', '20', '--channels', '2',
      '--publishers', '2', '--rate', '40', '--duration', '2s', '--drain', '2s', '--no-progress',
      '--server-pid', String(s.child.pid), '--label', `server-${i}`, '--json', json,
    ]);
    assert.equal(r.code, 0, r.stderr + r.stdout);
    const report = JSON.parse(readFileSync(json, 'utf8'));
    assert.equal(report.label, `server-${i}`);
    assert.ok(report.histograms?.message_latency, 'the report carries its latency histogram');
    files.push(json);
  }

  const page = join(DIR, 'compare.html');
  const r = await herald(['bench', 'compare', ...files, '--html', page]);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /\| figure \| server-0 \| server-1 \| server-1 \/ server-0 \|/);
  assert.match(r.stdout, /\| server_cpu_per_delivery \(µs\) \| [0-9.]+ \| [0-9.]+ \| [0-9.]+× \|/);
  assert.match(r.stdout, /\| deliveries_lost \| 0 \| 0 \|/);

  const tab = await browser.newPage();
  const errors = [];
  tab.on('pageerror', (e) => errors.push(String(e)));
  await tab.goto(`file://${page}`);
  for (const server of ['server-0', 'server-1']) {
    for (const chart of ['percentiles-message_latency', 'histogram-message_latency', 'timeline-received']) {
      const n = await tab.locator(`#${chart} polyline.series[data-server="${server}"]`).count();
      assert.equal(n, 1, `${server}'s series on ${chart}`);
    }
    const points = await tab.getAttribute(`#percentiles-message_latency polyline[data-server="${server}"]`, 'points');
    assert.ok(points.trim().split(/\s+/).length >= 5, `${server}: a percentile curve, got "${points}"`);
    assert.equal(await tab.locator(`#figures th[data-server="${server}"]`).count(), 1);
  }
  assert.deepEqual(errors, []);
  await tab.close();
});

test('runs of different settings are refused, naming the setting', async () => {
  const a = JSON.parse(readFileSync(join(DIR, 'run-0.json'), 'utf8'));
  const other = join(DIR, 'other.json');
  writeFileSync(other, JSON.stringify({ ...a, label: 'other', params: { ...a.params, subscribers: '9999' } }));
  const r = await herald(['bench', 'compare', join(DIR, 'run-0.json'), other]);
  assert.equal(r.code, 2, r.stdout);
  assert.match(r.stderr, /subscribers: .*run-0\.json = 20, .*other\.json = 9999/);
  const idle = join(DIR, 'idle.json');
  writeFileSync(idle, JSON.stringify({ ...a, label: 'other', scenario: 'idle' }));
  const s = await herald(['bench', 'compare', join(DIR, 'run-0.json'), idle]);
  assert.equal(s.code, 2);
  assert.match(s.stderr, /run-0\.json ran `fanout` and .*idle\.json ran `idle`/);
});
