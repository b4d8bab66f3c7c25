// Start a real `herald serve` for a test file, on a free loopback port, with
// its own configuration, and hand out clients wired to it.
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import https from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import net from 'node:net';
import Pusher from 'pusher-js';
import PusherServer from 'pusher';

export const BIN = process.env.HERALD_BIN ?? new URL('../../target/debug/herald', import.meta.url).pathname;

export const DEV_APP = { id: 'app-id', key: 'app-key', secret: 'app-secret' };

async function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
    srv.on('error', reject);
  });
}

/** The status of GET `path` over TLS, trusting `ca`. */
function httpsStatus(port, path, ca) {
  return new Promise((resolve, reject) => {
    const req = https.get({ host: '127.0.0.1', port, path, ca }, (res) => {
      res.resume();
      resolve(res.statusCode);
    });
    req.on('error', reject);
    req.setTimeout(2000, () => req.destroy(new Error('timeout')));
  });
}

/** Render a flat TOML document: top-level keys, then [[apps]] tables. */
function toml(config) {
  const value = (v) =>
    typeof v === 'string' ? JSON.stringify(v) : Array.isArray(v) ? `[${v.map(value).join(', ')}]` : String(v);
  const lines = [];
  for (const [k, v] of Object.entries(config)) if (k !== 'apps') lines.push(`${k} = ${value(v)}`);
  for (const app of config.apps ?? []) {
    lines.push('[[apps]]');
    for (const [k, v] of Object.entries(app)) lines.push(`${k} = ${value(v)}`);
  }
  return lines.join('\n') + '\n';
}

/**
 * Start herald. `config` is the TOML config as an object (host/port are set
 * here); with no `apps`, the embedded development app is served.
 */
export async function startHerald(config = {}, { env = {} } = {}) {
  // With tls_cert/tls_key herald serves https only: /ready is polled over
  // TLS, trusting that certificate.
  const ca = config.tls_cert ? readFileSync(config.tls_cert) : null;
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'herald-test-'));
  const file = join(dir, 'herald.toml');
  writeFileSync(file, toml({ host: '127.0.0.1', port, log: 'warn', ...config }));
  const child = spawn(BIN, ['serve', '--config', file], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (d) => (output += d));
  child.stderr.on('data', (d) => (output += d));
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  const base = `${ca ? 'https' : 'http'}://127.0.0.1:${port}`;
  // Wait for readiness by polling /ready: the process is up when it answers.
  for (let i = 0; ; i++) {
    try {
      const status = ca ? await httpsStatus(port, '/ready', ca) : (await fetch(`${base}/ready`)).status;
      if (status === 200) break;
    } catch {}
    if (child.exitCode !== null) throw new Error(`herald exited early:\n${output}`);
    if (i > 500) throw new Error(`herald not ready after 10s:\n${output}`);
    await new Promise((r) => setTimeout(r, 20));
  }
  const clients = [];
  const h = {
    port,
    base,
    child,
    exited,
    output: () => output,
    /** A pusher-js client connected to this herald. */
    client(options = {}, app = DEV_APP) {
      const c = new Pusher(app.key, {
        wsHost: '127.0.0.1',
        wsPort: port,
        forceTLS: false,
        enabledTransports: ['ws'],
        cluster: 'herald',
        disableStats: true,
        ...options,
      });
      clients.push(c);
      return c;
    },
    /** The official `pusher` server SDK pointed at this herald. */
    server(app = DEV_APP, options = {}) {
      return new PusherServer({
        appId: app.id,
        key: app.key,
        secret: app.secret,
        host: '127.0.0.1',
        port: String(port),
        useTLS: false,
        ...options,
      });
    },
    async stop() {
      for (const c of clients) c.disconnect();
      if (child.exitCode === null) child.kill('SIGTERM');
      return exited;
    },
  };
  return h;
}

/** Resolve with the first `event` emitted on a pusher-js channel or connection. */
export function once(emitter, event, timeoutMs = 5000) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`timed out waiting for ${event}`)), timeoutMs);
    const handler = (data, meta) => {
      clearTimeout(timer);
      emitter.unbind(event, handler);
      resolve(data ?? meta);
    };
    emitter.bind(event, handler);
  });
}

/** Resolve when a pusher-js client's connection reaches `state`. */
export function connectionState(client, state, timeoutMs = 5000) {
  if (client.connection.state === state) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`timed out waiting for state ${state} (now ${client.connection.state})`)),
      timeoutMs,
    );
    const handler = (s) => {
      if (s.current === state) {
        clearTimeout(timer);
        client.connection.unbind('state_change', handler);
        resolve();
      }
    };
    client.connection.bind('state_change', handler);
  });
}
