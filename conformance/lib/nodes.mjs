// Pieces for tests of several herald nodes: a TCP balancer in front of
// them (a client reconnects through it to whichever node it routes to), and
// a check that a port accepts connections (a broker server is up).
import net from 'node:net';

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
    close: () => {
      for (const s of sockets) s.destroy();
      server.close();
    },
  };
}
