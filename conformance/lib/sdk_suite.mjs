// The checks every official server SDK of another language passes against a
// real herald (tests/sdk_*.test.mjs): trigger, batch trigger, channel info,
// channel lists and presence users, private and presence authorization
// signed by the SDK and used by pusher-js, user termination where the SDK
// has it, and webhooks checked by the SDK's own validator.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startHerald, freePort, once, connectionState, waitFor, within } from './herald.mjs';
import { startSdk, sdkChannelAuth, sdkUserAuth, SDK_APP } from './sdk.mjs';

/**
 * Define the tests for the SDK program `name`. `features.userAuth`: the SDK
 * signs user sign-ins (`user_auth` op); `features.terminate`: it can also
 * terminate a user's connections; `features.client`: the program also has
 * the language's client library (`client_subscribe` op, `client_event` notes).
 */
export function sdkSuite(name, features = {}) {
  let h;
  let sdk;

  before(async () => {
    const webhookPort = await freePort();
    h = await startHerald({
      webhook_batch_ms: 50,
      webhook_leave_delay_ms: 0,
      apps: [
        {
          ...SDK_APP,
          webhooks: [
            {
              url: `http://127.0.0.1:${webhookPort}/pusher/webhooks`,
              event_types: ['channel_occupied', 'channel_vacated', 'member_added', 'member_removed'],
            },
          ],
        },
      ],
    });
    sdk = await startSdk(name, { port: h.port, webhookPort });
  });
  after(async () => {
    // herald first: its last webhooks (the shutdown's vacated channels) still
    // find the receiver, instead of being retried to the end of its grace.
    await h?.stop();
    await sdk?.stop();
  });

  const client = (options = {}) => h.client(options, SDK_APP);
  const subscribed = async (c, channel) => {
    const ch = c.subscribe(channel);
    await once(ch, 'pusher:subscription_succeeded');
    return ch;
  };

  test(`${name}: trigger reaches pusher-js subscribers of each channel named`, async () => {
    const c = client();
    const [a, b] = await Promise.all([subscribed(c, 'sdk-a'), subscribed(c, 'sdk-b')]);
    const got = [once(a, 'greet'), once(b, 'greet')];
    await sdk.call('trigger', { channels: ['sdk-a', 'sdk-b'], event: 'greet', data: { n: 1, text: 'héllo' } });
    assert.deepEqual(await Promise.all(got), [{ n: 1, text: 'héllo' }, { n: 1, text: 'héllo' }]);
  });

  test(`${name}: a batch trigger delivers each event to its own channel`, async () => {
    const c = client();
    const [a, b] = await Promise.all([subscribed(c, 'batch-a'), subscribed(c, 'batch-b')]);
    const got = [once(a, 'first'), once(b, 'second')];
    await sdk.call('trigger_batch', {
      batch: [
        { channel: 'batch-a', name: 'first', data: { to: 'a' } },
        { channel: 'batch-b', name: 'second', data: { to: 'b' } },
      ],
    });
    assert.deepEqual(await Promise.all(got), [{ to: 'a' }, { to: 'b' }]);
  });

  test(`${name}: a private channel authorized by the SDK`, async () => {
    const c = client({ channelAuthorization: sdkChannelAuth(sdk) });
    const ch = await subscribed(c, 'private-sdk');
    const got = once(ch, 'secret');
    await sdk.call('trigger', { channels: ['private-sdk'], event: 'secret', data: { ok: true } });
    assert.deepEqual(await got, { ok: true });
  });

  test(`${name}: presence authorized by the SDK; channel info, channel list and users read with it`, async () => {
    const member = (id) => () => ({ user_id: id, user_info: { name: `User ${id}` } });
    const u1 = client({ channelAuthorization: sdkChannelAuth(sdk, member('u1')) });
    const u2 = client({ channelAuthorization: sdkChannelAuth(sdk, member('u2')) });
    await subscribed(u1, 'presence-sdk');
    const ch2 = await subscribed(u2, 'presence-sdk');
    assert.deepEqual(ch2.members.get('u1')?.info, { name: 'User u1' }, 'user_info signed by the SDK');

    const info = await sdk.call('channel', { channel: 'presence-sdk', info: 'user_count' });
    assert.equal(info.occupied, true);
    assert.equal(info.user_count, 2);
    const vacant = await sdk.call('channel', { channel: 'presence-nobody', info: 'user_count' });
    assert.equal(vacant.occupied, false);

    const { channels } = await sdk.call('channels', { prefix: 'presence-' });
    assert.deepEqual(channels, ['presence-sdk']);

    const { ids } = await sdk.call('users', { channel: 'presence-sdk' });
    assert.deepEqual(ids.sort(), ['u1', 'u2']);
  });

  if (features.userAuth) {
    test(`${name}: a user sign-in signed by the SDK${features.terminate ? '; terminate_user_connections closes its socket' : ''}`, async () => {
      const c = client({ userAuthentication: sdkUserAuth(sdk, { id: 'doomed', user_info: { name: 'D' } }) });
      c.signin();
      await connectionState(c, 'connected');
      await within(c.user.signinDonePromise, 'pusher-js sign-in signed by the SDK');
      assert.equal(c.user.user_data?.id, 'doomed');
      if (!features.terminate) return;
      const closed = waitFor('pusher-js to report the 4009 error', (resolve) =>
        c.connection.bind('error', (e) => e.data?.code && resolve(e.data.code)),
      );
      await sdk.call('terminate', { user_id: 'doomed' });
      assert.equal(await closed, 4009);
    });
  }

  if (features.client) {
    test(`${name}: the client library receives an event triggered through the API`, async () => {
      await sdk.call('client_subscribe', { channel: 'java-public' }, 15_000);
      await sdk.call('trigger', { channels: ['java-public'], event: 'news', data: { n: 7 } });
      const { client_event } = await sdk.note((n) => n.client_event?.channel === 'java-public', 'the client event');
      assert.equal(client_event.event, 'news');
      assert.deepEqual(JSON.parse(client_event.data), { n: 7 });
    });

    test(`${name}: the client library on a private channel authorized by the server SDK`, async () => {
      await sdk.call('client_subscribe', { channel: 'private-java' }, 15_000);
      await sdk.call('trigger', { channels: ['private-java'], event: 'secret', data: { s: 'x' } });
      const { client_event } = await sdk.note((n) => n.client_event?.channel === 'private-java', 'the client event');
      assert.deepEqual(JSON.parse(client_event.data), { s: 'x' });
    });
  }

  test(`${name}: webhooks pass the SDK's own validator, and a tampered body does not`, async () => {
    const c = client({
      channelAuthorization: sdkChannelAuth(sdk, () => ({ user_id: 'hooked', user_info: {} })),
    });
    await subscribed(c, 'presence-hooks');
    const hasEvent = (n, pred) => n.webhook?.events?.some(pred);
    await sdk.note((n) => hasEvent(n, (e) => e.name === 'channel_occupied' && e.channel === 'presence-hooks'), 'channel_occupied');
    await sdk.note(
      (n) => hasEvent(n, (e) => e.name === 'member_added' && e.channel === 'presence-hooks' && e.user_id === 'hooked'),
      'member_added',
    );
    c.disconnect();
    await sdk.note((n) => hasEvent(n, (e) => e.name === 'channel_vacated' && e.channel === 'presence-hooks'), 'channel_vacated');
    const hooks = sdk.notes.filter((n) => n.webhook);
    for (const { webhook } of hooks) {
      assert.equal(webhook.valid, true, `the SDK accepts ${JSON.stringify(webhook)}`);
      assert.equal(webhook.tampered_valid, false, 'the SDK refuses the same webhook with its body changed');
    }
  });
}
