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

/**
 * How long any one awaited network event may take. Every wait in the suite
 * is bounded by this (or its own, named limit), so a failure names its test
 * and what it waited for instead of the whole file hitting --test-timeout.
 */
export const WAIT_MS = 5000;

/** How long herald may take to exit: its default shutdown_grace, and more. */
const EXIT_MS = 15000;

/**
 * `promise`, but rejected with "timed out after MS ms waiting for WHAT" if
 * it has not settled within `ms`. The timer starts now, not at `await`.
 */
export function within(promise, what, ms = WAIT_MS) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  const bounded = Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
  // A wait set up before it is awaited (listen first, then act) must not
  // become an unhandled rejection meanwhile; awaiting it still throws.
  bounded.catch(() => {});
  return bounded;
}

/**
 * A promise settled from callbacks, bounded as `within`:
 * `waitFor('the 4009 error', (resolve) => c.connection.bind('error', ...))`.
 */
export function waitFor(what, executor, ms = WAIT_MS) {
  return within(new Promise(executor), what, ms);
}

/** A fetch Response whose body reads are bounded too. */
function boundedResponse(res, what) {
  if (!res || typeof res.json !== 'function') return res;
  return new Proxy(res, {
    get(target, prop) {
      const v = Reflect.get(target, prop, target);
      if (prop === 'json' || prop === 'text') return () => within(v.call(target), `the body of ${what}`);
      return typeof v === 'function' ? v.bind(target) : v;
    },
  });
}

/** `fetch` with every wait (headers, then body) bounded and named. */
export function http(url, options = {}) {
  const what = `${options.method ?? 'GET'} ${url}`;
  // The abort (a little after `within` gave up, so the named timeout is the
  // error reported) ends the request itself.
  const request = fetch(url, { signal: AbortSignal.timeout(WAIT_MS + 1000), ...options }).then(
    (res) => boundedResponse(res, what),
    (e) => {
      throw new Error(`${what} failed: ${e.message}`, { cause: e });
    },
  );
  return within(request, what);
}

/** Every call of the server SDK that returns a promise, bounded and named. */
function boundedSdk(sdk) {
  return new Proxy(sdk, {
    get(target, prop) {
      const v = Reflect.get(target, prop, target);
      if (typeof v !== 'function') return v;
      return (...args) => {
        const r = v.apply(target, args);
        if (!r || typeof r.then !== 'function') return r;
        const what = `the server SDK's ${String(prop)}(${JSON.stringify(args[0])?.slice(0, 80) ?? ''})`;
        return within(
          r.then((res) => boundedResponse(res, what)),
          what,
        );
      };
    },
  });
}

// ----- herald processes: none outlives this test file ----------------------------

const children = new Set();

function killChildren() {
  for (const child of children) {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  }
}

// 'exit' covers a normal end, process.exit (--test-force-exit) and an
// uncaught exception; the signals cover the runner or a user stopping this
// file. After killing the children a signal is re-raised with its default
// action, so the process still ends as it would have.
process.on('exit', killChildren);
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.once(signal, () => {
    killChildren();
    process.kill(process.pid, signal);
  });
}

