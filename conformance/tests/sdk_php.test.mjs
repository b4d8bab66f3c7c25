// Webhooks from a real herald to a PHP endpoint under PHP's own web server
// (Debian's php-cli), checked as Pusher's PHP SDK (pusher/pusher-php-server)
// checks them: the headers from getallheaders() read by their exact names
// `X-Pusher-Key` and `X-Pusher-Signature`, then the HMAC of the raw body. The
// SDK itself cannot be fetched on this project's machines (Packagist and its
// repository are out of reach): conformance/sdks/php/webhook.php does its check.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createHmac } from 'node:crypto';
import http from 'node:http';
import { fileURLToPath } from 'node:url';
import { startHerald, freePort, once, waitFor } from '../lib/herald.mjs';
import { channelAuth } from '../lib/raw.mjs';
import { SDK_APP } from '../lib/sdk.mjs';

const ENDPOINT = fileURLToPath(new URL('../sdks/php/webhook.php', import.meta.url));

let h;
let php;
let phpPort;
const hooks = [];
let waiters = [];

/** The first webhook verdict for which `pred` holds, received or still to come. */
function verdict(pred, what) {
  return waitFor(`the PHP endpoint's verdict on ${what}`, (resolve) => {
    const look = () => {
      const found = hooks.find(pred);
      if (found) resolve(found);
    };
    waiters.push(look);
    look();
  });
}

before(async () => {
  phpPort = await freePort();
  php = spawn('php', ['-S', `127.0.0.1:${phpPort}`, ENDPOINT], {
    env: { ...process.env, APP_KEY: SDK_APP.key, APP_SECRET: SDK_APP.secret },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  process.on('exit', () => php.kill('SIGKILL'));
  let stdout = '';
  php.stdout.setEncoding('utf8');
  php.stdout.on('data', (chunk) => {
    stdout += chunk;
    let nl;
    while ((nl = stdout.indexOf('\n')) >= 0) {
      const line = stdout.slice(0, nl);
      stdout = stdout.slice(nl + 1);
      if (line.startsWith('{')) hooks.push(JSON.parse(line).webhook);
      for (const w of waiters) w();
    }
  });
  await waitFor('PHP\'s web server to start (is php-cli installed?)', (resolve, reject) => {
    php.on('error', reject);
    php.stderr.on('data', (d) => String(d).includes('started') && resolve());
  });
  h = await startHerald({
    webhook_batch_ms: 50,
    webhook_leave_delay_ms: 0,
    apps: [
      {
        ...SDK_APP,
        webhooks: [
          {
            url: `http://127.0.0.1:${phpPort}/pusher/webhooks`,
            event_types: ['channel_occupied', 'channel_vacated', 'member_added', 'member_removed'],
          },
        ],
      },
    ],
  });
});
after(async () => {
  await h?.stop();
  php?.kill('SIGTERM');
});

test('herald\'s webhooks pass the PHP SDK\'s check of getallheaders()', async () => {
  const c = h.client({ channelAuthorization: channelAuth(h.server(SDK_APP), () => ({ user_id: 'php-user', user_info: {} })) }, SDK_APP);
  await once(c.subscribe('presence-php'), 'pusher:subscription_succeeded');
  const has = (pred) => (w) => w.events.some(pred);
  await verdict(has((e) => e.name === 'channel_occupied' && e.channel === 'presence-php'), 'channel_occupied');
  await verdict(has((e) => e.name === 'member_added' && e.user_id === 'php-user'), 'member_added');
  c.disconnect();
  await verdict(has((e) => e.name === 'channel_vacated' && e.channel === 'presence-php'), 'channel_vacated');
  for (const hook of hooks) {
    assert.equal(hook.valid, true, `valid: ${JSON.stringify(hook)}`);
    assert.equal(hook.tampered_valid, false, 'the same webhook with its body changed is refused');
    assert.ok(hook.header_names.includes('X-Pusher-Key'), `getallheaders() has X-Pusher-Key: ${hook.header_names}`);
    assert.ok(hook.header_names.includes('X-Pusher-Signature'), `getallheaders() has X-Pusher-Signature`);
  }
});

test('the same check refuses a correctly signed webhook whose headers are in lower case', async () => {
  // What a sender with lower-case header names meets: getallheaders() keeps
  // them so, and the SDK's exact-name read finds no key.
  const body = JSON.stringify({ time_ms: Date.now(), events: [{ name: 'channel_occupied', channel: 'lower-case' }] });
  const signature = createHmac('sha256', SDK_APP.secret).update(body).digest('hex');
  const sent = new Promise((resolve, reject) => {
    const req = http.request(
      {
        host: '127.0.0.1',
        port: phpPort,
        method: 'POST',
        path: '/pusher/webhooks',
        headers: { 'content-type': 'application/json', 'x-pusher-key': SDK_APP.key, 'x-pusher-signature': signature },
      },
      (res) => {
        res.resume();
        resolve(res.statusCode);
      },
    );
    req.on('error', reject);
    req.end(body);
  });
  assert.equal(await sent, 401);
  const hook = await verdict((w) => w.header_names.includes('x-pusher-key'), 'the lower-case webhook');
  assert.equal(hook.valid, false);
  assert.match(hook.why, /X-Pusher-Key null/);
});
