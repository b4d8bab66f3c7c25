// Three herald nodes as one server, over a real redis-server and then a
// real nats-server (started here on free loopback ports): pusher-js clients
// spread over the nodes, the `pusher` SDK triggering and asking on each.
// Every event reaches every client exactly once (counted), presence is the
// cluster's, the HTTP API answers for the cluster from any node,
// subscription counts are cluster totals, cache channels share their last
// event, and a SIGKILLed node's members leave within the heartbeat TTL.
import { describe, test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startHerald, freePort, DEV_APP, once, connectionState } from '../lib/herald.mjs';
import { channelAuth, collect, userAuth } from '../lib/raw.mjs';
import { startServer } from '../lib/nodes.mjs';

const APP = { ...DEV_APP, subscription_count: true };
const TTL = 2;

/** A redis-server or nats-server on a free port, killed by `stop`. */
async function startBroker(kind) {
  const port = await freePort();
  const [cmd, args, url] =
    kind === 'redis'
      ? ['redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], `redis://127.0.0.1:${port}`]
      : ['nats-server', ['-a', '127.0.0.1', '-p', String(port)], `nats://127.0.0.1:${port}`];
  const child = await startServer(cmd, args, port);
  return { url, stop: () => child.kill('SIGKILL') };
}

/** Poll `f` until it returns true (or throw after `ms`, naming `what`). */
async function until(what, f, ms = 10000) {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await f()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

const ids = (members) => {
  const out = [];
  members.each((m) => out.push(m.id));
  return out.sort();
};

for (const kind of ['redis', 'nats']) {
  describe(`cluster of three over ${kind}`, () => {
    let broker;
    let nodes;
    const start = () =>
      startHerald({ 'broker.url': broker.url, 'broker.ttl': TTL, apps: [APP] });
    before(async () => {
      broker = await startBroker(kind);
      nodes = [];
      for (let i = 0; i < 3; i++) nodes.push(await start());
      // /ready is 200 once a node is connected and has heard the others.
      for (const h of nodes) {
        await until('/ready', async () => (await fetch(`${h.base}/ready`)).status === 200);
      }
    });
    after(async () => {
      for (const h of nodes) await h.stop();
      broker.stop();
    });
    const sdk = (i) => nodes[i].server(APP);

    test('every client gets every event exactly once, whichever node triggered it', async () => {
      const clients = [];
      const got = [];
      for (let i = 0; i < 6; i++) {
        const c = nodes[i % 3].client({}, APP);
        const ch = c.subscribe('news');
        await once(ch, 'pusher:subscription_succeeded');
        const seen = [];
        ch.bind('tick', (d) => seen.push(d.n));
        clients.push(c);
        got.push({ ch, seen });
      }
      const per = 10;
      for (let k = 0; k < per; k++) {
        for (let node = 0; node < 3; node++) await sdk(node).trigger('news', 'tick', { n: `${node}:${k}` });
      }
      const want = [];
      for (let node = 0; node < 3; node++) for (let k = 0; k < per; k++) want.push(`${node}:${k}`);
      for (const { seen } of got) await until('30 events', () => seen.length >= 3 * per);
      // A marker from each node afterwards: nothing else was on its way.
      for (let node = 0; node < 3; node++) {
        const markers = got.map(({ ch }) => once(ch, `marker${node}`));
        await sdk(node).trigger('news', `marker${node}`, {});
        await Promise.all(markers);
      }
      for (const { seen } of got) {
        assert.deepEqual([...seen].sort(), [...want].sort(), 'each event once');
        // One publisher's events in the order it sent them.
        for (let node = 0; node < 3; node++) {
          const mine = seen.filter((n) => n.startsWith(`${node}:`));
          assert.deepEqual(mine, want.filter((n) => n.startsWith(`${node}:`)));
        }
      }
      for (const c of clients) c.disconnect();
    });

    test('presence: one member list for the cluster, the same user on two nodes is one member', async () => {
      const as = (node, user_id, user_info) =>
        nodes[node].client({ channelAuthorization: channelAuth(sdk(node), () => ({ user_id, user_info })) }, APP);
      const alice = as(0, 'alice', { name: 'Alice' });
      const ca = alice.subscribe('presence-room');
      await once(ca, 'pusher:subscription_succeeded');
      const added = collect(ca, 'pusher:member_added');
      const removed = collect(ca, 'pusher:member_removed');

      const bob1 = as(1, 'bob', { name: 'Bob' });
      const firstAdd = once(ca, 'pusher:member_added');
      const m1 = await once(bob1.subscribe('presence-room'), 'pusher:subscription_succeeded');
      assert.deepEqual(ids(m1), ['alice', 'bob']);
      assert.deepEqual(m1.get('alice').info, { name: 'Alice' });
      assert.equal((await firstAdd).id, 'bob');

      // Bob again, on another node: no second member_added.
      const bob2 = as(2, 'bob', { name: 'Bob' });
      const m2 = await once(bob2.subscribe('presence-room'), 'pusher:subscription_succeeded');
      assert.deepEqual(ids(m2), ['alice', 'bob']);
      const carol = as(2, 'carol', {});
      const cc = carol.subscribe('presence-room');
      const m3 = await once(cc, 'pusher:subscription_succeeded');
      assert.deepEqual(ids(m3), ['alice', 'bob', 'carol']);
      await until('carol on alice', () => added.length === 2);
      assert.deepEqual(added.map((m) => m.id), ['bob', 'carol']);

      // The HTTP API's lists and counts agree on every node.
      for (let i = 0; i < 3; i++) {
        const { users } = await (await sdk(i).get({ path: '/channels/presence-room/users' })).json();
        assert.deepEqual(users.map((u) => u.id).sort(), ['alice', 'bob', 'carol'], `node ${i}`);
        const info = await (await sdk(i).get({ path: '/channels/presence-room', params: { info: 'user_count,subscription_count' } })).json();
        assert.deepEqual(info, { occupied: true, user_count: 3, subscription_count: 4 }, `node ${i}`);
      }

      // Bob's first socket leaving does not remove him; his last does, once.
      bob1.disconnect();
      await until('bob1 gone', async () => {
        const r = await sdk(0).get({ path: '/channels/presence-room', params: { info: 'subscription_count' } });
        return (await r.json()).subscription_count === 3;
      });
      const marker = once(ca, 'marker');
      await sdk(1).trigger('presence-room', 'marker', {});
      await marker;
      assert.equal(removed.length, 0);
      const gone = once(ca, 'pusher:member_removed');
      const goneForCarol = once(cc, 'pusher:member_removed');
      bob2.disconnect();
      assert.equal((await gone).id, 'bob');
      assert.deepEqual(ids(ca.members), ['alice', 'carol']);
      // Carol, on bob's last node, saw him leave as well.
      assert.equal((await goneForCarol).id, 'bob');
      assert.deepEqual(ids(cc.members), ['alice', 'carol']);
      alice.disconnect();
      carol.disconnect();
    });

    test('channel lists, subscription counts and terminate_connections from every node', async () => {
      const counted = [];
      for (let i = 0; i < 3; i++) {
        const c = nodes[i].client({}, APP);
        const ch = c.subscribe('counted');
        await once(ch, 'pusher:subscription_succeeded');
        counted.push({ c, ch });
      }
      // pusher:subscription_count carries the cluster's total everywhere.
      for (const { ch } of counted) await until('count 3', () => ch.subscriptionCount === 3);
      for (let i = 0; i < 3; i++) {
        const { channels } = await (await sdk(i).get({ path: '/channels', params: { filter_by_prefix: 'count' } })).json();
        assert.deepEqual(Object.keys(channels), ['counted'], `node ${i}`);
        const info = await (await sdk(i).get({ path: '/channels/counted', params: { info: 'subscription_count' } })).json();
        assert.equal(info.subscription_count, 3);
      }
      // A user signed in on nodes 0 and 1, terminated from node 2.
      const signedIn = async (node, id) => {
        const c = nodes[node].client({ userAuthentication: userAuth(sdk(node), { id }) }, APP);
        c.signin();
        await connectionState(c, 'connected');
        await c.user.signinDonePromise;
        return c;
      };
      const t0 = await signedIn(0, 'doomed');
      const t1 = await signedIn(1, 'doomed');
      const errors = [t0, t1].map(
        (c) => new Promise((resolve) => c.connection.bind('error', (e) => e.data?.code && resolve(e.data.code))),
      );
      assert.equal((await sdk(2).terminateUserConnections('doomed')).status, 200);
      assert.deepEqual(await Promise.all(errors), [4009, 4009]);
      // Server-to-user events cross nodes too.
      const keep = await signedIn(1, 'spared');
      const ping = once(keep.user, 'ping');
      await sdk(0).sendToUser('spared', 'ping', 'hi');
      assert.equal(await ping, 'hi');
      for (const { c } of counted) c.disconnect();
      keep.disconnect();
    });

    test("a cache channel's last event is replayed on another node", async () => {
      await sdk(0).trigger('cache-price', 'tick', { v: 7 });
      const c = nodes[2].client({}, APP);
      const ch = c.subscribe('cache-price');
      const misses = collect(ch, 'pusher:cache_miss');
      const tick = once(ch, 'tick');
      await once(ch, 'pusher:subscription_succeeded');
      assert.deepEqual(await tick, { v: 7 });
      assert.equal(misses.length, 0);
      c.disconnect();
    });

    test('a SIGKILLed node has its members removed everywhere within the TTL', async () => {
      const doomed = await start();
      await until('/ready', async () => (await fetch(`${doomed.base}/ready`)).status === 200);
      const auth = (h, user_id) => ({ channelAuthorization: channelAuth(h.server(APP), () => ({ user_id })) });
      const w = nodes[0].client(auth(nodes[0], 'watcher'), APP);
      const cw = w.subscribe('presence-kill');
      await once(cw, 'pusher:subscription_succeeded');
      const v = doomed.client(auth(doomed, 'victim'), APP);
      const added = once(cw, 'pusher:member_added');
      await once(v.subscribe('presence-kill'), 'pusher:subscription_succeeded');
      assert.equal((await added).id, 'victim');
      const removed = collect(cw, 'pusher:member_removed');
      const t0 = Date.now();
      doomed.child.kill('SIGKILL');
      await until('victim removed', () => removed.length > 0, 10000);
      const took = Date.now() - t0;
      assert.ok(took < TTL * 1000 + 1500, `removed after ${took} ms (TTL ${TTL} s)`);
      assert.equal(removed[0].id, 'victim');
      for (let i = 0; i < 3; i++) {
        const { users } = await (await sdk(i).get({ path: '/channels/presence-kill/users' })).json();
        assert.deepEqual(users.map((u) => u.id), ['watcher'], `node ${i}`);
      }
      const marker = once(cw, 'marker');
      await sdk(1).trigger('presence-kill', 'marker', {});
      await marker;
      assert.equal(removed.length, 1, 'member_removed once');
      v.disconnect();
      w.disconnect();
      await doomed.exited;
    });
  });
}
