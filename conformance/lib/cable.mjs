// An Action Cable chat app for the conformance suite, built on AnyCable's
// own JS RPC library (@anycable/serverless-js) and served two ways: as
// HTTP RPC (the library's handler) and as gRPC (@grpc/grpc-js with
// AnyCable's rpc.proto). Plus clients: @rails/actioncable consumers over
// `ws`, and raw sockets for exact frames.
import { register } from 'node:module';
import http from 'node:http';
import { fileURLToPath } from 'node:url';
import WebSocket from 'ws';
import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';
import * as ActionCable from '@rails/actioncable';

register('./dir-imports.mjs', import.meta.url);
const { Application, Channel, handler, connectHandler, commandHandler, disconnectHandler, broadcaster } =
  await import('@anycable/serverless-js');

// @rails/actioncable is written for browsers: it listens for page
// visibility on the global object and opens sockets with the global
// WebSocket. Node has neither; `ws` stands in, with the user's cookie set
// from the `as` query parameter of the consumer's URL (a browser would send
// the page's cookies).
globalThis.addEventListener ??= () => {};
globalThis.removeEventListener ??= () => {};
class CookieWebSocket extends WebSocket {
  constructor(url, protocols) {
    const user = new URL(url).searchParams.get('as');
    super(url, protocols, user ? { headers: { cookie: `user=${user}; theme=dark` } } : {});
  }
}
ActionCable.adapters.WebSocket = CookieWebSocket;
ActionCable.adapters.logger = { log() {} };

export { ActionCable };

/** A chat app: who is who from a cookie, rooms, a secret room that rejects. */
export function chatApp() {
  const calls = { connect: [], command: [], disconnect: [] };
  let broadcastURL = null;
  let broadcastKey = '';

  class ChatChannel extends Channel {
    async subscribed(handle, params) {
      if (params.room === 'secret') return handle.reject();
      handle.streamFrom(`room:${params.room}`);
      handle.state = { room: params.room, joined: String(Date.now()) };
    }
    async unsubscribed() {}
    // Answer the caller only.
    async whoami(handle) {
      handle.transmit({ user: handle.identifiers.user, room: handle.state?.room ?? null });
    }
    // Broadcast to the room through Herald's POST /_broadcast.
    async speak(handle, params, data) {
      await broadcaster(broadcastURL, broadcastKey)(`room:${params.room}`, {
        from: handle.identifiers.user,
        text: data.text,
      });
    }
    // Stop the room's stream, stay subscribed.
    async mute(handle, params) {
      handle.stopStreamFrom(`room:${params.room}`);
      handle.transmit({ muted: true });
    }
    // Follow a second stream.
    async follow(handle, params, data) {
      handle.streamFrom(data.stream);
      handle.transmit({ following: data.stream });
    }
    // The app closes the connection.
    async kick(handle) {
      handle.transmit({ kicked: true });
      handle.delegate.transmit({ type: 'disconnect', reason: 'remote', reconnect: false });
      handle.delegate.close();
    }
  }

  // A room with presence and whispers: the subscription's state names
  // the stream for both (`$p`, `$w`), as AnyCable's Rails helpers do.
  // (serverless-js has no presence yet and keeps `handle.state` as one
  // JSON value, so the keys go into the answer's istate directly.)
  class PresenceChannel extends Channel {
    async subscribed(handle, params) {
      const stream = `presence:${params.room}`;
      handle.streamFrom(stream);
      const env = handle.delegate.env;
      env.istate = { ...(env.istate ?? {}), $p: stream, $w: stream };
    }
    async unsubscribed() {}
  }

  class ChatApp extends Application {
    async connect(handle) {
      const cookie = handle.env.headers?.cookie ?? '';
      const user = /(?:^|;\s*)user=([^;]+)/.exec(cookie)?.[1];
      if (!user) return handle.reject();
      handle.identifiedBy({ user });
    }
    async disconnect(handle) {}
  }

  const app = new ChatApp();
  app.registerChannel('ChatChannel', new ChatChannel());
  app.registerChannel('PresenceChannel', new PresenceChannel());
  // Record what the app was asked, for the tests to check.
  const origOpen = app.handleOpen.bind(app);
  app.handleOpen = async (handle) => {
    calls.connect.push({ sid: handle.id, env: handle.env });
    return origOpen(handle);
  };
  const origCommand = app.handleCommand.bind(app);
  app.handleCommand = async (handle, command, identifier, data) => {
    calls.command.push({ sid: handle.id, command, identifier, data, env: structuredClone(handle.env) });
    return origCommand(handle, command, identifier, data);
  };
  const origClose = app.handleClose.bind(app);
  app.handleClose = async (handle, subscriptions) => {
    calls.disconnect.push({ sid: handle.id, identifiers: handle.identifiers, subscriptions, env: handle.env });
    return origClose(handle, subscriptions);
  };
  return {
    app,
    calls,
    setBroadcast(url, key = '') {
      broadcastURL = url;
      broadcastKey = key;
    },
  };
}

