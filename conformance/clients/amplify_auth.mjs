// aws-amplify's Events client (6.x) with each authMode it has, configured
// offline: Cognito/OIDC tokens from a token provider and IAM credentials from
// a credentials provider (Amplify's documented custom providers), so no
// Cognito or STS is called. Run by tests/appsync_auth.test.mjs in its own
// process (Node reads NODE_EXTRA_CA_CERTS only at start).
//
// AUTH_MODE: userPool | oidc | lambda | iam | apiKey. EXPECT: ok (connect,
// subscribe, publish over WebSocket and HTTPS, receive both) or refused
// (connect fails with UnauthorizedException, fast). Exits 0 on success.
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { Amplify } from 'aws-amplify';
import { decodeJWT } from 'aws-amplify/auth';
import { events } from 'aws-amplify/data';

globalThis.WebSocket ??= WebSocket;

const mode = process.env.AUTH_MODE;
const token = process.env.AUTH_TOKEN ?? '';
const channelName = process.env.CHANNEL ?? 'default/auth';
const TIMEOUT = 10000;

Amplify.configure(
  {
    API: {
      Events: {
        endpoint: `https://127.0.0.1:${process.env.HERALD_PORT}/event`,
        region: 'us-east-1',
        defaultAuthMode: mode,
        apiKey: process.env.API_KEY,
      },
    },
  },
  {
    Auth: {
      tokenProvider: {
        async getTokens() {
          return token && (mode === 'userPool' || mode === 'oidc') ? { accessToken: decodeJWT(token) } : null;
        },
      },
      credentialsProvider: {
        async getCredentialsAndIdentityId() {
          if (mode !== 'iam') return undefined;
          return {
            credentials: {
              accessKeyId: process.env.AWS_KEY_ID,
              secretAccessKey: process.env.AWS_SECRET,
            },
          };
        },
        async clearCredentialsAndIdentityId() {},
      },
    },
  },
);

// Lambda tokens travel as options of each call, as Amplify's docs show.
const options = mode === 'lambda' ? { authMode: 'lambda', authToken: token } : undefined;

const withTimeout = (p, what) =>
  Promise.race([p, new Promise((_, reject) => setTimeout(() => reject(new Error(`timed out: ${what}`)), TIMEOUT))]);

async function roundtrip() {
  const channel = await withTimeout(events.connect(channelName, options), 'events.connect');
  const got = [];
  const waiters = [];
  const errors = [];
  const sub = channel.subscribe({
    next: (d) => (waiters.length ? waiters.shift()(d) : got.push(d)),
    error: (e) => errors.push(e),
  });
  await withTimeout(sub.ready, 'subscribe_success');
  const next = () =>
    got.length ? Promise.resolve(got.shift()) : withTimeout(new Promise((r) => waiters.push(r)), 'an event');
  await withTimeout(channel.publish({ mode, over: 'websocket' }, options), 'channel.publish');
  assert.deepEqual((await next()).event, { mode, over: 'websocket' });
  const failed = await withTimeout(events.post(channelName, { mode, over: 'http' }, options), 'events.post');
  assert.equal(failed, undefined, `no failed events: ${JSON.stringify(failed)}`);
  assert.deepEqual((await next()).event, { mode, over: 'http' });
  assert.deepEqual(errors, []);
  sub.unsubscribe();
  channel.close();
}

async function refused() {
  const started = Date.now();
  await assert.rejects(withTimeout(events.connect(channelName, options), 'events.connect'), /UnauthorizedException/);
  assert.ok(Date.now() - started < 5000, 'refused without retrying');
  // HTTPS publish is refused too (Amplify throws on the 401).
  await assert.rejects(withTimeout(events.post(channelName, { x: 1 }, options), 'events.post'), /Unauthorized/);
}

try {
  if (process.env.EXPECT === 'refused') await refused();
  else await roundtrip();
  console.log('OK');
  process.exit(0);
} catch (e) {
  console.error('FAILED:', e?.stack ?? e, JSON.stringify(e));
  process.exit(1);
}
