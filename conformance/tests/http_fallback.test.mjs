// pusher-js's HTTP transports (xhr_streaming, xhr_polling) against herald:
// real pusher-js in Node restricted to each one, doing what it does over a
// WebSocket (public, private, presence, encrypted and cache channels, client
// events both ways, sign-in); the raw SockJS-style framing; and the bounds
// (unknown sessions, oversized bodies, floods, half-open sessions).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { startHerald, once, connectionState, within, http, DEV_APP } from '../lib/herald.mjs';
import { channelAuth, userAuth, metric } from '../lib/raw.mjs';
import Echo from 'laravel-echo';
import Pusher from 'pusher-js';

const encryptionMasterKeyBase64 = randomBytes(32).toString('base64');
let h;
before(async () => { h = await startHerald(); });
after(async () => { await h.stop(); });

const server = () => h.server(undefined, { encryptionMasterKeyBase64 });

/** A pusher-js client that may only use `transport`, on herald's HTTP port. */
function httpClient(transport, options = {}) {
  return h.client({
    enabledTransports: [transport],
    httpHost: '127.0.0.1',
    httpPort: h.port,
    channelAuthorization: channelAuth(server(), (ch) => ({ user_id: `u-${transport}`, user_info: { via: transport } })),
    ...options,
  });
}

async function connected(c, transport) {
  await connectionState(c, 'connected', 10000);
  assert.equal(c.connection.connection.transport.name, transport, 'connected over the HTTP transport');
}

for (const transport of ['xhr_streaming', 'xhr_polling']) {
  test(`${transport}: public channel, triggered events in order`, async () => {
    const c = httpClient(transport);
    await connected(c, transport);
    const ch = c.subscribe(`pub-${transport}`);
    await once(ch, 'pusher:subscription_succeeded');
    const got = [];
    ch.bind('e', (d) => got.push(d));
    const done = once(ch, 'done');
    for (let i = 0; i < 20; i++) await h.server().trigger(`pub-${transport}`, 'e', { i, text: 'ünï "quoted" \\ ✓' });
    await h.server().trigger(`pub-${transport}`, 'done', {});
    await done;
    assert.deepEqual(got.map((d) => d.i), [...Array(20).keys()]);
    assert.equal(got[0].text, 'ünï "quoted" \\ ✓');
    c.disconnect();
  });

  test(`${transport}: client events both ways with a WebSocket client, presence`, async () => {
    const c = httpClient(transport);
    const ws = h.client({ channelAuthorization: channelAuth(server(), () => ({ user_id: 'u-ws', user_info: {} })) });
    await connected(c, transport);
    const name = `private-ce-${transport}`;
    const [a, b] = [c.subscribe(name), ws.subscribe(name)];
    await Promise.all([once(a, 'pusher:subscription_succeeded'), once(b, 'pusher:subscription_succeeded')]);
    const atWs = once(b, 'client-hello');
    assert.ok(a.trigger('client-hello', { from: transport }));
    assert.deepEqual(await atWs, { from: transport });
    const atHttp = once(a, 'client-back');
    b.trigger('client-back', { from: 'ws' });
    assert.deepEqual(await atHttp, { from: 'ws' });

    const p = `presence-${transport}`;
    const pw = ws.subscribe(p);
    await once(pw, 'pusher:subscription_succeeded');
    const added = once(pw, 'pusher:member_added');
    const ph = c.subscribe(p);
    const members = await once(ph, 'pusher:subscription_succeeded');
    assert.equal(members.count, 2);
    assert.deepEqual(await added, { id: `u-${transport}`, info: { via: transport } });
    const removed = once(pw, 'pusher:member_removed');
    c.unsubscribe(p);
    assert.equal((await removed).id, `u-${transport}`);
    c.disconnect();
  });

  test(`${transport}: encrypted and cache channels, sign-in and sendToUser`, async () => {
    const c = httpClient(transport, { userAuthentication: userAuth(h.server(), { id: `user-${transport}` }) });
    await connected(c, transport);
    const enc = c.subscribe(`private-encrypted-${transport}`);
    await once(enc, 'pusher:subscription_succeeded');
    const secret = once(enc, 'reveal');
    await server().trigger(`private-encrypted-${transport}`, 'reveal', { answer: 42 });
    assert.deepEqual(await secret, { answer: 42 });

    await h.server().trigger(`cache-${transport}`, 'last', { kept: true });
    const cache = c.subscribe(`cache-${transport}`);
    const replayed = once(cache, 'last');
    await once(cache, 'pusher:subscription_succeeded');
    assert.deepEqual(await replayed, { kept: true });

    c.signin();
    await within(c.user.signinDonePromise, 'pusher-js sign-in');
    const notice = once(c.user, 'notice');
    await h.server().sendToUser(`user-${transport}`, 'notice', { text: 'hi' });
    assert.deepEqual(await notice, { text: 'hi' });
    c.disconnect();
  });
}

