// AnyCable's extended protocol (actioncable-v1-ext-json) on three herald
// nodes over a real nats-server with JetStream (history and sessions in
// JetStream): the failover scenario of lib/ext_failover.mjs (a client of a
// SIGKILLed node restores on another without Connect and misses nothing).
import { test, describe } from 'node:test';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { until } from '../lib/cable.mjs';
import { restoresAcrossAKilledNode } from '../lib/ext_failover.mjs';
import { freePort } from '../lib/herald.mjs';
import { startServer } from '../lib/nodes.mjs';

/** A counter's value on a node's /metrics (0 when absent). */
async function counter(node, name) {
  const text = await (await fetch(`${node.base}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${name} `));
  return line ? Number(line.split(' ')[1]) : 0;
}

async function startNats() {
  const port = await freePort();
  const store = mkdtempSync(join(tmpdir(), 'herald-js-'));
  const args = ['-a', '127.0.0.1', '-p', String(port), '-js', '-sd', store];
  const child = await startServer('nats-server', args, port);
  return {
    url: `nats://127.0.0.1:${port}`,
    stop: () => {
      child.kill('SIGKILL');
      rmSync(store, { recursive: true, force: true });
    },
    // Node 0 has written a snapshot since the subscription (every Action
    // Cable stream is appended on NATS, so the stream needs no marking).
    persisted: (nodes) =>
      until(
        async () => (await counter(nodes[0], 'herald_jetstream_sessions_written_total')) >= 2,
        'the session snapshot with its subscription in JetStream',
      ),
  };
}

describe('actioncable-v1-ext-json with @anycable/web on a NATS JetStream cluster', () => {
  test('a client of a SIGKILLed node restores on another without Connect and misses nothing', async () => {
    await restoresAcrossAKilledNode(await startNats());
  });
});
