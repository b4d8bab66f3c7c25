// The official Pusher server SDKs of other languages (Python, Go, Java)
// against a real herald: each runs as a small program under conformance/sdks/
// that this module drives over its stdin and stdout, one JSON object a line.
//
// A request is `{"id": N, "op": "trigger", ...}`; its answer is
// `{"id": N, "ok": RESULT}` or `{"id": N, "error": "MESSAGE"}`. A line without
// an id is a note the program sends by itself: `{"ready": true}` once its
// webhook receiver listens, `{"webhook": {...}}` for each webhook it received
// and checked with its SDK's own validator, `{"client_event": {...}}` for an
// event its client library (Java) received.
//
// The programs are built (or installed) by conformance/sdks/install, which
// `startSdk` runs first: quick when nothing changed.
import { execFileSync, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { within, waitFor, WAIT_MS } from './herald.mjs';

export const SDKS_DIR = fileURLToPath(new URL('../sdks/', import.meta.url));
const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** How long one SDK's install or build may take (a first Maven run downloads). */
const INSTALL_MS = 300_000;

/** Install or build the SDK program `name` (python, go, java); returns its command line. */
export function installSdk(name) {
  const out = execFileSync(`${SDKS_DIR}install`, [name], {
    cwd: ROOT,
    encoding: 'utf8',
    timeout: INSTALL_MS,
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  // The script's last line is the JSON array of the command to run.
  return JSON.parse(out.trim().split('\n').pop());
}

/** The Pusher app the SDK programs are given: a numeric id, which Python's SDK requires. */
export const SDK_APP = { id: '4242', key: 'sdk-key', secret: 'sdk-secret' };

/**
 * Start the SDK program `name` for a herald on `port`; its webhook receiver
 * listens on `webhookPort`. Resolves once the program says it is ready.
 */
export async function startSdk(name, { port, webhookPort, app = SDK_APP }) {
  const [cmd, ...args] = installSdk(name);
  const child = spawn(cmd, args, {
    cwd: ROOT,
    env: {
      ...process.env,
      HERALD_HOST: '127.0.0.1',
      HERALD_PORT: String(port),
      WEBHOOK_PORT: String(webhookPort),
      APP_ID: app.id,
      APP_KEY: app.key,
      APP_SECRET: app.secret,
    },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr.on('data', (d) => (stderr += d));
  process.on('exit', () => child.exitCode === null && child.kill('SIGKILL'));

  const pending = new Map();
  const notes = [];
  let waiters = [];
  let buffered = '';
  let nextId = 1;
  child.stdout.setEncoding('utf8');
  child.stdout.on('data', (chunk) => {
    buffered += chunk;
    let nl;
    while ((nl = buffered.indexOf('\n')) >= 0) {
      const line = buffered.slice(0, nl).trim();
      buffered = buffered.slice(nl + 1);
      if (!line.startsWith('{')) continue; // a library's own chatter
      const msg = JSON.parse(line);
      if (msg.id !== undefined && pending.has(msg.id)) {
        const { resolve, reject } = pending.get(msg.id);
        pending.delete(msg.id);
        if ('error' in msg) reject(new Error(`${name} SDK: ${msg.error}`));
        else resolve(msg.ok);
      } else {
        notes.push(msg);
        for (const w of waiters) w();
      }
    }
  });
  const exited = new Promise((resolve) => child.on('exit', (code) => resolve(code)));
  exited.then(() => {
    for (const { reject } of pending.values()) reject(new Error(`${name} SDK program exited:\n${stderr}`));
    for (const w of waiters) w();
  });

  const sdk = {
    name,
    notes,
    stderr: () => stderr,
    /** Ask the program to do `op` with its SDK; resolves with its answer. */
    call(op, params = {}, ms = WAIT_MS) {
      const id = nextId++;
      const answer = new Promise((resolve, reject) => pending.set(id, { resolve, reject }));
      child.stdin.write(JSON.stringify({ id, op, ...params }) + '\n');
      return within(answer, `the ${name} SDK's ${op}(${JSON.stringify(params).slice(0, 80)})`, ms);
    },
    /** The first note (already received or still to come) for which `pred` holds. */
    note(pred, what, ms = WAIT_MS) {
      return waitFor(`${what} (from the ${name} SDK program)`, (resolve) => {
        const look = () => {
          const found = notes.find(pred);
          if (found) {
            waiters = waiters.filter((w) => w !== look);
            resolve(found);
          }
        };
        waiters.push(look);
        look();
      }, ms);
    },
    async stop() {
      child.stdin.end();
      if (child.exitCode === null) child.kill('SIGTERM');
      await within(exited, `the ${name} SDK program to exit`);
    },
  };
  await sdk.note((n) => n.ready, 'its ready line', 30_000).catch((e) => {
    throw new Error(`${e.message}\n${stderr}`);
  });
  return sdk;
}

/**
 * pusher-js `channelAuthorization` whose answers come from the SDK program
 * (`auth` op): the program signs with its own SDK.
 */
export function sdkChannelAuth(sdk, member) {
  return {
    customHandler: ({ socketId, channelName }, callback) => {
      const m = channelName.startsWith('presence-') ? member(channelName) : {};
      sdk.call('auth', { socket_id: socketId, channel: channelName, ...m }).then(
        (auth) => callback(null, auth),
        (e) => callback(e, null),
      );
    },
  };
}

/** pusher-js `userAuthentication` answered by the SDK program (`user_auth` op). */
export function sdkUserAuth(sdk, user) {
  return {
    customHandler: ({ socketId }, callback) => {
      sdk.call('user_auth', { socket_id: socketId, user }).then(
        (auth) => callback(null, auth),
        (e) => callback(e, null),
      );
    },
  };
}