const base = (session) => `${h.base}/pusher/app/${DEV_APP.key}/123/${session}`;
const post = (url, body) => http(url, { method: 'POST', body, headers: { 'content-type': 'application/json' } });

test('the raw framing: o, then a[...] with connection_established, then replies to xhr_send', async () => {
  const s = base('raw' + Date.now());
  const first = await post(`${s}/xhr?protocol=7`);
  assert.equal(first.status, 200);
  assert.equal(first.headers.get('access-control-allow-origin'), '*');
  assert.equal(await first.text(), 'o\n');
  const second = await (await post(`${s}/xhr`)).text();
  assert.match(second, /^a\[.*\]\n$/);
  const established = JSON.parse(JSON.parse(second.slice(1))[0]);
  assert.equal(established.event, 'pusher:connection_established');
  assert.equal(JSON.parse(established.data).activity_timeout, 120);
  const sent = await post(`${s}/xhr_send`, JSON.stringify([JSON.stringify({ event: 'pusher:ping', data: {} })]));
  assert.equal(sent.status, 204);
  const pong = await (await post(`${s}/xhr`)).text();
  assert.equal(JSON.parse(JSON.parse(pong.slice(1))[0]).event, 'pusher:pong');
  // A preflight for browsers on other origins.
  const pre = await http(`${s}/xhr_send`, { method: 'OPTIONS' });
  assert.equal(pre.status, 204);
  assert.match(pre.headers.get('access-control-allow-headers'), /Content-Type/i);
});

test('refusals: unknown app (4001 in a c frame), unknown session, bad body, oversized body', async () => {
  const bad = await (await post(`${h.base}/pusher/app/nope/1/abc/xhr_streaming`)).text();
  assert.match(bad, /^o\na\[.*pusher:error.*\]\nc\[4001,"App key does not exist"\]\n$/s);
  const unknown = await post(`${base('never-opened')}/xhr_send`, '[]');
  assert.equal(unknown.status, 404);
  const s = base('limits' + Date.now());
  await post(`${s}/xhr`);
  assert.equal((await post(`${s}/xhr_send`, '{"not":"an array"}')).status, 400);
  const before = await metric(h, 'herald_pusher_http_refused_total');
  const big = JSON.stringify(['x'.repeat(200 * 1024)]);
  assert.equal((await post(`${s}/xhr_send`, big)).status, 413);
  assert.ok((await metric(h, 'herald_pusher_http_refused_total')) > before);
  assert.equal((await post(`${base('bad.session')}/xhr`)).status, 400);
});

