// Pieces for tests of several herald nodes: a TCP balancer in front of
// them (a client reconnects through it to whichever node it routes to), a
// check that a port accepts connections, and a broker server started on a
// port and waited for.
import net from 'node:net';
import { spawn } from 'node:child_process';

/** Whether 127.0.0.1:`port` accepts a connection. */
export function canConnect(port) {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1', () => {
      s.destroy();
      resolve(true);
    });
    s.on('error', () => resolve(false));
  });
}

/** A TCP balancer on a free port: new connections go to `target.port`. */
export async function balancer(target) {
  const sockets = new Set();
  const server = net.createServer((down) => {
    const up = net.connect(to.port, '127.0.0.1');
    for (const s of [down, up]) {
      sockets.add(s);
      s.on('error', () => {
        down.destroy();
        up.destroy();
      });
      s.on('close', () => {
        sockets.delete(s);
        down.destroy();
        up.destroy();
      });
    }
    down.pipe(up);
    up.pipe(down);
  });
  const to = { port: target.port };
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    port: server.address().port,
    route: (node) => (to.port = node.port),
    /** Drop every connection through it; the listener stays. */
    cut: () => {
      for (const s of sockets) s.destroy();
    },
    close: () => {
      for (const s of sockets) s.destroy();
      server.close();
    },
  };
}

/**
 * Run `command args` (a broker server, Debian's package) and wait until
 * `port` accepts connections; its child process.
 */
export async function startServer(command, args, port) {
  const child = spawn(command, args, { stdio: 'ignore' });
  let failed = null;
  child.on('error', (e) => (failed = e));
  for (let i = 0; !(await canConnect(port)); i++) {
    if (failed) throw new Error(`cannot run ${command} (${failed.message}): install it or run ./scripts/test`);
    if (i > 500) throw new Error(`${command} did not start`);
    await new Promise((r) => setTimeout(r, 20));
  }
  return child;
}
