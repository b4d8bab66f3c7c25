// AnyCable's extended protocol (actioncable-v1-ext-json) on three herald
// nodes over a real redis-server (history and sessions on redis): the
// failover scenario of lib/ext_failover.mjs (a client of a SIGKILLed node
// restores on another without Connect and misses nothing).
import { test, describe } from 'node:test';
import { execFileSync } from 'node:child_process';
import { until } from '../lib/cable.mjs';
import { PREFIX, restoresAcrossAKilledNode } from '../lib/ext_failover.mjs';
import { freePort } from '../lib/herald.mjs';
import { startServer } from '../lib/nodes.mjs';

async function startRedis() {
  const port = await freePort();
  const args = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'];
  const child = await startServer('redis-server', args, port);
  const cli = (...a) => execFileSync('redis-cli', ['-p', String(port), ...a], { encoding: 'utf8' });
  return {
    url: `redis://127.0.0.1:${port}`,
    stop: () => child.kill('SIGKILL'),
    // The stream is reliable for the cluster, and the session (with its
    // subscription) is on the server.
    persisted: async () => {
      await until(() => cli('KEYS', `${PREFIX}:hist:*:m`).trim() !== '', 'the stream marked reliable');
      await until(
        () =>
          cli('KEYS', `${PREFIX}:sess:*`)
            .trim()
            .split('\n')
            .filter(Boolean)
            .some((k) => cli('GET', k).includes('ChatChannel')),
        'the session snapshot on the server',
      );
    },
  };
}

describe('actioncable-v1-ext-json with @anycable/web on a redis cluster', () => {
  test('a client of a SIGKILLed node restores on another without Connect and misses nothing', async () => {
    await restoresAcrossAKilledNode(await startRedis());
  });
});