test('an oversized message closes the session as on a WebSocket (1009 in a c frame)', async () => {
  const s = base('oversize' + Date.now());
  await post(`${s}/xhr`);
  await post(`${s}/xhr`); // connection_established
  const msg = JSON.stringify({ event: 'client-x', channel: 'private-a', data: 'y'.repeat(70 * 1024) });
  assert.equal((await post(`${s}/xhr_send`, JSON.stringify([msg]))).status, 204);
  const closed = await (await post(`${s}/xhr`)).text();
  assert.match(closed, /c\[1009,"Message too large/);
});

test('limits: a flood of xhr_send closes with 4100, half-open sessions are bounded and expire', async () => {
  const app = { ...DEV_APP, max_messages_per_second: 10 };
  const small = await startHerald({ apps: [app], http_max_sessions: 5, http_session_timeout_ms: 1000 });
  try {
    const at = (session) => `${small.base}/pusher/app/${DEV_APP.key}/7/${session}`;
    // A flood: more pings in a second than the app's message rate.
    const f = at('flood');
    await post(`${f}/xhr`);
    await post(`${f}/xhr`);
    await Promise.all(Array.from({ length: 60 }, () => post(`${f}/xhr_send`, '[]')));
    const closed = await (await post(`${f}/xhr`)).text();
    assert.match(closed, /c\[4100,"Too many messages/);
    // Half-open: sessions opened and never polled again.
    const opened = [];
    for (let i = 0; i < 5; i++) opened.push((await post(`${at('half' + i)}/xhr`)).status);
    assert.deepEqual(opened, [200, 200, 200, 200, 200]);
    const over = await post(`${at('one-too-many')}/xhr`);
    assert.equal(over.status, 503, 'the sixth session is refused');
    assert.match(await over.text(), /http_max_sessions/);
    assert.ok((await metric(small, 'herald_pusher_http_refused_total')) >= 1);
    // Nobody polls them: they expire, and a new session opens.
    await within(
      (async () => {
        while ((await metric(small, 'herald_pusher_http_sessions')) > 0) await new Promise((r) => setTimeout(r, 100));
      })(),
      'half-open sessions to expire',
      5000,
    );
    assert.ok((await metric(small, 'herald_pusher_http_sessions_expired_total')) >= 5);
    assert.equal(await (await post(`${at('after')}/xhr`)).text(), 'o\n');
  } finally {
    await small.stop();
  }
});

test('keep-alive: pusher-js stays connected across pings on both transports; a silent session is closed with 4201', async () => {
  const quick = await startHerald({ activity_timeout: 1, pong_timeout: 1 });
  try {
    const clients = ['xhr_streaming', 'xhr_polling'].map((transport) => {
      const c = quick.client({ enabledTransports: [transport], httpHost: '127.0.0.1', httpPort: quick.port });
      const changes = [];
      c.connection.bind('state_change', (s) => changes.push(s.current));
      return { c, transport, changes };
    });
    for (const { c, transport } of clients) {
      await connectionState(c, 'connected', 10000);
      assert.equal(c.connection.connection.transport.name, transport);
    }
    const ids = clients.map(({ c }) => c.connection.socket_id);
    // Four activity timeouts: herald pings, pusher-js answers over xhr_send.
    await new Promise((r) => setTimeout(r, 4000));
    assert.deepEqual(clients.map(({ c }) => c.connection.socket_id), ids, 'same sessions');
    for (const { changes } of clients) assert.deepEqual([...changes], ['connected'], 'no reconnect');
    const ch = clients[1].c.subscribe('still-alive');
    await once(ch, 'pusher:subscription_succeeded');
    for (const { c } of clients) c.disconnect();

    // A session that polls but never answers herald's pusher:ping.
    const s = `${quick.base}/pusher/app/${DEV_APP.key}/1/silent`;
    await post(`${s}/xhr`);
    let seen = '';
    await within(
      (async () => {
        while (!seen.includes('c[')) seen += await (await post(`${s}/xhr`)).text();
      })(),
      'the 4201 close',
      8000,
    );
    assert.match(seen, /pusher:ping/);
    assert.match(seen, /c\[4201,"Pong reply not received"\]/);
  } finally {
    await quick.stop();
  }
});

test('a streaming client that never reads is cut, bounded, and others are unharmed', async () => {
  const app = { ...DEV_APP, outbound_bytes: 65536 };
  const small = await startHerald({ apps: [app] });
  try {
    const net = await import('node:net');
    const path = `/pusher/app/${DEV_APP.key}/9/stuck/xhr_streaming`;
    const sock = net.connect(small.port, '127.0.0.1');
    await new Promise((r) => sock.once('connect', r));
    sock.write(`POST ${path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 0\r\n\r\n`);
    // Read the head and the first frames, then stop reading altogether.
    await new Promise((r) => sock.once('data', r));
    sock.pause();
    const sub = JSON.stringify([JSON.stringify({ event: 'pusher:subscribe', data: { channel: 'firehose' } })]);
    assert.equal((await post(`${small.base}/pusher/app/${DEV_APP.key}/9/stuck/xhr_send`, sub)).status, 204);
    const watcher = small.client();
    const wch = watcher.subscribe('firehose');
    await once(wch, 'pusher:subscription_succeeded');
    let last = null;
    wch.bind('e', (d) => (last = d.i));
    const data = 'x'.repeat(9000);
    await within(
      (async () => {
        for (let i = 0; ; i++) {
          await small.server().triggerBatch(Array.from({ length: 10 }, (_, j) => ({ channel: 'firehose', name: 'e', data: { i: i * 10 + j, data } })));
          const text = await (await http(`${small.base}/metrics`)).text();
          if (/herald_connections_closed_total\{[^}]*reason="(slow_consumer|write_error)"[^}]*\} [1-9]/.test(text)) return;
          // Or, once its stream had taken 256 KiB (pusher-js then opens a
          // new one) and none came, expired as an idle session.
          if (/herald_pusher_http_sessions_expired_total [1-9]/.test(text)) return;
          // Bounded by time (`within` below), not by a count: an expiry
          // takes the session timeout (15 s) however fast this loop runs.
          if (i % 50 === 49) await new Promise((r) => setTimeout(r, 100));
        }
      })(),
      'the stuck session to be cut',
      60000,
    );
    // The watcher on a WebSocket kept up all along.
    const marker = once(wch, 'marker');
    await small.server().trigger('firehose', 'marker', {});
    await marker;
    assert.ok(last !== null);
    sock.destroy();
  } finally {
    await small.stop();
  }
});

test('Laravel Echo over the fallback: as apps configure it, a private channel event', async () => {
  const echo = new Echo({
    broadcaster: 'pusher',
    Pusher,
    key: DEV_APP.key,
    cluster: 'herald',
    wsHost: '127.0.0.1',
    wsPort: h.port,
    httpHost: '127.0.0.1',
    httpPort: h.port,
    forceTLS: false,
    enabledTransports: ['xhr_streaming', 'xhr_polling'],
    disableStats: true,
    channelAuthorization: channelAuth(h.server()),
  });
  try {
    const got = new Promise((resolve) => echo.private('orders.7').listen('OrderShipped', resolve));
    await connectionState(echo.connector.pusher, 'connected', 10000);
    assert.equal(echo.connector.pusher.connection.connection.transport.name, 'xhr_streaming');
    await once(echo.connector.pusher.channel('private-orders.7'), 'pusher:subscription_succeeded');
    await h.server().trigger('private-orders.7', 'App\\Events\\OrderShipped', { id: 7 });
    assert.deepEqual(await within(got, 'the Echo listener'), { id: 7 });
  } finally {
    echo.disconnect();
  }
});

test('shutdown: a held stream is told 4200 in a c frame, and herald exits', async () => {
  const dying = await startHerald({ shutdown_grace: 3 });
  const s = `${dying.base}/pusher/app/${DEV_APP.key}/5/dying`;
  const res = await fetch(`${s}/xhr_streaming`, { method: 'POST' });
  const reader = res.body.getReader();
  let text = '';
  const until = async (re) => {
    while (!re.test(text)) {
      const { value, done } = await reader.read();
      if (done) break;
      text += new TextDecoder().decode(value);
    }
  };
  await within(until(/connection_established/), 'the stream to open');
  dying.child.kill('SIGTERM');
  await within(until(/c\[4200,/), 'the 4200 close on the stream', 10000);
  assert.match(text, /c\[4200,"Server is restarting; reconnect"\]/);
  await dying.exited;
});

test('a thousand and more half-open polling sessions: bounded, counted, expired, harmless to others', async () => {
  // Sessions outlive the opening of all 1,200 even on a busy machine.
  const many = await startHerald({ http_max_sessions: 1000, http_session_timeout_ms: 20000 });
  try {
    const statuses = { 200: 0, 503: 0 };
    let next = 0;
    await within(
      Promise.all(
        Array.from({ length: 50 }, async () => {
          while (next < 1200) {
            const i = next++;
            const r = await post(`${many.base}/pusher/app/${DEV_APP.key}/${i % 1000}/half${i}/xhr`);
            statuses[r.status] = (statuses[r.status] ?? 0) + 1;
            await r.text();
          }
        }),
      ),
      '1200 sessions to be opened or refused',
      60000,
    );
    assert.deepEqual(statuses, { 200: 1000, 503: 200 });
    assert.equal(await metric(many, 'herald_pusher_http_sessions'), 1000);
    assert.ok((await metric(many, 'herald_pusher_http_refused_total')) >= 200);
    // Others are unharmed: a WebSocket client connects and gets an event.
    const c = many.client();
    const ch = c.subscribe('unharmed');
    await once(ch, 'pusher:subscription_succeeded');
    const got = once(ch, 'e');
    await many.server().trigger('unharmed', 'e', { ok: true });
    assert.deepEqual(await got, { ok: true });
    // Nobody polls them again: all expire, their connections with them.
    await within(
      (async () => {
        while ((await metric(many, 'herald_pusher_http_sessions')) > 0) await new Promise((r) => setTimeout(r, 200));
        while ((await metric(many, 'herald_connections')) > 1) await new Promise((r) => setTimeout(r, 200));
      })(),
      'the half-open sessions and their connections to go',
      40000,
    );
    assert.equal(await metric(many, 'herald_pusher_http_sessions_expired_total'), 1000);
    c.disconnect();
  } finally {
    await many.stop();
  }
});

test('xhr_streaming: past 256 KiB pusher-js opens a new stream on the same session; nothing is lost', async () => {
  const c = httpClient('xhr_streaming');
  await connected(c, 'xhr_streaming');
  const id = c.connection.socket_id;
  const ch = c.subscribe('long-stream');
  await once(ch, 'pusher:subscription_succeeded');
  const got = [];
  ch.bind('e', (d) => got.push(d.i));
  const done = once(ch, 'done', 20000);
  const data = 'z'.repeat(9000);
  for (let i = 0; i < 80; i += 10) {
    await h.server().triggerBatch(Array.from({ length: 10 }, (_, j) => ({ channel: 'long-stream', name: 'e', data: { i: i + j, data } })));
  }
  await h.server().trigger('long-stream', 'done', {});
  await done;
  assert.deepEqual(got, [...Array(80).keys()], 'every event, in order, across the new streams');
  assert.equal(c.connection.socket_id, id, 'the same session');
  assert.ok((await metric(h, 'herald_pusher_http_sessions_opened_total')) >= 1);
  c.disconnect();
});
