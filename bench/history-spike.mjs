// The memory a burst of hostile history requests pins,
// and what comes back after. Node's standard library only (no packages).
//
// Against a running herald (one node, `[rpc] public_streams = true`):
// STREAMS reliable streams get MESSAGES messages of SIZE bytes each; then
// CLIENTS `actioncable-v1-ext-json` clients subscribe to every stream,
// stop reading their sockets and ask each stream's history. The server's
// resident memory (VmRSS of PID) is sampled throughout: the baseline
// before the clients, the peak, and what is left 10, 30 and 60 s after
// the last of them is gone (herald cuts them at its write deadline).
//
//   node bench/history-spike.mjs PORT PID [CLIENTS] [ROUNDS]
//
// Prints one JSON line per round.

import net from "node:net";
import crypto from "node:crypto";
import fs from "node:fs";

const [port, pid] = [Number(process.argv[2]), Number(process.argv[3])];
const CLIENTS = Number(process.argv[4] ?? 32);
const ROUNDS = Number(process.argv[5] ?? 1);
const STREAMS = 100, MESSAGES = 100, SIZE = 6000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const rssMiB = () =>
  Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, "utf8"))[1]) / 1024;
const ident = (s) => JSON.stringify({ channel: "$pubsub", stream_name: s });
const streams = Array.from({ length: STREAMS }, (_, i) => `spike${i}`);

// A client frame: masked text (RFC 6455 5.3).
function frame(text) {
  const data = Buffer.from(text);
  const len = data.length;
  const head = len < 126 ? Buffer.from([0x81, 0x80 | len])
    : len < 65536 ? Buffer.from([0x81, 0x80 | 126, len >> 8, len & 255])
    : (() => { const b = Buffer.alloc(10); b[0] = 0x81; b[1] = 0x80 | 127; b.writeBigUInt64BE(BigInt(len), 2); return b; })();
  const mask = crypto.randomBytes(4);
  const body = Buffer.from(data.map((b, i) => b ^ mask[i % 4]));
  return Buffer.concat([head, mask, body]);
}

// Open a socket, upgrade it, and resolve once `want` occurrences of
// `until` were read (the raw bytes are searched: enough for counting).
function open() {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, "127.0.0.1");
    let got = "";
    s.waiters = [];
    s.on("data", (d) => {
      got += d.toString("latin1");
      for (const w of [...s.waiters]) {
        const n = got.split(w.text).length - 1;
        if (n >= w.count) { s.waiters.splice(s.waiters.indexOf(w), 1); w.resolve(); }
      }
      if (got.length > 1 << 20) got = got.slice(-4096);
    });
    s.on("error", () => {});
    s.wait = (text, count) => new Promise((r) => s.waiters.push({ text, count, resolve: r }));
    s.once("connect", async () => {
      s.write(`GET /cable HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
        `Sec-WebSocket-Key: ${crypto.randomBytes(16).toString("base64")}\r\nSec-WebSocket-Version: 13\r\n` +
        `Sec-WebSocket-Protocol: actioncable-v1-ext-json\r\n\r\n`);
      await s.wait("welcome", 1);
      resolve(s);
    });
    s.once("close", () => reject(new Error("closed")));
  });
}

async function subscribeAll(s) {
  for (let half = 0; half < 2; half++) {
    if (half) await sleep(1100);
    for (const st of streams.slice(half * STREAMS / 2, (half + 1) * STREAMS / 2))
      s.write(frame(JSON.stringify({ command: "subscribe", identifier: ident(st) })));
  }
  await s.wait("confirm_subscription", STREAMS);
}

async function connections() {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  return text.split("\n").filter((l) => l.startsWith("herald_connections{") || l.startsWith("herald_connections "))
    .reduce((a, l) => a + Number(l.split(" ").pop()), 0);
}

// The streams become reliable (a follower), then get their messages.
const follower = await open();
await subscribeAll(follower);
follower.destroy();
const pad = "x".repeat(SIZE - 20);
for (const st of streams) {
  for (let first = 0; first < MESSAGES; first += 100) {
    const batch = [];
    for (let n = first; n < Math.min(first + 100, MESSAGES); n++) batch.push({ stream: st, data: JSON.stringify({ n, pad }) });
    const r = await fetch(`http://127.0.0.1:${port}/_broadcast`, { method: "POST", body: JSON.stringify(batch) });
    if (r.status !== 201) throw new Error(`broadcast: ${r.status} ${await r.text()}`);
  }
}

for (let round = 1; round <= ROUNDS; round++) {
  await sleep(2000);
  const baseline = rssMiB();
  let peak = baseline;
  const sampler = setInterval(() => { peak = Math.max(peak, rssMiB()); }, 100);
  // All clients at once; each keeps under the default 100 messages a
  // second (`max_messages_per_second`, `rpc.history_rate`).
  const clients = await Promise.all(Array.from({ length: CLIENTS }, async () => {
    const s = await open();
    await subscribeAll(s);
    s.pause(); // stops reading: the kernel's buffers fill, then the window closes
    for (let half = 0; half < 2; half++) {
      await sleep(1100);
      for (const st of streams.slice(half * STREAMS / 2, (half + 1) * STREAMS / 2))
        s.write(frame(JSON.stringify({ command: "history", identifier: ident(st), history: { since: 1 } })));
    }
    return s;
  }));
  const t0 = Date.now();
  while ((await connections()) > 0 && Date.now() - t0 < 120_000) await sleep(200);
  const gone = (Date.now() - t0) / 1000;
  clients.forEach((s) => s.destroy());
  const after = {};
  const t1 = Date.now();
  for (const at of [0, 10, 30, 60]) {
    while (Date.now() - t1 < at * 1000) await sleep(100);
    after[`${at}s`] = Math.round(rssMiB() * 10) / 10;
  }
  clearInterval(sampler);
  const r = (x) => Math.round(x * 10) / 10;
  console.log(JSON.stringify({ round, clients: CLIENTS, baseline_mib: r(baseline), peak_mib: r(peak), cut_after_s: gone, rss_after_gone_mib: after }));
}
process.exit(0);