export async function freePort() {
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
  const key = (k) => (/^[A-Za-z0-9_-]+$/.test(k) ? k : JSON.stringify(k));
  const value = (v) => {
    if (typeof v === 'string') return JSON.stringify(v);
    if (Array.isArray(v)) return `[${v.map(value).join(', ')}]`;
    if (v && typeof v === 'object')
      return `{ ${Object.entries(v).map(([k, x]) => `${key(k)} = ${value(x)}`).join(', ')} }`;
    return String(v);
  };
  const value2 = value;
  const lines = [];
  const tables = [];
  for (const [k, v] of Object.entries(config)) {
    if (k === 'apps') continue;
    if (v !== null && typeof v === 'object' && !Array.isArray(v)) tables.push([k, v]);
    else lines.push(`${k} = ${value2(v)}`);
  }
  // Tables (e.g. `rpc: { host: ... }` → [rpc]) after the top-level keys.
  for (const [name, table] of tables) {
    lines.push(`[${name}]`);
    for (const [k, v] of Object.entries(table)) lines.push(`${k} = ${value2(v)}`);
  }
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
  if (process.env.HERALD_TARGET) return targetHerald(process.env.HERALD_TARGET);
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
  children.add(child);
  let output = '';
  child.stdout.on('data', (d) => (output += d));
  child.stderr.on('data', (d) => (output += d));
  const exitedPromise = new Promise((resolve) =>
    child.on('exit', (code, signal) => {
      children.delete(child);
      resolve({ code, signal });
    }),
  );
  const base = `${ca ? 'https' : 'http'}://127.0.0.1:${port}`;
  // Wait for readiness by polling /ready: the process is up when it answers.
  for (let i = 0; ; i++) {
    try {
      const status = ca
        ? await httpsStatus(port, '/ready', ca)
        : (await fetch(`${base}/ready`, { signal: AbortSignal.timeout(1000) })).status;
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
    /** Resolves with `{code, signal}` when herald exits; bounded (15 s). */
    get exited() {
      return within(exitedPromise, 'herald to exit', EXIT_MS);
    },
    output: () => output,
    ...sdks('127.0.0.1', port, clients),
    /** SIGTERM, then wait for the exit; SIGKILL and fail if it takes too long. */
    async stop() {
      for (const c of clients) c.disconnect();
      if (child.exitCode === null) child.kill('SIGTERM');
      try {
        return await within(exitedPromise, 'herald to exit after SIGTERM', EXIT_MS);
      } catch (e) {
        child.kill('SIGKILL');
        throw e;
      }
    },
  };
  return h;
}

/**
 * The two SDKs pointed at a herald on `host:port`: `client()`, a pusher-js
 * client (remembered in `clients`, to disconnect at `stop()`), and
 * `server()`, the official `pusher` server SDK.
 */
function sdks(host, port, clients) {
  return {
    /** A pusher-js client connected to this herald. */
    client(options = {}, app = DEV_APP) {
      const c = new Pusher(app.key, {
        wsHost: host,
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
      return boundedSdk(
        new PusherServer({
          appId: app.id,
          key: app.key,
          secret: app.secret,
          host,
          port: String(port),
          useTLS: false,
          // Past `within`'s limit (boundedSdk): that names the timeout,
          // this ends the request.
          timeout: WAIT_MS + 1000,
          ...options,
        }),
      );
    },
  };
}

/**
 * HERALD_TARGET=http://127.0.0.1:PORT: the tests run against a herald that
 * is already running (the container image's smoke test, scripts/image)
 * instead of starting their own. Its configuration is the target's own:
 * only tests that need no more than the development app with
 * `subscription_count = true` apply, and `stop()` leaves it running.
 */
async function targetHerald(target) {
  const url = new URL(target);
  const port = Number(url.port || 80);
  const res = await http(`${url.origin}/ready`);
  if (res.status !== 200) throw new Error(`HERALD_TARGET ${target} is not ready (${res.status})`);
  const clients = [];
  return {
    port,
    base: url.origin,
    child: null,
    get exited() {
      throw new Error('HERALD_TARGET: the target is not this test\'s process');
    },
    output: () => '',
    ...sdks(url.hostname, port, clients),
    async stop() {
      for (const c of clients) c.disconnect();
      return { code: null, signal: null };
    },
  };
}

/** Resolve with the first `event` emitted on a pusher-js channel or connection. */
export function once(emitter, event, timeoutMs = WAIT_MS) {
  const on = typeof emitter.name === 'string' ? ` on ${emitter.name}` : '';
  const p = new Promise((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`timed out after ${timeoutMs} ms waiting for ${event}${on}`)),
      timeoutMs,
    );
    const handler = (data, meta) => {
      clearTimeout(timer);
      emitter.unbind(event, handler);
      resolve(data ?? meta);
    };
    emitter.bind(event, handler);
  });
  p.catch(() => {}); // see `within`
  return p;
}

/** Resolve when a pusher-js client's connection reaches `state`. */
export function connectionState(client, state, timeoutMs = WAIT_MS) {
  if (client.connection.state === state) return Promise.resolve();
  const p = new Promise((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`timed out after ${timeoutMs} ms waiting for state ${state} (now ${client.connection.state})`)),
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
  p.catch(() => {}); // see `within`
  return p;
}
