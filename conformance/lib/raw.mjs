// Helpers below the client libraries: raw WebSocket clients (for what
// pusher-js cannot express), hand-signed HTTP API requests, /metrics, and
// auth callbacks that sign with the official `pusher` server SDK.
import { createHash, createHmac } from 'node:crypto';
import net from 'node:net';
import WebSocket from 'ws';
import { DEV_APP, WAIT_MS, http, within } from './herald.mjs';

export const QUERY = 'protocol=7&client=js&version=8.4.0&flash=false';

/**
 * A raw `ws` client on /app/{key}. Every text frame is parsed and kept in
 * order; `next(pred)` resolves with the first message after the previous
 * match that satisfies `pred`, so consecutive `next` calls also assert order.
 */
export function rawClient(h, { key = DEV_APP.key, query = QUERY, answerPings = true } = {}) {
  const ws = new WebSocket(`ws://127.0.0.1:${h.port}/app/${key}${query === null ? '' : `?${query}`}`);
  const messages = [];
  let cursor = 0;
  const waiters = new Set();
  const wake = () => {
    for (const w of waiters) w();
  };
  ws.on('message', (data, isBinary) => {
    let msg;
    try {
      msg = JSON.parse(data.toString());
      if (typeof msg.data === 'string') {
        try {
          msg.data = JSON.parse(msg.data);
        } catch {}
      }
    } catch {
      msg = { unparsed: data.toString(), isBinary };
    }
    messages.push(msg);
    if (answerPings && msg.event === 'pusher:ping') send({ event: 'pusher:pong', data: {} });
    wake();
  });
  ws.on('error', () => {});
  const closed = new Promise((resolve) =>
    ws.on('close', (code, reason) => {
      resolve({ code, reason: reason.toString() });
      wake();
    }),
  );
  const opened = new Promise((resolve, reject) => {
    ws.once('open', resolve);
    ws.once('unexpected-response', (_req, res) => reject(new Error(`HTTP ${res.statusCode}`)));
    ws.once('error', reject);
  });
  opened.catch(() => {});
  const last = () => JSON.stringify(messages.slice(cursor));
  function send(obj) {
    ws.send(typeof obj === 'string' ? obj : JSON.stringify(obj));
  }
  function next(pred, timeoutMs = WAIT_MS) {
    const test = typeof pred === 'string' ? (m) => m.event === pred : pred;
    const what = typeof pred === 'string' ? pred : `a message matching ${pred}`;
    return new Promise((resolve, reject) => {
      const check = () => {
        for (let i = cursor; i < messages.length; i++) {
          if (test(messages[i])) {
            cursor = i + 1;
            waiters.delete(check);
            clearTimeout(timer);
            resolve(messages[i]);
            return;
          }
        }
        if (ws.readyState === WebSocket.CLOSED) {
          waiters.delete(check);
          clearTimeout(timer);
          reject(new Error(`socket closed while waiting for ${what}; got ${last()}`));
        }
      };
      const timer = setTimeout(() => {
        waiters.delete(check);
        reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}; got ${last()}`));
      }, timeoutMs);
      waiters.add(check);
      check();
    });
  }
  /** Wait for the handshake and return the socket id. */
  async function established() {
    const m = await next('pusher:connection_established');
    return m.data.socket_id;
  }
  async function subscribe(channel, extra = {}) {
    send({ event: 'pusher:subscribe', data: { channel, ...extra } });
    return next((m) => m.channel === channel && /subscription_(succeeded|error)/.test(m.event));
  }
  return {
    ws,
    messages,
    send,
    next,
    /** Resolves with `{code, reason}` once the socket closed; bounded. */
    get closed() {
      return within(closed, `the socket to close; got ${last()}`);
    },
    /** Resolves once the upgrade succeeded; bounded. */
    get opened() {
      return within(opened, 'the WebSocket upgrade');
    },
    established,
    subscribe,
  };
}

/**
 * Send bytes over a plain TCP socket after a hand-made WebSocket upgrade,
 * for frames `ws` will not produce (invalid UTF-8 in a text frame).
 * Resolves with the close code the server sent.
 */
export function rawFrameClose(h, frame, { key = DEV_APP.key } = {}) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(h.port, '127.0.0.1');
    let buf = Buffer.alloc(0);
    let upgraded = false;
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new Error(`timed out after ${WAIT_MS} ms waiting for a close frame; got ${buf.toString('latin1')}`));
    }, WAIT_MS);
    sock.on('connect', () => {
      sock.write(
        `GET /app/${key}?${QUERY} HTTP/1.1\r\nHost: 127.0.0.1:${h.port}\r\nUpgrade: websocket\r\n` +
          `Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n`,
      );
    });
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      if (!upgraded) {
        const end = buf.indexOf('\r\n\r\n');
        if (end < 0) return;
        if (!buf.subarray(0, end).toString().startsWith('HTTP/1.1 101')) {
          clearTimeout(timer);
          sock.destroy();
          return reject(new Error(buf.toString()));
        }
        upgraded = true;
        buf = buf.subarray(end + 4);
        sock.write(frame);
      }
      // Walk the server's (unmasked) frames looking for a close frame.
      let off = 0;
      while (buf.length - off >= 2) {
        const op = buf[off] & 0x0f;
        let len = buf[off + 1] & 0x7f;
        let hdr = 2;
        if (len === 126) {
          if (buf.length - off < 4) break;
          len = buf.readUInt16BE(off + 2);
          hdr = 4;
        } else if (len === 127) {
          if (buf.length - off < 10) break;
          len = Number(buf.readBigUInt64BE(off + 2));
          hdr = 10;
        }
        if (buf.length - off < hdr + len) break;
        if (op === 0x8) {
          clearTimeout(timer);
          const code = len >= 2 ? buf.readUInt16BE(off + hdr) : 1005;
          sock.destroy();
          return resolve(code);
        }
        off += hdr + len;
      }
    });
    sock.on('error', () => {});
    sock.on('close', () => {
      clearTimeout(timer);
      reject(new Error('TCP closed without a close frame'));
    });
  });
}

/** A masked client frame with `opcode` and `payload` (fin set). */
export function clientFrame(opcode, payload) {
  const mask = Buffer.from([1, 2, 3, 4]);
  const len = payload.length;
  const head = len < 126 ? Buffer.from([0x80 | opcode, 0x80 | len]) : Buffer.from([0x80 | opcode, 0x80 | 126, len >> 8, len & 0xff]);
  const body = Buffer.from(payload.map((b, i) => b ^ mask[i % 4]));
  return Buffer.concat([head, mask, body]);
}

const md5 = (s) => createHash('md5').update(s).digest('hex');
const hmac = (secret, s) => createHmac('sha256', secret).update(s).digest('hex');

/**
 * An HTTP API request signed by hand as Pusher specifies. `tamper` may edit
 * the query parameters after signing; `sign: false` leaves them unsigned;
 * `signedPath` signs another path than the one requested.
 */
export async function signedFetch(
  h,
  method,
  path,
  { body, app = DEV_APP, params = {}, timestamp, bodyMd5, sign = true, tamper, secret, signedPath = path } = {},
) {
  const text = body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body);
  const q = {
    auth_key: app.key,
    auth_timestamp: String(timestamp ?? Math.floor(Date.now() / 1000)),
    auth_version: '1.0',
    ...params,
  };
  if (text !== undefined) q.body_md5 = bodyMd5 ?? md5(text);
  if (sign) {
    const sorted = Object.keys(q)
      .map((k) => [k.toLowerCase(), q[k]])
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([k, v]) => `${k}=${v}`)
      .join('&');
    q.auth_signature = hmac(secret ?? app.secret, `${method}\n${signedPath}\n${sorted}`);
  }
  if (tamper) tamper(q);
  const res = await http(`${h.base}${path}?${new URLSearchParams(q)}`, {
    method,
    body: text,
    headers: text === undefined ? {} : { 'content-type': 'application/json' },
  });
  const raw = await res.text();
  let json;
  try {
    json = JSON.parse(raw);
  } catch {}
  return { status: res.status, json, text: raw };
}

/** The current value of a /metrics counter or gauge: the sum of its series (every app, protocol, ...). */
export async function metric(h, name) {
  const text = await (await http(`${h.base}/metrics`)).text();
  const lines = text.split('\n').filter((l) => l.startsWith(`${name} `) || l.startsWith(`${name}{`));
  if (lines.length === 0) throw new Error(`metric ${name} not found`);
  return lines.reduce((sum, l) => sum + Number(l.slice(l.lastIndexOf(' ') + 1)), 0);
}

/**
 * pusher-js `channelAuthorization` that signs with the server SDK. For
 * presence channels, `member(channelName)` gives `{user_id, user_info}`.
 */
export function channelAuth(server, member) {
  return {
    customHandler: ({ socketId, channelName }, callback) => {
      try {
        const data = channelName.startsWith('presence-') ? member(channelName) : undefined;
        callback(null, server.authorizeChannel(socketId, channelName, data));
      } catch (e) {
        callback(e, null);
      }
    },
  };
}

/** pusher-js `userAuthentication` that signs `userData` with the server SDK. */
export function userAuth(server, userData) {
  return {
    customHandler: ({ socketId }, callback) => {
      try {
        callback(null, server.authenticateUser(socketId, userData));
      } catch (e) {
        callback(e, null);
      }
    },
  };
}

/** Record every `event` an emitter (pusher-js channel or facade) emits. */
export function collect(emitter, event) {
  const got = [];
  emitter.bind(event, (data) => got.push(data));
  return got;
}
