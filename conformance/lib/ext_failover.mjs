// The failover scenario of AnyCable's extended protocol
// (actioncable-v1-ext-json), shared by its broker variants
// (tests/actioncable_ext_redis.test.mjs, tests/actioncable_ext_nats.test.mjs):
// three herald nodes over one broker server; the real @anycable/web client
// reaches them through a TCP balancer; its node is SIGKILLed while the app
// keeps broadcasting through the others; the client reconnects through the
// balancer to a third node, restores its session there without a new
// Connect, and gets every message exactly once, in order.
import assert from 'node:assert/strict';
import { startHerald } from './herald.mjs';
import { chatApp, httpRpcServer, until } from './cable.mjs';
import { balancer } from './nodes.mjs';

const EXT = 'actioncable-v1-ext-json';
/** The nodes' `broker.prefix`. */
export const PREFIX = 'hx';

/**
 * The scenario over `broker`: `{ url, stop() }`, and `persisted(nodes)`,
 * which resolves once the client's session (with its subscription) and
 * the stream's reliability are on the broker's server, before node 0 dies.
 */
export async function restoresAcrossAKilledNode(broker) {
  const { createCable } = await import('@anycable/web');
  const { default: WebSocket } = await import('ws');
  const chat = chatApp();
  const rpc = await httpRpcServer(chat.app);
  const nodes = [];
  let lb = null;
  let cable = null;
  try {
    for (let i = 0; i < 3; i++) {
      nodes.push(
        await startHerald({
          'broker.url': broker.url,
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
    await broker.persisted(nodes);

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
    broker.stop();
  }
}
