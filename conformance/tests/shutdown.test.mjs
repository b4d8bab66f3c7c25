// Graceful shutdown on SIGTERM: every client gets pusher:error 4200 and a
// close with 4200, /ready answers 503 while draining, new sockets are
// refused, and the process exits 0.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import WebSocket from 'ws';
import { startHerald, once, http, waitFor, DEV_APP } from '../lib/herald.mjs';
import { QUERY, rawClient } from '../lib/raw.mjs';

/**
 * A client that completes the WebSocket upgrade and then never reads or
 * answers anything: it holds its connection open until herald gives up.
 */
function stubbornClient(h) {
  return waitFor('the stubborn client to be established', (resolve, reject) => {
    const sock = net.connect(h.port, '127.0.0.1', () => {
      sock.write(
        `GET /app/${DEV_APP.key}?${QUERY} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n` +
          `Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n`,
      );
    });
    let buf = '';
    const onData = (d) => {
      buf += d.toString('latin1');
      if (buf.includes('pusher:connection_established')) {
        sock.off('data', onData);
        resolve(sock);
      }
    };
    sock.on('data', onData);
    sock.on('error', reject);
  });
}

test('SIGTERM: 4200 to every client, /ready 503 while draining, exit 0', async () => {
  const h = await startHerald({ shutdown_grace: 3 });
  const pjs = h.client();
  const ch = pjs.subscribe('bye');
  await once(ch, 'pusher:subscription_succeeded');
  const raw = rawClient(h);
  await raw.established();
  const stubborn = await stubbornClient(h);
  stubborn.on('error', () => {});

  const pjsError = waitFor('pusher-js to report error 4200', (resolve) =>
    pjs.connection.bind('error', (e) => {
      const code = e.data?.code ?? e.error?.data?.code;
      if (code) resolve(code);
    }),
  );
  const t0 = Date.now();
  h.child.kill('SIGTERM');

  const err = await raw.next('pusher:error');
  assert.equal(err.data.code, 4200);
  assert.equal((await raw.closed).code, 4200);
  assert.equal(await pjsError, 4200);

  // While the stubborn client keeps its socket, herald is draining.
  const ready = await http(`${h.base}/ready`);
  assert.equal(ready.status, 503);
  assert.equal(await ready.text(), 'DRAINING');
  assert.equal((await http(`${h.base}/up`)).status, 200);
  // New WebSocket connections are refused during the drain.
  const refused = await waitFor('the upgrade during the drain to be answered', (resolve) => {
    const ws = new WebSocket(`ws://127.0.0.1:${h.port}/app/${DEV_APP.key}?${QUERY}`);
    ws.on('unexpected-response', (_req, res) => resolve(res.statusCode));
    ws.on('open', () => resolve('opened'));
    ws.on('error', () => {});
  });
  assert.equal(refused, 503);

  const { code, signal } = await h.exited;
  assert.deepEqual({ code, signal }, { code: 0, signal: null });
  assert.ok(Date.now() - t0 < 3000 + 4000, 'exits within shutdown_grace plus a little');
  pjs.disconnect();
  stubborn.destroy();
});

test('SIGTERM with no clients exits 0 at once', async () => {
  const h = await startHerald({ shutdown_grace: 30 });
  const t0 = Date.now();
  h.child.kill('SIGTERM');
  const { code } = await h.exited;
  assert.equal(code, 0);
  assert.ok(Date.now() - t0 < 5000, `took ${Date.now() - t0} ms`);
});