/** Serve `app` as AnyCable HTTP RPC on a loopback port. */
export async function httpRpcServer(app, { secret = null, delayMs = 0 } = {}) {
  const server = http.createServer(async (req, res) => {
    try {
      if (secret && req.headers.authorization !== `Bearer ${secret}`) {
        res.writeHead(401).end();
        return;
      }
      if (delayMs) await new Promise((r) => setTimeout(r, delayMs));
      const request = {
        url: `http://127.0.0.1${req.url}`,
        headers: new Headers(req.headers),
        body: req,
      };
      const answer = await handler(request, app);
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(answer));
    } catch (e) {
      res.writeHead(500).end(String(e?.message ?? e));
    }
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${server.address().port}/_anycable`,
    close: () => new Promise((r) => server.close(r)),
    server,
  };
}

const proto = grpc.loadPackageDefinition(
  protoLoader.loadSync(fileURLToPath(new URL('./anycable.proto', import.meta.url)), {
    keepCase: true,
    enums: Number,
    defaults: true,
    longs: Number,
  }),
).anycable;

/** Serve `app` as AnyCable gRPC on a loopback port. */
export async function grpcRpcServer(app) {
  const server = new grpc.Server();
  // The library's handlers take a fetch-style request: hand them the gRPC
  // message as its JSON body and the `sid` metadata as AnyCable's header.
  const call = (fn) => (c, done) => {
    const sid = c.metadata.get('sid')[0] ?? '';
    const body = JSON.stringify(c.request);
    const request = {
      url: 'http://grpc/',
      headers: new Headers({ 'x-anycable-meta-sid': String(sid) }),
      body: (async function* () {
        yield body;
      })(),
    };
    fn(request, app).then(
      (answer) => done(null, JSON.parse(JSON.stringify(answer ?? {}), (k, v) => (v === null ? undefined : v))),
      (e) => done({ code: grpc.status.INTERNAL, message: String(e?.message ?? e) }),
    );
  };
  server.addService(proto.RPC.service, {
    Connect: call(connectHandler),
    Command: call(commandHandler),
    Disconnect: call(disconnectHandler),
  });
  const port = await new Promise((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))),
  );
  return {
    url: `127.0.0.1:${port}`,
    // Forced: a client (the server under test) may keep its connection
    // open, and a graceful shutdown would wait for it.
    close: async () => server.forceShutdown(),
    server,
  };
}

/** Resolve when `check()` holds, polling; reject after `ms` naming `what`. */
export async function until(check, what, ms = 5000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await check();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** An @rails/actioncable consumer of `herald`, as `user` (a cookie). */
export function consumer(herald, user, path = '/cable') {
  const q = user ? `?as=${encodeURIComponent(user)}` : '';
  return ActionCable.createConsumer(`ws://127.0.0.1:${herald.port}${path}${q}`);
}

/**
 * Subscribe `consumer` to `params`; resolves with { sub, messages, next }
 * once confirmed, rejects when rejected.
 */
export function subscribe(cons, params, ms = 5000) {
  return new Promise((resolve, reject) => {
    const messages = [];
    const waiters = [];
    const timer = setTimeout(() => reject(new Error(`no confirmation for ${JSON.stringify(params)}`)), ms);
    const sub = cons.subscriptions.create(params, {
      connected() {
        clearTimeout(timer);
        resolve({
          sub,
          messages,
          /** The next message (or one already received and not taken). */
          next(wait = 5000) {
            if (messages.length) return Promise.resolve(messages.shift());
            return new Promise((res, rej) => {
              const t = setTimeout(() => rej(new Error(`no message on ${JSON.stringify(params)}`)), wait);
              waiters.push((m) => {
                clearTimeout(t);
                res(m);
              });
            });
          },
        });
      },
      rejected() {
        clearTimeout(timer);
        reject(Object.assign(new Error('rejected'), { rejected: true }));
      },
      received(m) {
        const w = waiters.shift();
        if (w) w(m);
        else messages.push(m);
      },
    });
  });
}

/** A raw WebSocket to /cable: every frame, parsed, and the close code. */
export async function rawCable(herald, { cookie, path = '/cable', protocols = ['actioncable-v1-json'] } = {}) {
  const ws = new WebSocket(`ws://127.0.0.1:${herald.port}${path}`, protocols, cookie ? { headers: { cookie } } : {});
  const frames = [];
  const waiters = [];
  let closed = null;
  const closeWaiters = [];
  ws.on('message', (d) => {
    const f = JSON.parse(String(d));
    if (f.type === 'ping') return;
    const w = waiters.shift();
    if (w) w(f);
    else frames.push(f);
  });
  ws.on('close', (code) => {
    closed = code;
    for (const w of closeWaiters.splice(0)) w(code);
  });
  ws.on('error', () => {});
  await new Promise((resolve, reject) => {
    ws.once('open', resolve);
    ws.once('error', reject);
    ws.once('unexpected-response', (_, res) => reject(new Error(`HTTP ${res.statusCode}`)));
  });
  return {
    ws,
    send: (obj) => ws.send(typeof obj === 'string' ? obj : JSON.stringify(obj)),
    next(ms = 5000) {
      if (frames.length) return Promise.resolve(frames.shift());
      return new Promise((res, rej) => {
        const t = setTimeout(() => rej(new Error('no frame from /cable')), ms);
        waiters.push((f) => {
          clearTimeout(t);
          res(f);
        });
      });
    },
    closed(ms = 5000) {
      if (closed !== null) return Promise.resolve(closed);
      return new Promise((res, rej) => {
        const t = setTimeout(() => rej(new Error('socket not closed')), ms);
        closeWaiters.push((c) => {
          clearTimeout(t);
          res(c);
        });
      });
    },
    pending: () => frames.slice(),
    close: () => ws.close(),
  };
}

/**
 * The Action Cable server under test: herald, or, when ANYCABLE_BIN names
 * an anycable-go binary, AnyCable itself with the same settings (to check
 * that the suite tests Action Cable and AnyCable's RPC, not herald's
 * reading of them). Same shape as startHerald's result: port, base, stop.
 */
export async function startCable(config) {
  const { startHerald } = await import('./herald.mjs');
  if (!process.env.ANYCABLE_BIN) return startHerald(config);
  const { spawn } = await import('node:child_process');
  const net = await import('node:net');
  const port = await new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const p = s.address().port;
      s.close(() => resolve(p));
    });
  });
  const rpc = config.rpc ?? {};
  const args = [
    '--host=127.0.0.1',
    `--port=${port}`,
    `--rpc_host=${rpc.host}`,
    '--broadcast_adapter=http',
    `--http_broadcast_port=${port}`,
    '--log_level=warn',
  ];
  if (rpc.secret) args.push(`--http_rpc_secret=${rpc.secret}`);
  if (rpc.broadcast_key) args.push(`--broadcast_key=${rpc.broadcast_key}`);
  if (rpc.headers) args.push(`--headers=${rpc.headers.join(',')}`);
  const child = spawn(process.env.ANYCABLE_BIN, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout.on('data', (d) => (output += d));
  child.stderr.on('data', (d) => (output += d));
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  const base = `http://127.0.0.1:${port}`;
  await until(
    async () => {
      if (child.exitCode !== null) throw new Error(`anycable exited:\n${output}`);
      try {
        return (await fetch(`${base}/health`)).status === 200;
      } catch {
        return false;
      }
    },
    'anycable to start',
    10000,
  );
  return {
    port,
    base,
    child,
    output: () => output,
    anycable: true,
    async stop() {
      if (child.exitCode === null) child.kill('SIGTERM');
      return exited;
    },
  };
}
