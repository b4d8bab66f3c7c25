// Allowed origins with the real client libraries: pusher-js (its Node
// WebSocket, faye-websocket, sending the Origin a browser page would) and
// @rails/actioncable (over `ws`, with an Origin). A listed page connects;
// a page elsewhere is refused: pusher-js hears Reverb's 4009 error and
// does not reconnect, the Action Cable consumer never gets its welcome.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Pusher from 'pusher-js';
import WebSocket from 'ws';
import { startHerald, waitFor, connectionState, http } from '../lib/herald.mjs';
import { ActionCable, until } from '../lib/cable.mjs';

const APP = {
  id: 'origins',
  key: 'origins-key',
  secret: 'origins-secret',
  allowed_origins: ['app.example.com', '*.example.org'],
};

// pusher-js opens its Node sockets with faye-websocket's Client(url): give
// it the Origin header the page under test has.
let pageOrigin = null;
const Faye = Pusher.Runtime.getWebSocketAPI();
Pusher.Runtime.getWebSocketAPI = () =>
  class extends Faye {
    constructor(url) {
      super(url, [], pageOrigin ? { headers: { Origin: pageOrigin } } : {});
    }
  };

let h;
before(async () => {
  h = await startHerald({ apps: [APP] });
});
after(async () => {
  await h?.stop();
});

test('pusher-js from a listed page connects and receives', async () => {
  pageOrigin = 'https://shop.example.org';
  const c = h.client({}, APP);
  await connectionState(c, 'connected');
  const ch = c.subscribe('news');
  await waitFor('subscription_succeeded', (ok) => ch.bind('pusher:subscription_succeeded', ok));
  const got = waitFor('the event', (ok) => ch.bind('hello', ok));
  await h.server(APP).trigger('news', 'hello', { n: 1 });
  assert.deepEqual(await got, { n: 1 });
  c.disconnect();
});

test('pusher-js from another page gets 4009 "Origin not allowed" and gives up', async () => {
  for (const origin of ['https://evil.net', 'https://shop.example.org.evil.net', 'null']) {
    pageOrigin = origin;
    const c = h.client({}, APP);
    const error = await waitFor(`the error for ${origin}`, (ok) =>
      c.connection.bind('error', (e) => e.error?.data?.code && ok(e.error.data)),
    );
    assert.equal(error.code, 4009, origin);
    assert.equal(error.message, 'Origin not allowed', origin);
    // 4000-4099: pusher-js does not reconnect unchanged.
    await connectionState(c, 'disconnected');
    c.disconnect();
  }
  assert.ok((await refused('pusher')) >= 3);
});

/** `herald_origins_refused_total` of `protocol`. */
async function refused(protocol) {
  const metrics = await (await http(`${h.base}/metrics`)).text();
  const line = metrics
    .split('\n')
    .find((l) => l.startsWith('herald_origins_refused_total') && l.includes(`protocol="${protocol}"`));
  return line ? Number(line.split(' ').pop()) : 0;
}

/** An @rails/actioncable consumer whose sockets carry `origin`. */
function cableFrom(origin) {
  const Base = ActionCable.adapters.WebSocket;
  ActionCable.adapters.WebSocket = class extends WebSocket {
    constructor(url, protocols) {
      super(url, protocols, { origin });
    }
  };
  const consumer = ActionCable.createConsumer(`ws://127.0.0.1:${h.port}/cable`);
  consumer.connect();
  ActionCable.adapters.WebSocket = Base;
  return consumer;
}

test('@rails/actioncable from a listed page is welcomed', async () => {
  const consumer = cableFrom('https://app.example.com');
  await until(() => consumer.connection.isOpen(), 'the welcome');
  consumer.disconnect();
});

test('@rails/actioncable from another page is refused at the upgrade (403)', async () => {
  const status = await new Promise((resolve) => {
    const ws = new WebSocket(`ws://127.0.0.1:${h.port}/cable`, ['actioncable-v1-json'], {
      origin: 'https://app.example.com.evil.net',
    });
    ws.on('unexpected-response', (_, res) => resolve(res.statusCode));
    ws.on('open', () => resolve('open'));
    ws.on('error', () => {});
  });
  assert.equal(status, 403);
  const before = await refused('actioncable');
  const consumer = cableFrom('https://evil.net');
  await until(async () => (await refused('actioncable')) > before, "the consumer's refusal");
  assert.equal(consumer.connection.isOpen(), false, 'never welcomed');
  consumer.disconnect();
});
