// AnyCable's extended protocol (actioncable-v1-ext-json) on three herald
// nodes over a real nats-server with JetStream (history and sessions in
// JetStream; the redis variant is actioncable_ext_redis.test.mjs): the real
// @anycable/web client reaches the cluster through a TCP balancer; its
// node is SIGKILLed while the app keeps broadcasting through another node;
// the client reconnects through the balancer to a third node, restores its
// session there without a new Connect, and gets every message exactly once,
// in order.
import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startHerald, freePort } from '../lib/herald.mjs';
import { chatApp, httpRpcServer, until } from '../lib/cable.mjs';
import { balancer, canConnect } from '../lib/nodes.mjs';

const EXT = 'actioncable-v1-ext-json';
const PREFIX = 'hx';

async function startNats() {
  const port = await freePort();
  const store = mkdtempSync(join(tmpdir(), 'herald-js-'));
  const args = ['-a', '127.0.0.1', '-p', String(port), '-js', '-sd', store];
  const child = spawn('nats-server', args, { stdio: 'ignore' });
  let failed = null;
  child.on('error', (e) => (failed = e));
  for (let i = 0; !(await canConnect(port)); i++) {
    if (failed) throw new Error(`cannot run nats-server (${failed.message}): install it or run ./scripts/test`);
    if (i > 500) throw new Error('nats-server did not start');
    await new Promise((r) => setTimeout(r, 20));
  }
  return {
    url: `nats://127.0.0.1:${port}`,
    stop: () => {
      child.kill('SIGKILL');
      rmSync(store, { recursive: true, force: true });
    },
  };
}

/** A counter's value on a node's /metrics (0 when absent). */
async function counter(node, name) {
  const text = await (await fetch(`${node.base}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${name} `));
  return line ? Number(line.split(' ')[1]) : 0;
}

describe('actioncable-v1-ext-json with @anycable/web on a NATS JetStream cluster', () => {
  test('a client of a SIGKILLed node restores on another without Connect and misses nothing', async () => {
    const { createCable } = await import('@anycable/web');
    const { default: WebSocket } = await import('ws');
    const nats = await startNats();
    const chat = chatApp();
    const rpc = await httpRpcServer(chat.app);
    const nodes = [];
    let lb = null;
    let cable = null;
    try {
      for (let i = 0; i < 3; i++) {
        nodes.push(
          await startHerald({
            'broker.url': nats.url,
            'broker.prefix': PREFIX,
            'broker.ttl': 3,
            rpc: { host: rpc.url },
          }),
        );
      }
      for (const h of nodes) {
        await until(async () => (await fetch(`${h.base}/ready`)).status === 200, '/ready', 10000);
      }
      const broadcast = (node, stream, data) =>
        fetch(`${node.base}/_broadcast`, {
          method: 'POST',
          body: JSON.stringify({ stream, data: JSON.stringify(data) }),
        }).then((r) => assert.equal(r.status, 201));

      lb = await balancer(nodes[0]);
      cable = createCable(`ws://127.0.0.1:${lb.port}/cable`, {
        websocketImplementation: WebSocket,
        websocketOptions: { headers: { cookie: 'user=kill' } },
        protocol: EXT,
        logLevel: 'error',
      });
      const events = [];
      cable.on('connect', (e) => events.push(e));
      const channel = cable.subscribeTo('ChatChannel', { room: 'k' });
      await channel.ensureSubscribed();
      const got = [];
      let probes = 0;
      channel.on('message', (m) => ('probe' in m ? probes++ : got.push(m.n)));
      // The session (with its subscription) is in JetStream before node 0
      // dies: node 0 has written a snapshot since the subscription (every
      // Action Cable stream is appended on NATS, so the stream needs no
      // marking).
      await until(
        async () => (await counter(nodes[0], 'herald_jetstream_sessions_written_total')) >= 2,
        'the session snapshot with its subscription in JetStream',
      );

      // Node 0 subscribes to the stream's broker channel just after the
      // confirmation; a publication of another node before that reaches
      // no one there (pub/sub keeps nothing): probe until one arrives.
      for (let k = 0; probes === 0; k++) {
        if (k > 100) throw new Error('no probe arrived');
        await broadcast(nodes[1], 'room:k', { probe: k });
        await new Promise((r) => setTimeout(r, 50));
      }

      const N = 60;
      for (let n = 1; n <= N; n++) {
        // The app broadcasts through node 1 or node 2, never node 0.
        await broadcast(nodes[1 + (n % 2)], 'room:k', { n });
        if (n === 15) {
          await until(() => got.length >= 15, 'the first 15 messages live');
          lb.route(nodes[2]);
          nodes[0].child.kill('SIGKILL');
        }
        await new Promise((r) => setTimeout(r, 15));
      }
      await until(() => got.length >= N, `all ${N} messages (got ${got.length})`, 15000);
      // A last one, live on node 2: nothing else was on its way.
      await broadcast(nodes[1], 'room:k', { n: N + 1 });
      await until(() => got.length >= N + 1, 'the last message');
      assert.deepEqual(got, Array.from({ length: N + 1 }, (_, i) => i + 1), 'each message once, in order');
      assert.ok(events.some((e) => e.restored), `the session was restored: ${JSON.stringify(events)}`);
      assert.equal(chat.calls.connect.length, 1, 'no second Connect for the restored session');
    } finally {
      cable?.disconnect();
      lb?.close();
      for (const h of nodes) if (h.child.exitCode === null && h.child.signalCode === null) await h.stop();
      await rpc.close();
      nats.stop();
    }
  });
});
