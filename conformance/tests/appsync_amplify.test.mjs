// aws-amplify's own AppSync clients against a real herald serving TLS with
// the test certificate (Amplify speaks only wss:// and https://): the
// Events client (events.connect, channel.subscribe, channel.publish,
// events.post) and generateClient() for the generic pub/sub GraphQL API.
// Each client runs in its own Node process (clients/amplify_appsync.mjs),
// started with NODE_EXTRA_CA_CERTS so Node trusts the test certificate.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { startHerald } from '../lib/herald.mjs';

const fixture = (name) => fileURLToPath(new URL(`../../tests/fixtures/${name}`, import.meta.url));
const client = fileURLToPath(new URL('../clients/amplify_appsync.mjs', import.meta.url));
const TLS = { tls_cert: fixture('tls-test-cert.pem'), tls_key: fixture('tls-test-key.pem') };

/** Run the Amplify client `which` against `h`; resolves with its output. */
function runClient(h, which, env = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [client, which], {
      env: { ...process.env, HERALD_PORT: String(h.port), NODE_EXTRA_CA_CERTS: fixture('tls-test-cert.pem'), ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (out += d));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`amplify client ${which} timed out:\n${out}`));
    }, 45000);
    child.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code, out });
    });
  });
}

async function withHerald(config, fn) {
  const h = await startHerald({ ...TLS, ...config });
  try {
    await fn(h);
  } finally {
    await h.stop();
  }
}

test('Amplify Events client: connect, subscribe (exact and wildcard), publish over WebSocket and HTTPS, errors', async () => {
  await withHerald({}, async (h) => {
    const { code, out } = await runClient(h, 'events');
    assert.equal(code, 0, out);
  });
});

test('Amplify GraphQL client: subscribe(name) and the publish mutation, a GraphQL error', async () => {
  await withHerald({}, async (h) => {
    const { code, out } = await runClient(h, 'graphql');
    assert.equal(code, 0, out);
  });
});

test('Amplify with a configured API key, and with a wrong one', async () => {
  const app = { id: 'amp', key: 'amp-key', secret: 'amp-secret', api_keys: ['da2-configured'] };
  await withHerald({ apps: [app] }, async (h) => {
    const ok = await runClient(h, 'events', { HERALD_API_KEY: 'da2-configured' });
    assert.equal(ok.code, 0, ok.out);
    const bad = await runClient(h, 'bad-key', { HERALD_API_KEY: 'app-key' });
    assert.equal(bad.code, 0, bad.out);
  });
});
